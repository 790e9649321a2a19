"""The Mosaic GPU micro-layer backward (`kernels/mosaic/backward.py`).

On a CPU: its reference against `rhhjax.ops.fused`'s micro-layer backward (the state-gradient
matmul of the layer above plus `cells.gate_backward`), and its one-line config errors.
``gpu_compile``: the kernel lowers and compiles for an H100 without a GPU (needs the JAX
CUDA plugin; skipped without it). `TestCompiled`: the kernel against its reference, on a GPU
only; `TestInterpret`: the same tests with the kernel executed in GPU interpret mode on a CPU,
race detector on (jax >= 0.11.2), and a kernel without `commit_smem` reported as a race."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu
from kernel_cases import MosaicGpuMode, assert_race_reported, compile_deviceless, needs_cuda
from rhhjax.kernels.mosaic import backward as mb

from rhhjax.ops import fused, spec

KEEP = 0.7


def _case(seed, batch, n, dtype, z_on=True, mask_on=True):
    """Fresh kernel operands (d_above, w_above, ds_carry, g_out, s_prev, h, t, z, mask) and
    the bool keep decisions behind the mask."""
    rng = np.random.default_rng(seed)

    def normal(*shape, scale=1.0):
        return jnp.asarray(rng.normal(size=shape) * scale, jnp.float32)

    d_above = normal(batch, 2 * n, scale=0.3).astype(dtype)
    w_above = normal(n, 2 * n, scale=0.2).astype(dtype)
    h = jnp.tanh(normal(batch, n))
    t = jax.nn.sigmoid(normal(batch, n))
    keep = jnp.asarray(rng.random((batch, n)) < KEEP)
    z = 1.0 + normal(batch, n, scale=0.3) if z_on else None
    mask = keep.astype(jnp.float32) / KEEP if mask_on else None
    args = (d_above, w_above, normal(batch, n), normal(batch, n), normal(batch, n), h, t, z, mask)
    return args, (keep if mask_on else None)


@pytest.mark.pure_jax
@pytest.mark.parametrize(
    ("dtype", "z_on", "mask_on"),
    [("float32", True, True), ("bfloat16", True, True), ("float32", False, False),
     ("bfloat16", False, True)],
)  # fmt: skip
def test_reference_is_the_fused_micro_layer_backward(dtype, z_on, mask_on):
    """(d_scaled, ds_carry, da) equal `fused._layer_backward` fed W^T of the layer above."""
    dtype = jnp.dtype(dtype)
    args, keep = _case(3, 64, 48, dtype, z_on, mask_on)
    d_above, w_above, ds_carry, g_out, s_prev, h, t, z, _ = args
    d_scaled, ds_carry_new, da = mb.highway_backward_reference(*args)
    sequence = spec.SequenceSpec("fused", KEEP, dtype)
    above = (d_above, w_above.T, None, ds_carry)
    want = fused._layer_backward(sequence, above, g_out, s_prev, {"h": h, "t": t}, z, keep)
    assert d_scaled.dtype == dtype and d_scaled.shape == (64, 2, 48)
    np.testing.assert_array_equal(
        np.asarray(d_scaled.reshape(64, 96), np.float32), np.asarray(want[0], np.float32)
    )
    np.testing.assert_allclose(ds_carry_new, want[1], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(da, want[2], rtol=1e-6, atol=1e-6)
    # The check can fail: another mask gives another da.
    if mask_on:
        other = mb.highway_backward_reference(*args[:-1], jnp.ones_like(args[-1]))
        assert not np.allclose(other[2], da)


@pytest.mark.parametrize(
    ("config", "shape", "message"),
    [
        (mb.MosaicBackwardConfig(tile_m=32), (64, 64), "tile_m % 64"),
        (mb.MosaicBackwardConfig(), (100, 64), "b_pad 100"),
        (mb.MosaicBackwardConfig(units=16), (64, 40), "n_pad 40"),
        (mb.MosaicBackwardConfig(units=8, tile_k=64), (64, 40), "2 \\* n_pad 80"),
    ],
)
def test_misaligned_shapes_are_one_line_errors(config, shape, message):
    with pytest.raises(ValueError, match=message) as e:
        config.check(*shape)
    assert "\n" not in str(e.value)


_COMPILE = """
from rhhjax.kernels.mosaic import backward as mb
rows = []
for b, n, dtype, z_on, mask_on in {cases!r}:
    mm = jnp.dtype(dtype)
    rows_f32 = [sds((b, n))] * 5
    args = (sds((b, 2 * n), mm), sds((n, 2 * n), mm), *rows_f32,
            sds((b, n)) if z_on else None, sds((b, n)) if mask_on else None)
    text = lower_and_compile(mb.highway_backward, *args)
    rows.append({{"mosaic": "mosaic_gpu" in text, "compiled": True}})
