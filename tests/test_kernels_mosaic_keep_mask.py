"""`kernels/mosaic/keep_mask.py`: the uint8 keep decisions the persistent kernels read. On a
CPU: the values equal the f32 mask the other implementations build (``decision / keep``),
bit for bit; one-line refusals of a plan or operand that cannot carry them. `TestCompiled`:
a one-block Mosaic GPU kernel that TMA-loads a uint8 tile, turns it into values with
`load_values` and multiplies an f32 tile by them, against `mask_values`: compiled on a GPU,
executed in GPU interpret mode (`TestInterpret`, jax >= 0.11.2, race detector on), and
lowered and compiled for an H100 without a GPU (``gpu_compile``)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_cases import MosaicGpuMode, compile_deviceless, needs_cuda
from rhhjax.kernels.mosaic import keep_mask
from rhhjax.kernels.mosaic.plan import PersistentPlan, PlanError

from rhhjax.ops import loops


@pytest.mark.parametrize("keep", [0.75, 0.7, 0.65, 0.3, 1.0])
def test_values_equal_the_f32_mask_of_the_other_implementations_bit_for_bit(keep):
    decisions = jax.random.bernoulli(jax.random.key(int(keep * 100)), keep, (64, 48))
    want = loops.dropout_mask(keep, decisions, jnp.float32)
    got = keep_mask.mask_values(keep_mask.decisions(decisions), keep)
    assert got.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert set(np.unique(np.asarray(got)).tolist()) <= {
        0.0,
        float(np.float32(1) / np.float32(keep)),
    }


def test_decisions_are_uint8_and_none_stays_none():
    assert keep_mask.decisions(None) is None and keep_mask.mask_values(None, 0.5) is None
    out = keep_mask.decisions(jnp.array([True, False, True]))
    assert out.dtype == jnp.uint8 and out.tolist() == [1, 0, 1]


@pytest.mark.parametrize("keep", [0.0, -0.5, 1.5])
def test_a_keep_outside_zero_one_is_refused(keep):
    with pytest.raises(ValueError, match="keep must be in"):
        keep_mask.mask_scale(keep)


def test_plans_of_rows_shorter_than_16_bytes_are_one_line_errors():
    keep_mask.check_plan(PersistentPlan(64, 64, "float32", col_blocks=4), "forward")  # u 16
    with pytest.raises(PlanError, match="multiple of 16 .uint8 TMA rows., got 8") as e:
        keep_mask.check_plan(PersistentPlan(64, 64, "float32", col_blocks=8), "backward")
    assert "\n" not in str(e.value) and "persistent backward" in str(e.value)


def test_an_f32_mask_operand_is_a_one_line_error_naming_the_uint8_it_needs():
    keep_mask.check_operand(None, (2, 64, 64), "forward")
    keep_mask.check_operand(jnp.zeros((2, 64, 64), jnp.uint8), (2, 64, 64), "forward")
    for bad in (jnp.zeros((2, 64, 64), jnp.float32), jnp.zeros((2, 64, 32), jnp.uint8)):
        with pytest.raises(PlanError, match="expected uint8\\[2, 64, 64\\]") as e:
            keep_mask.check_operand(bad, (2, 64, 64), "forward")
        assert "\n" not in str(e.value)


def _masked_product(rows: int, units: int, keep: float, interpret):
    """A one-block kernel: x [R, U] f32 times the values of the uint8 decisions [R, U], both
    TMA-loaded from the middle of [2R, 2U] arrays."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def kernel(m_g, x_g, out_g, m_s, x_s, bar):
        window = (pl.ds(rows // 2, rows), pl.ds(units // 2, units))
        plgpu.copy_gmem_to_smem(m_g.at[window], m_s, bar.at[0])
        plgpu.copy_gmem_to_smem(x_g.at[window], x_s, bar.at[1])
        plgpu.barrier_wait(bar.at[0])
        plgpu.barrier_wait(bar.at[1])
        y = x_s[...] * keep_mask.load_values(m_s, keep)
        plgpu.commit_smem()
        x_s[...] = y
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(x_s, out_g)
        plgpu.wait_smem_to_gmem(0)

    return plgpu.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct((rows, units), jnp.float32),
        scratch_types=dict(
            m_s=plgpu.SMEM((rows, units), keep_mask.DTYPE),
            x_s=plgpu.SMEM((rows, units), jnp.float32),
            bar=plgpu.Barrier(num_barriers=2),
        ),
        interpret=interpret,
    )


class TestCompiled(MosaicGpuMode):
    """`load_values` inside a kernel against `mask_values`, on fresh random decisions."""

    CASES = {"shape": [(64, 64), (64, 16), (128, 32)], "keep": [0.75, 0.3]}

    def test_load_values_match_mask_values(self, shape, keep):
        rows, units = shape
        km, kx = jax.random.split(jax.random.key(rows + units))
        decisions = jax.random.bernoulli(km, keep, (2 * rows, 2 * units)).astype(jnp.uint8)
        x = jax.random.normal(kx, (2 * rows, 2 * units), jnp.float32)
        got = jax.jit(_masked_product(rows, units, keep, self.interpret()))(decisions, x)
        window = (slice(rows // 2, rows // 2 + rows), slice(units // 2, units // 2 + units))
        want = x[window] * keep_mask.mask_values(decisions[window], keep)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


class TestInterpret(TestCompiled):
    INTERPRET = True


_COMPILE = """
from rhhjax.kernels.mosaic import keep_mask
import test_kernels_mosaic_keep_mask as t
for rows, units in ((64, 64), (64, 16)):
    kernel = t._masked_product(rows, units, 0.75, None)
    lower_and_compile(kernel, sds((2 * rows, 2 * units), jnp.uint8), sds((2 * rows, 2 * units)))
print(json.dumps("compiled"))
"""


@pytest.mark.gpu_compile
@needs_cuda
def test_the_uint8_tile_load_lowers_and_compiles_for_an_h100_without_a_gpu(tmp_path):
    import pathlib

    code = f"import sys; sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r})\n" + _COMPILE
    result, reports = compile_deviceless(code, tmp_path, log_ptxas=False)
    assert result == "compiled" and len(reports) == 2
