"""The persistent whole-sequence backward kernel (`kernels/mosaic/persistent_backward.py`) run
against its reference on fresh random inputs. `TestCompiled`: compiled, on a GPU only;
`TestInterpret`: the same tests with the kernel executed in GPU interpret mode on a CPU,
race detector on (jax >= 0.11.2; one block, clusters of 6 and 16 blocks meeting at a
cluster barrier), and a kernel without its barrier between phases reported as a race. The
reference itself, the plan and the H100 compile:
tests/test_kernels_mosaic_persistent_backward.py."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_cases import (
    KEEP,
    MosaicGpuMode,
    assert_race_reported,
    backward_case,
    backward_packed,
    backward_reference,
    backward_rest,
)
from rhhjax.kernels.layout import F32
from rhhjax.kernels.mosaic import gemm
from rhhjax.kernels.mosaic import grid_barrier as gb
from rhhjax.kernels.mosaic import interpret as gpu_interpret
from rhhjax.kernels.mosaic import persistent_backward as pb
from rhhjax.kernels.mosaic import persistent_backward_cell as pbc
from rhhjax.kernels.mosaic.plan import PersistentPlan


class TestCompiled(MosaicGpuMode):
    """The kernel against its reference on fresh random inputs: compiled (a GPU only; the
    grid barrier), and in `TestInterpret` executed in GPU interpret mode, race detector on
    (jax >= 0.11.2; the grid as one cluster with a cluster barrier). f32 operands run as
    TF32 in wgmma on a GPU: the compiled f32 tolerance is TF32's; bf16 d_scaled feeds the
    next phase, so errors compound over the phases."""

    CASES = {
        # (PersistentPlan arguments, steps, depth, z_on, mask_on)
        "case": [
            ((64, 60, "bfloat16", 4, 1, 32), 3, 2, True, True),
            ((100, 37, "float32", 3, 2, 32), 2, 3, False, True),
            ((256, 1000, "bfloat16"), 4, 2, True, False),  # the paper plan: 132 blocks
            ((256, 1000, "float32", 33, 4), 2, 2, False, False),
        ],
        # the main GEMM split: the paper bf16 blocks at K chunks of 32, 2 stages (where two
        # warpgroups' stages fit); 2 x 3 (f32)
        "split_case": [
            ((256, 1000, "bfloat16", 16, 4, 32, 2), 4, 2, True, False),
            ((100, 37, "float32", 3, 2, 32), 2, 3, False, True),
        ],
        "largest_case": [],  # the paper plan of "case" is the largest
        # the weights multicast to a column's row blocks: the paper bf16 plan; 2 x 3 (f32)
        "multicast_case": [
            ((256, 1000, "bfloat16", 16, 4, 64, 3), 3, 2, True, True),
            ((100, 37, "float32", 3, 2, 32), 2, 3, False, True),
        ],
        # the paper bf16 blocks at 5 stages; 2 x 2 (f32)
        "registers_case": [
            ((256, 1000, "bfloat16", 16, 4, 64, 5), 3, 2, True, True),
            ((100, 60, "float32", 2, 2, 32), 2, 3, False, True),
        ],
    }
    TOL = {"bfloat16": 3e-2, "float32": 3e-3}
    LAYOUT = "grid"  # the kernels' launch layout (`kernels/mosaic/rowgroup_layout.py`)

    def runnable_plan(
        self, plan_args, multicast="", split_k=False, in_registers=False, producer=False
    ):
        """The case's plan; skipped where this mode cannot run its blocks at once.
        ``multicast``: the layout whose shared operand is multicast (rowgroup: A, grid: B)."""
        plan = PersistentPlan(
            *plan_args, multicast_a=multicast == "rowgroup", multicast_b=multicast == "grid",
            split_k=split_k, in_registers=in_registers, producer=producer,
        )  # fmt: skip
        cluster = plan.grid if self.LAYOUT == "grid" else plan.col_blocks
        if self.INTERPRET and gpu_interpret.cluster_too_large(cluster):
            pytest.skip(gpu_interpret.cluster_too_large(cluster))
        return plan

    def test_matches_reference(
        self, case, multicast="", split_k=False, in_registers=False, producer=False
    ):
        plan_args, steps, depth, z_on, mask_on = case
        plan = self.runnable_plan(plan_args, multicast, split_k, in_registers, producer)
        case = backward_case(plan.batch + steps, plan, steps, depth, z_on, mask_on)
        wt, expected = backward_reference(plan, case, jnp.dtype(plan.dtype))
        kernel = functools.partial(
            pb.persistent_backward, plan, keep=KEEP, interpret=self.interpret(),
            layout=self.LAYOUT,
        )  # fmt: skip
        actual = jax.jit(kernel)(wt, case["g"], backward_packed(case), *backward_rest(case))
        assert not np.asarray(actual[-1]).any(), "grid barrier timed out"
        assert len(actual) == len(expected) == 5 + z_on  # with z: dz
        tol = self.TOL[plan.dtype]
        for a, e in zip(actual[:-1], expected[:-1], strict=True):
            a, e = np.asarray(a, np.float32), np.asarray(e, np.float32)
            np.testing.assert_allclose(a, e, rtol=tol, atol=tol * float(np.abs(e).max()))

    def test_the_largest_cluster_matches_reference(self, largest_case):
        """The mode's largest grid, once (the other tests run smaller multi-block cases)."""
        self.test_matches_reference(largest_case)

    def test_the_shared_operand_multicast_in_a_cluster_matches_reference(self, multicast_case):
        """`PersistentPlan.multicast_a` in the row-group layout, `multicast_b` in the grid
        (the shared operand's chunks loaded once per cluster): the same outputs. Interpret
        mode copies the chunk to each block: only a GPU multicasts."""
        self.test_matches_reference(multicast_case, multicast=self.LAYOUT)

    def test_the_gemm_split_between_two_warpgroups_matches_reference(self, split_case):
        """`PersistentPlan.split_k` (warpgroup 1 runs the second half of each phase's K
        chunks on its own stages, warpgroup 0 adds it): the same outputs."""
        self.test_matches_reference(split_case, split_k=True)

    @pytest.mark.parametrize("sharing", ["none", "multicast", "split_k"])
    def test_the_epilogue_in_registers_matches_reference(self, registers_case, sharing):
        """`PersistentPlan.in_registers` (the gate backward reads the accumulator in
        registers and sums da's columns there), alone, with the shared operand multicast
        (row blocks to share it) and with the GEMM split: the same outputs."""
        if sharing == "multicast" and registers_case[0][4:5] in ((), (1,)):
            pytest.skip("one row block: nothing to multicast")
        multicast = self.LAYOUT if sharing == "multicast" else ""
        self.test_matches_reference(registers_case, multicast, sharing == "split_k", True)

    @pytest.mark.parametrize("in_registers", [False, True])
    def test_a_producer_warpgroups_loads_match_reference(self, registers_case, in_registers):
        """`PersistentPlan.producer` (warpgroup 1 issues the K loop's loads, each phase's
        weights before its barrier), with either epilogue: the same outputs."""
        self.test_matches_reference(registers_case, in_registers=in_registers, producer=True)

    def test_the_last_layers_cotangent_alone_is_the_dense_one(self, case):
        """g [T, b_pad, n_pad] (layer L - 1's, the others zero: a model that reads the last
        layer) gives what the dense g with those zeros gives."""
        plan_args, steps, depth, z_on, mask_on = case
        plan = self.runnable_plan(plan_args)
        case = backward_case(plan.batch + 2 * steps, plan, steps, depth, z_on, mask_on)
        g_last = case["g"][depth - 1 :: depth]
        dense = jnp.zeros_like(case["g"]).at[depth - 1 :: depth].set(g_last)
        wt = pb.backward_weights(plan, case["kernel_s"], jnp.dtype(plan.dtype))
        rest = (backward_packed(case), *backward_rest(case))
        expected = pb.persistent_backward_reference(plan, wt, dense, *rest, keep=KEEP)
        kernel = functools.partial(
            pb.persistent_backward, plan, keep=KEEP, interpret=self.interpret(),
            layout=self.LAYOUT,
        )  # fmt: skip
        actual = jax.jit(kernel)(wt, g_last, *rest)
        assert not np.asarray(actual[-1]).any(), "grid barrier timed out"
        tol = self.TOL[plan.dtype]
        for a, e in zip(actual[:-1], expected[:-1], strict=True):
            a, e = np.asarray(a, np.float32), np.asarray(e, np.float32)
            np.testing.assert_allclose(a, e, rtol=tol, atol=tol * float(np.abs(e).max()))


