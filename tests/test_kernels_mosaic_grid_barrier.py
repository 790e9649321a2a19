"""The grid barrier of the persistent kernels (`kernels/mosaic/grid_barrier.py`).

On a CPU: `check_status` passes an all-zero status and raises ONE line naming the phase
otherwise. ``gpu_compile``: a 132-block kernel of 700 phases whose every phase reads a
slice another block wrote in the phase before lowers and compiles for an H100 without a GPU
(CUDA plugin). `TestOnAGpu`: the same kernel against its NumPy result, twice in one process
(the counter's low bits end at zero); `TestSpinOnAGpu`: a grid that cannot be co-resident gives
up with the one-line error instead of hanging (both on a GPU only). `TestInterpret`: the
kernel in GPU interpret mode with the cluster barrier in place of the semaphore barrier
(clusters of 2 and 16 blocks; jax >= 0.11.2), and without that barrier reported as a race.
"""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_cases import MosaicGpuMode, assert_race_reported, compile_deviceless, needs_cuda
from rhhjax.kernels.mosaic import grid_barrier
from rhhjax.kernels.mosaic import interpret as gpu_interpret

ROWS, UNITS = 64, 8


def neighbour_kernel(
    blocks: int,
    phases: int,
    spin_limit: int = grid_barrier.DEFAULT_SPIN_LIMIT,
    interpret=None,
):
    """A persistent kernel: x [P + 1, ROWS, blocks * UNITS] f32 whose row 0 is the input;
    in phase p block g writes ``x[p + 1, :, g] = x[p, :, g] + x[p, :, g + 1 (mod blocks)] + 1``
    (its slice and its right neighbour's, written by another block in phase p - 1). Compiled:
    a grid with the semaphore barrier; with ``interpret``: one cluster with the cluster barrier
    (`grid_barrier.launch`). Returns a function of x0 [ROWS, blocks * UNITS] -> (x [P + 1,
    ...], status [blocks]: 1 where the block's barrier timed out)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def kernel(x0_ref, x_ref, status_ref, mine, right, bar, phase_bar=None):
        (g,) = grid_barrier.block_index((blocks,), ("g",), phase_bar)
        barrier = grid_barrier.make_barrier(blocks, g == 0, spin_limit, phase_bar)
        cols = pl.ds(g * UNITS, UNITS)
        plgpu.copy_gmem_to_smem(x0_ref.at[:, cols], mine, bar.at[0])
        plgpu.barrier_wait(bar.at[0])
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(mine, x_ref.at[0, :, cols])
        plgpu.wait_smem_to_gmem(0)
        failed = jnp.logical_not(barrier(jnp.int32(0)))

        def phase(p, failed):
            def work():
                right_cols = pl.ds(jax.lax.rem(g + 1, blocks) * UNITS, UNITS)
                plgpu.copy_gmem_to_smem(x_ref.at[p, :, cols], mine, bar.at[0])
                plgpu.copy_gmem_to_smem(x_ref.at[p, :, right_cols], right, bar.at[1])
                plgpu.barrier_wait(bar.at[0])
                plgpu.barrier_wait(bar.at[1])
                mine[...] = mine[...] + right[...] + 1.0
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(mine, x_ref.at[p + 1, :, cols])
                plgpu.wait_smem_to_gmem(0)
                return jnp.logical_not(barrier(p + 1))

            # A block that gave up neither works nor arrives: the others give up too.
            return jax.lax.cond(failed, lambda: jnp.bool_(True), work)

        failed = jax.lax.fori_loop(0, phases, phase, failed)
        status_ref[g] = jnp.where(failed, jnp.int32(1), jnp.int32(0))

    layout, phase_bar = grid_barrier.launch((blocks,), ("g",), interpret)
    return plgpu.kernel(
        kernel,
        out_type=(
            jax.ShapeDtypeStruct((phases + 1, ROWS, blocks * UNITS), jnp.float32),
            jax.ShapeDtypeStruct((blocks,), jnp.int32),
        ),
        scratch_types=dict(
            mine=plgpu.SMEM((ROWS, UNITS), jnp.float32),
            right=plgpu.SMEM((ROWS, UNITS), jnp.float32),
            bar=plgpu.Barrier(num_barriers=2),
            **phase_bar,
        ),
        **layout,
        kernel_name="grid_barrier_neighbours",
        interpret=interpret,
    )


def neighbour_reference(x0: np.ndarray, blocks: int, phases: int) -> np.ndarray:
    """NumPy result of `neighbour_kernel`."""
    out = [x0]
    for _ in range(phases):
        prev = out[-1].reshape(ROWS, blocks, UNITS)
        out.append((prev + np.roll(prev, -1, axis=1) + 1.0).reshape(ROWS, -1))
    return np.stack(out)


def compile_main(blocks: int = 132, phases: int = 700) -> None:
    """Run in a fresh deviceless process: lower and compile `neighbour_kernel` for an H100;
    prints a JSON line with what the lowered module holds."""
    from hlo import deviceless

    rep = jax.sharding.NamedSharding(deviceless.h100_mesh(), jax.sharding.PartitionSpec())
    x0 = jax.ShapeDtypeStruct((ROWS, blocks * UNITS), jnp.float32, sharding=rep)
    lowered = (
        jax.jit(neighbour_kernel(blocks, phases)).trace(x0).lower(lowering_platforms=("cuda",))
    )
    text = lowered.as_text()
    lowered.compile()
    pieces = {piece: piece in text for piece in ("fence.proxy.async.global", "red.release.gpu")}
    pieces["ld.acquire"] = "ld.acquire" in text
    pieces["no compare-and-swap"] = "cas.b32" not in text  # nothing decremented
    print(json.dumps(pieces))


def test_an_all_zero_status_passes():
    grid_barrier.raise_if_timed_out(np.zeros((132,), np.int32), "persistent forward")


def test_a_timed_out_block_is_one_error_line_naming_the_barrier():
    status = np.zeros((132,), np.int32)
    status[7], status[9] = 42, 43
    with pytest.raises(grid_barrier.GridBarrierTimeout) as error:
        grid_barrier.raise_if_timed_out(status, "persistent forward")
    line = str(error.value)
    assert "\n" not in line and line.startswith("persistent forward: grid barrier timed out")
    assert "2 of 132 blocks" in line and "barrier 41" in line and "restart the process" in line


def _arrive_in_order(counter: np.uint32, grid: int, order, leader_increment=None):
    """Every block of ``grid`` adds its `arrival_increment` to ``counter`` in ``order`` (uint32
    arithmetic, as the GPU's red.add.u32); returns the counter after each arrival."""
    values = []
    for block in order:
        step = grid_barrier.arrival_increment(grid, bool(block == 0))
        if block == 0 and leader_increment is not None:
            step = leader_increment
        counter = np.uint32((int(counter) + step % 2**32) % 2**32)
        values.append(counter)
    return values


@pytest.mark.parametrize("grid", [1, 2, 3, 66, 132])
def test_the_counters_sign_flips_exactly_when_the_last_block_arrives_in_any_order(grid):
    """Three calls of 5 barriers, arrivals in a fresh random order each barrier: before the
    last arrival no block may pass, after it every block passes, and the low 31 bits are back
    at zero; each call reads its start sign, so a call may begin at either sign."""
    rng = np.random.default_rng(grid)
    counter = np.uint32(0)
    for _call in range(3):
        start_sign = np.int32(counter.view(np.int32)) < 0
        for phase in range(5):
            sign_before = start_sign != (phase % 2 == 1)
            values = _arrive_in_order(counter, grid, rng.permutation(grid))
            passed = [bool(grid_barrier.has_flipped(v.view(np.int32), sign_before)) for v in values]
            assert passed == [False] * (grid - 1) + [True]
            counter = values[-1]
            assert int(counter) & 0x7FFFFFFF == 0


def test_a_leader_increment_one_too_large_would_let_blocks_pass_early():
    """The check above can fail: with the leader adding one more, the sign flips one
    arrival early whenever the leader is not last."""
    grid = 66
    order = [0] + list(range(1, grid))
    values = _arrive_in_order(np.uint32(0), grid, order, leader_increment=2**31 - grid + 2)
    passed = [bool(grid_barrier.has_flipped(v.view(np.int32), False)) for v in values]
    assert passed.index(True) == grid - 2


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="on a GPU the check is a callback")
def test_off_a_gpu_the_status_check_adds_no_host_callback():
    """A step lowered for a GPU on a CPU host cannot carry a host callback for the GPU."""
    jaxpr = jax.make_jaxpr(lambda s: grid_barrier.check_status(s, "f"))(jnp.zeros(4, jnp.int32))
    assert "callback" not in str(jaxpr)


