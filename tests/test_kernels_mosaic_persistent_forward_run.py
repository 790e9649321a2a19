"""The persistent whole-sequence forward kernel (`kernels/mosaic/persistent_forward.py`) run
against its reference on fresh random inputs. `TestCompiled`: compiled, on a GPU only;
`TestInterpret`: the same tests with the kernel executed in GPU interpret mode on a CPU, race
detector on (jax >= 0.11.2; one block, and clusters of 2, 8 and 16 blocks meeting at a cluster
barrier), and a kernel without its barrier between phases reported as a race. The
reference itself, the plan and the H100 compile:
tests/test_kernels_mosaic_persistent_forward.py."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_cases import (
    KEEP,
    MosaicGpuMode,
    assert_race_reported,
    forward_gate_rows,
    forward_inputs,
    forward_operands,
    forward_problem,
    pad_units,
)
from rhhjax.kernels.mosaic import forward as mf
from rhhjax.kernels.mosaic import grid_barrier, keep_mask, persistent_cell
from rhhjax.kernels.mosaic import interpret as gpu_interpret
from rhhjax.kernels.mosaic import persistent_forward as pf
from rhhjax.kernels.mosaic import persistent_slots as slots
from rhhjax.kernels.mosaic import plan as pp


def _teacher_forced(plan, ops, inputs, save_z: bool):
    """The reference of every phase from the kernel's own input state of that phase
    (``inputs`` [P, b_pad, n_pad], packed row 0), so that one rounding flip of a bf16 state
    does not propagate: [(s_new, h, t[, full]) per phase]."""
    w_blk, _, xproj, bias, z_lt, decisions = ops
    mask = keep_mask.mask_values(decisions, KEEP)
    z = None if z_lt is None else slots.scales_to_phase_major(z_lt, plan.n_pad)
    depth = bias.shape[0]
    w_layers = w_blk.reshape(depth, 2 * plan.n_pad, plan.k_pad)
    outs = []
    for p, s in enumerate(inputs):
        t, layer = divmod(p, depth)
        x_scale = 1.0 if layer == 0 else 0.0
        outs.append(mf.highway_forward_reference(
            s[:, : plan.k_pad].astype(w_blk.dtype), w_layers[layer], s, bias[layer],
            None if z is None else z[p], pad_units(plan, xproj[t]) * x_scale,
            None if mask is None else mask[p],
            save=True, units=plan.units_per_block,
        ))  # fmt: skip
    return outs


def _case_plan(
    case, multicast: str = "", in_registers: bool = False, producer: bool = False
) -> pp.PersistentPlan:
    """A `TestCompiled` "case"'s plan: f32 at 2 pipeline stages, bf16 at the most of 4, 3, 2
    whose shared memory fits (a block of 256 rows needs fewer than 4); ``multicast`` the
    layout whose shared operand is multicast (rowgroup: A, grid: the weights)."""
    dtype, batch, width, cols, row_blocks, k_chunk = case[:6]
    for stages in (2,) if dtype == "float32" else (4, 3, 2):
        plan = pp.PersistentPlan(
            batch, width, dtype, cols, row_blocks, k_chunk, stages,
            multicast_a=multicast == "rowgroup", multicast_b=multicast == "grid",
            in_registers=in_registers, producer=producer,
        )  # fmt: skip
        if plan.smem_bytes() <= plan.smem_limit:
            break
    return plan


class TestCompiled(MosaicGpuMode):
    """The kernel against its reference on fresh random inputs: compiled (a GPU only; the
    grid barrier), and in `TestInterpret` executed in GPU interpret mode, race detector on
    (jax >= 0.11.2; the grid as one cluster with a cluster barrier). Each phase is compared
    with the reference run from the kernel's own input state of that phase, the state chain
    (each phase's input is the last one's output, the A buffer their casts) exactly. f32
    operands run as TF32 in wgmma on a GPU: the compiled f32 tolerance is TF32's."""

    CASES = {
        # (dtype, batch, width, col_blocks, row_blocks, k_chunk, steps, depth)
        "case": [("bfloat16", 256, 1000, 66, 1, 64, 4, 3), ("float32", 100, 37, 3, 2, 16, 3, 2),
                 ("bfloat16", 256, 1000, 33, 4, 64, 2, 2)],
        "largest_case": [],  # the paper plans of "case" are the largest
        # the weights multicast to a column's row blocks: the paper bf16 plan; 2 x 3 (f32)
        "multicast_case": [("bfloat16", 256, 1000, 16, 4, 64, 3, 3),
                           ("float32", 100, 37, 3, 2, 16, 3, 2)],
        "registers_case": [("bfloat16", 256, 1000, 16, 4, 64, 3, 3),
                           ("float32", 100, 60, 2, 2, 32, 3, 2)],
        "producer_case": [("bfloat16", 256, 1000, 16, 4, 64, 3, 3),
                          ("float32", 100, 60, 2, 2, 32, 3, 2)],
    }  # fmt: skip
    # Compiled, wgmma sums in another order than XLA's reference (and f32 runs as TF32): on
    # an H100 (2026-11-26) some cases missed 1e-4 / 3e-3 by a few elements
    # (1 of 262,144 at 1.26e-4 in bf16, identical in both launch layouts, so arithmetic, not
    # a race; 4 of 8,192 at up to 5.5e-3 in f32). A wrong phase is off by O(0.1) or more.
    TOL = {"bfloat16": 3e-4, "float32": 1e-2}
    LAYOUT = "grid"  # the kernels' launch layout (`kernels/mosaic/rowgroup_layout.py`)

    def run(self, plan, ops, save):
        """The jitted kernel in this class's mode; the plan must suit the mode."""
        if self.INTERPRET:
            cluster = plan.grid if self.LAYOUT == "grid" else plan.col_blocks
            reason = gpu_interpret.cluster_too_large(cluster)
            if reason is not None:
                pytest.skip(reason)
        kernel = functools.partial(
            pf.persistent_forward, plan, save=save, keep=KEEP, interpret=self.interpret(),
            layout=self.LAYOUT,
        )  # fmt: skip
        return jax.block_until_ready(jax.jit(kernel)(*ops))

    @pytest.mark.parametrize(("has_z", "has_mask"), [(True, True), (False, False)])
    def test_matches_reference(
        self, case, has_z, has_mask, multicast="", in_registers=False, producer=False
    ):
        dtype, batch, width, cols, row_blocks, k_chunk, steps, depth = case
        plan = _case_plan(case, multicast, in_registers, producer)
        ops = forward_operands(
            plan, forward_problem(5, batch, width, steps, depth), has_z, has_mask
        )
        s_last, packed, s_mm, status = self.run(plan, ops, save=True)
        assert not np.asarray(status).any(), status
        outputs = self.check_saved_chain(plan, ops, s_last, packed, s_mm, steps, depth)
        # Without save (another kernel): every state, and the A buffer their casts.
        states, s_mm_unsaved, status = self.run(plan, ops, save=False)
        assert not np.asarray(status).any()
        self.check_unsaved(plan, ops, states, s_mm_unsaved, outputs, steps, depth)

    def test_the_largest_cluster_matches_reference(self, largest_case):
        """The mode's largest grid, once, with z and the mask (the other tests run smaller
        multi-block cases)."""
        self.test_matches_reference(largest_case, True, True)

    def test_the_shared_operand_multicast_in_a_cluster_matches_reference(self, multicast_case):
        """`PersistentPlan.multicast_a` in the row-group layout (each A chunk loaded once per
        row-group cluster), `multicast_b` in the grid (each weight chunk once per cluster of
        a column's row blocks): the same outputs. Interpret mode copies the chunk to each
        block: only a GPU multicasts."""
        self.test_matches_reference(multicast_case, True, True, multicast=self.LAYOUT)

    def test_the_epilogue_in_registers_matches_reference(self, registers_case):
        """`PersistentPlan.in_registers`: the gate math reads the GEMM tile's halves in the
        accumulators' registers (no f32 tile in shared memory), with the shared operand
        multicast where there are row blocks to share it: the same outputs."""
        multicast = self.LAYOUT if registers_case[4] > 1 else ""
        self.test_matches_reference(registers_case, True, True, multicast, in_registers=True)

    @pytest.mark.parametrize("in_registers", [False, True])
    def test_a_producer_warpgroups_loads_match_reference(self, producer_case, in_registers):
        """`PersistentPlan.producer` (warpgroup 1 issues the K loop's loads, each phase's
        weights before its barrier), with either epilogue: the same outputs."""
        self.test_matches_reference(producer_case, True, True, "", in_registers, producer=True)

    def check_saved_chain(self, plan, ops, s_last, packed, s_mm, steps, depth):
        """The saved outputs against the reference phase by phase (teacher-forced from the
        kernel's own input states, ``ops[4]`` its z), the A buffer exactly the casts of the
        state chain; returns the state after every phase [P, b_pad, n_pad]."""
        dtype, has_z = plan.dtype, ops[4] is not None
        inputs = forward_inputs(plan, packed, s_mm, steps, depth)
        np.testing.assert_array_equal(inputs[0], ops[1])  # s0
        outputs = jnp.concatenate([inputs[1:], s_last], axis=0)
        chain = jnp.concatenate([ops[1][None], outputs], axis=0)[..., : plan.k_pad]
        chain = slots.to_slots(chain[:-1], steps, depth)  # every phase's input, layer-major
        np.testing.assert_array_equal(s_mm, chain.astype(dtype).reshape(s_mm.shape))
        tol = self.TOL[dtype]
        for p, want in enumerate(_teacher_forced(plan, ops, inputs, has_z)):
            rows = forward_gate_rows(plan, packed[p])
            if has_z:  # the saved rows are full's halves: (s_new, full) of the reference
                got, want = [outputs[p], rows], [want[0], want[3]]
            else:  # the gates
                got = [outputs[p], rows[:, 0], rows[:, 1]]
            assert len(got) == len(want)
            for a, e in zip(got, want, strict=True):
                np.testing.assert_allclose(a, e, rtol=tol, atol=tol, err_msg=f"phase {p}")
        return outputs

    def check_unsaved(self, plan, ops, states, s_mm, outputs, steps, depth):
        """Without save: every state (as the saved kernel's), the A buffer their casts."""
        tol = self.TOL[plan.dtype]
        np.testing.assert_allclose(states, outputs, rtol=tol, atol=tol)
        chain = jnp.concatenate([ops[1][None], states], axis=0)[..., : plan.k_pad]
        chain = slots.to_slots(chain[:-1], steps, depth)
        np.testing.assert_array_equal(s_mm, chain.astype(plan.dtype).reshape(s_mm.shape))