print(json.dumps(rows))
"""


@pytest.mark.gpu_compile
@needs_cuda
def test_kernel_lowers_and_compiles_for_an_h100_without_a_gpu(tmp_path):
    """The paper's main cell (batch 256, 1024 padded units: 64 x 4 programs, K 2048), bf16
    and f32, and a small case without z and mask, deviceless, in a fresh process."""
    cases = [(256, 1024, "bfloat16", True, True), (256, 1024, "float32", True, True),
             (64, 64, "bfloat16", False, False)]  # fmt: skip
    code = _COMPILE.format(cases=cases)
    rows, _ = compile_deviceless(code, tmp_path)
    assert rows == [{"mosaic": True, "compiled": True}] * len(cases)


class TestCompiled(MosaicGpuMode):
    """The kernel against its reference on fresh random inputs: compiled (a GPU only), and
    in `TestInterpret` executed in GPU interpret mode, race detector on (jax >= 0.11.2).
    f32 operands run as TF32 in wgmma on a GPU: the compiled f32 tolerance is TF32's."""

    CASES = {
        # (batch, n, z_on, mask_on, tile_k): grids of (batch / 64) x (n / 16); K = 2n
        "shape": [(64, 64, True, True, 64), (128, 80, False, True, 32),
                  (256, 1024, True, False, 64)],
    }  # fmt: skip
    TOL = {"bfloat16": 2e-2, "float32": 3e-3}  # d_scaled is stored in bf16

    @pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
    def test_matches_reference(self, dtype, shape):
        batch, n, z_on, mask_on, tile_k = shape
        config = mb.MosaicBackwardConfig(tile_k=tile_k)
        config.check(batch, n)  # the case itself is one the kernel accepts
        args, _ = _case(batch + n, batch, n, jnp.dtype(dtype), z_on, mask_on)
        kernel = functools.partial(mb.highway_backward, config=config, interpret=self.interpret())
        actual = jax.jit(kernel)(*args)
        expected = mb.highway_backward_reference(*args)
        tol = self.TOL[dtype]
        for a, e in zip(actual, expected, strict=True):
            a, e = np.asarray(a, np.float32), np.asarray(e, np.float32)
            np.testing.assert_allclose(a, e, rtol=tol, atol=tol * float(np.abs(e).max()))


class TestInterpret(TestCompiled):
    INTERPRET = True
    CASES = {"shape": TestCompiled.CASES["shape"][:2]}
    TOL = {"bfloat16": 2e-2, "float32": 2e-5}

    def test_the_race_detector_reports_a_missing_commit_smem(self, monkeypatch, capsys):
        """The check can fail: without `commit_smem` the TMA stores read shared memory
        that the epilogue's plain stores are not ordered before."""
        args, _ = _case(5, 64, 64, jnp.bfloat16)

        def run():  # a new function each time: traced again, after the patch too
            kernel = functools.partial(mb.highway_backward, interpret=self.interpret())
            return jax.block_until_ready(jax.jit(kernel)(*args))

        run()  # as it is: no race
        monkeypatch.setattr(plgpu, "commit_smem", lambda: None)
        assert_race_reported(run, capsys, monkeypatch)