def test_the_reference_adds_the_right_neighbour_each_phase():
    x0 = np.arange(ROWS * 3 * UNITS, dtype=np.float32).reshape(ROWS, -1)
    out = neighbour_reference(x0, blocks=3, phases=2)
    first = x0[:, :UNITS] + x0[:, UNITS : 2 * UNITS] + 1.0
    np.testing.assert_array_equal(out[1][:, :UNITS], first)
    wrap = x0[:, 2 * UNITS :] + x0[:, :UNITS] + 1.0
    np.testing.assert_array_equal(out[1][:, 2 * UNITS :], wrap)
    assert out.shape == (3, ROWS, 3 * UNITS)


@pytest.mark.gpu_compile
@needs_cuda
def test_a_132_block_700_phase_kernel_lowers_and_compiles_for_an_h100_without_a_gpu(tmp_path):
    here = pathlib.Path(__file__).parent
    code = "import test_kernels_mosaic_grid_barrier as t; t.compile_main()"
    pieces, _ = compile_deviceless(code, here, dump_dir=tmp_path, log_ptxas=False)
    assert all(pieces.values()), pieces


class TestOnAGpu(MosaicGpuMode):
    """The barrier's ordering and self-reset: compiled on a Hopper GPU (the semaphore
    barrier); in `TestInterpret` in GPU interpret mode, race detector on, with the cluster
    barrier that interpret mode uses in its place (the same kernel otherwise)."""

    CASES = {"shape": [(16, 50), (132, 700)]}  # (blocks, phases)

    def test_every_phase_sees_the_other_blocks_writes_twice_in_a_row(self, shape):
        blocks, phases = shape
        if self.INTERPRET and gpu_interpret.cluster_too_large(blocks):
            pytest.skip(gpu_interpret.cluster_too_large(blocks))
        run = jax.jit(neighbour_kernel(blocks, phases, interpret=self.interpret()))
        for seed in (0, 1):  # the second call starts from the semaphores the first left
            x0 = np.random.default_rng(seed).normal(size=(ROWS, blocks * UNITS)) * 1e-3
            x0 = x0.astype(np.float32)
            x, status = run(jnp.asarray(x0))
            assert not np.asarray(status).any()
            expected = neighbour_reference(x0, blocks, phases)
            np.testing.assert_allclose(np.asarray(x), expected, rtol=1e-6, atol=1e-6)