class TestInterpret(TestCompiled):
    INTERPRET = True
    CASES = {
        # one block; 2 row blocks; 2 x 3 (the compiled odd case)
        "case": [("bfloat16", 64, 64, 1, 1, 32, 3, 2), ("float32", 100, 32, 1, 2, 16, 2, 3),
                 ("float32", 100, 37, 3, 2, 16, 3, 2)],
        "largest_case": [("bfloat16", 64, 256, 16, 1, 32, 2, 2)],  # an H100's largest cluster
        # 2 x 3 (f32); 3 x 2 (bf16)
        "multicast_case": [("float32", 100, 37, 3, 2, 16, 3, 2),
                           ("bfloat16", 150, 64, 2, 3, 32, 2, 2)],
        "registers_case": [("bfloat16", 64, 64, 1, 1, 32, 3, 2),
                           ("float32", 100, 60, 2, 2, 32, 3, 2)],
        "producer_case": [("bfloat16", 64, 64, 1, 1, 32, 3, 2),
                          ("float32", 100, 60, 2, 2, 32, 3, 2)],
    }  # fmt: skip
    TOL = {"bfloat16": 1e-4, "float32": 2e-5}

    def test_the_race_detector_reports_a_missing_barrier_between_phases(self, monkeypatch, capsys):
        """The check can fail: without the barrier between phases, one block's next-phase
        TMA load of the state races with another block's store of it."""
        plan = pp.PersistentPlan(64, 64, "bfloat16", col_blocks=2, k_chunk=32)
        ops = forward_operands(plan, forward_problem(1, 64, 64, 2, 1), False, False)
        self.run(plan, ops, save=False)  # as it is: no race
        monkeypatch.setattr(grid_barrier, "cluster_barrier", lambda bar: jnp.bool_(True))
        assert_race_reported(lambda: self.run(plan, ops, save=False), capsys, monkeypatch)

    def test_the_race_detector_reports_a_store_the_next_phase_reads_left_writing(
        self, monkeypatch, capsys
    ):
        """The check can fail: a phase that leaves one bulk store more in flight past the
        barrier than its late ones (which nothing in the kernel reads) leaves its A rows'
        store writing, which races with another block's TMA load of them in the next phase."""
        plan = pp.PersistentPlan(64, 64, "bfloat16", col_blocks=2, k_chunk=32)
        ops = forward_operands(plan, forward_problem(1, 64, 64, 2, 1), False, False)
        self.run(plan, ops, save=False)  # as it is: no race
        wait = persistent_cell.wait_for_all_but
        monkeypatch.setattr(persistent_cell, "wait_for_all_but", lambda late: wait(late + 1))
        assert_race_reported(lambda: self.run(plan, ops, save=False), capsys, monkeypatch)


@pytest.mark.parametrize("mode", [TestCompiled, TestInterpret], ids=["compiled", "interpret"])
def test_every_kernel_case_is_a_plan_the_kernel_accepts(mode):
    """Checked on a CPU: a case that only a GPU can run (66 blocks) was first found to be
    an invalid plan there (2026-11-26: 286,800 B of shared memory at 4 stages)."""
    for case in mode.CASES["case"] + mode.CASES["largest_case"]:
        _case_plan(case).check()
    for case in mode.CASES["multicast_case"]:
        _case_plan(case, multicast=mode.LAYOUT).check()