class TestInterpret(TestCompiled):
    INTERPRET = True
    CASES = {
        "case": [
            ((64, 64, "bfloat16", 1, 1, 32), 3, 2, True, True),  # one block
            ((100, 37, "float32", 3, 2, 32), 2, 3, False, True),  # 2 x 3, the compiled case
            # z_width 40 of n_pad 48: the last block's z loads and dz stores run past z
            ((64, 40, "float32", 3, 1, 16), 2, 2, True, True),
        ],
        # 16 blocks: an H100's largest cluster
        "largest_case": [((64, 256, "bfloat16", 16, 1, 32), 2, 2, True, True)],
        # K steps 4 of 4 stages (bf16); 6 of 4 (f32)
        "split_case": [
            ((64, 64, "bfloat16", 1, 1, 32), 3, 2, True, True),
            ((64, 40, "float32", 3, 1, 16), 2, 2, True, True),
        ],
        "multicast_case": [
            ((100, 37, "float32", 3, 2, 32), 2, 3, False, True),  # 2 x 3
            ((150, 64, "bfloat16", 2, 3, 32), 3, 2, True, True),  # 3 x 2, dz too
        ],
        # one block with z (bf16); 2 x 2 (f32)
        "registers_case": [
            ((64, 64, "bfloat16", 1, 1, 32, 2), 3, 2, True, True),
            ((100, 60, "float32", 2, 2, 32, 2), 2, 3, False, True),
        ],
    }  # fmt: skip
    TOL = {"bfloat16": 3e-2, "float32": 2e-5}

    def _two_block_run(self, split_k=False):
        """A function that runs the kernel interpreted on two blocks (f32, no z, no mask),
        traced again at each call (after a patch too)."""
        plan = PersistentPlan(64, 32, "float32", col_blocks=2, k_chunk=32, split_k=split_k)
        case = backward_case(2, plan, 2, 2, False, False)
        wt = pb.backward_weights(plan, case["kernel_s"], F32)

        def run():
            kernel = functools.partial(
                pb.persistent_backward, plan, interpret=self.interpret(), layout=self.LAYOUT
            )
            args = (wt, case["g"], backward_packed(case), *backward_rest(case))
            return jax.block_until_ready(jax.jit(kernel)(*args))

        return run

    def test_the_race_detector_reports_a_missing_barrier_between_phases(self, monkeypatch, capsys):
        """The check can fail: without the barrier between phases, one block's TMA load of
        the layer above's d_scaled races with another block's store of it."""
        run = self._two_block_run()
        run()  # as it is: no race
        monkeypatch.setattr(gb, "cluster_barrier", lambda bar: jnp.bool_(True))
        assert_race_reported(run, capsys, monkeypatch)

    def test_the_race_detector_reports_a_store_the_next_phase_reads_left_writing(
        self, monkeypatch, capsys
    ):
        """The check can fail: a phase that leaves one bulk store more in flight past the
        barrier than its late ones (dz, the bias sums: nothing in the kernel reads them)
        leaves a store of its d_scaled writing, which races with another block's TMA load of
        it in the next phase."""
        run = self._two_block_run()
        run()  # as it is: no race
        wait = pbc.wait_for_all_but
        monkeypatch.setattr(pbc, "wait_for_all_but", lambda late: wait(late + 1))
        assert_race_reported(run, capsys, monkeypatch)

    def test_the_race_detector_reports_a_lead_that_does_not_wait_for_the_helper(
        self, monkeypatch, capsys
    ):
        """The check can fail: with ``split_k``, warpgroup 0 reading the helper's partial
        tile without waiting for its ``done`` races with warpgroup 1's write of it."""
        run = self._two_block_run(split_k=True)
        run()  # as it is: no race
        from jax.experimental.pallas import mosaic_gpu as plgpu

        def lead_without_waiting(
            out, staged, split, a, b, a_block, b_block, *, k_steps, first_ready=None
        ):
            plgpu.barrier_arrive(split.go)
            gemm.gemm_nt_staged(
                out, staged, a, b, a_block, b_block, k_steps=gemm.SplitK.halves(k_steps)[0],
            )  # fmt: skip
            out[...] = out[...] + split.partial[...]

        monkeypatch.setattr(gemm, "lead_gemm", lead_without_waiting)
        assert_race_reported(run, capsys, monkeypatch)


@pytest.mark.parametrize("mode", [TestCompiled, TestInterpret], ids=["compiled", "interpret"])
def test_every_kernel_case_is_a_plan_the_kernel_accepts(mode):
    """Checked on a CPU, where the cases of more blocks than interpret mode runs never
    reach the kernel (the forward's 66-block case was first found invalid on a GPU)."""
    for plan_args, _, _, z_on, mask_on in mode.CASES["case"] + mode.CASES["largest_case"]:
        pb.check_plan(PersistentPlan(*plan_args), z_on, mask_on)
    for plan_args, _, _, z_on, mask_on in mode.CASES["split_case"]:
        pb.check_plan(PersistentPlan(*plan_args, split_k=True), z_on, mask_on)
    for plan_args, _, _, z_on, mask_on in mode.CASES["multicast_case"]:
        plan = PersistentPlan(*plan_args, multicast_b=True)
        pb.check_plan(plan, z_on, mask_on)