class TestInterpret(TestOnAGpu):
    INTERPRET = True
    CASES = {"shape": [(2, 3), (16, 4)]}  # 16: an H100's largest cluster

    def test_the_race_detector_reports_a_missing_barrier(self, monkeypatch, capsys):
        """The check can fail: without the barrier between phases, a block's load of its
        neighbour's slice races with the neighbour's store of it."""
        x0 = jnp.zeros((ROWS, 2 * UNITS), jnp.float32)

        def run():  # a new kernel each time: traced again, after the patch too
            return jax.block_until_ready(neighbour_kernel(2, 2, interpret=self.interpret())(x0))

        run()  # as it is: no race
        monkeypatch.setattr(grid_barrier, "cluster_barrier", lambda bar: jnp.bool_(True))
        assert_race_reported(run, capsys, monkeypatch)


class TestSpinOnAGpu(MosaicGpuMode):
    """The semaphore barrier's bounded spin (compiled only: interpret mode has no semaphore
    barrier)."""

    def test_a_grid_that_cannot_be_resident_gives_up_instead_of_hanging(self):
        device = jax.devices()[0]
        sms = getattr(device, "core_count", 132)
        blocks = 40 * sms  # far more blocks than fit at once
        run = jax.jit(neighbour_kernel(blocks, 2, spin_limit=20_000))
        _, status = run(jnp.zeros((ROWS, blocks * UNITS), jnp.float32))
        with pytest.raises(grid_barrier.GridBarrierTimeout, match="grid barrier timed out"):
            grid_barrier.raise_if_timed_out(status, "neighbours")
