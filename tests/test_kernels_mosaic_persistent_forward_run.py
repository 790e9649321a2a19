"""The persistent whole-sequence forward kernel (`kernels/mosaic/persistent_forward.py`) run
against its reference on fresh random inputs. `TestCompiled`: compiled, on a GPU only;
`TestInterpret`: the same tests with the kernel executed in GPU interpret mode on a CPU, race
detector on (jax >= 0.11.2; one block, and clusters of 2, 8 and 16 blocks meeting at a cluster
barrier), and a kernel without its barrier between phases reported as a race; both also with
the hyper cell inside. The reference itself, the plan and the H100 compile:
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


def _hyper_inside(plan, hyper_plan, hyper_ops, seed):
    """`HyperInside` of the hyper operands ``hyper_ops`` (`_operands` without z) and a fresh
    projection P [L, h, n], p [L, n] near 1 (so z scales by about 1)."""
    rng = np.random.default_rng(seed)
    depth, h, n = hyper_ops[3].shape[0], hyper_plan.width, plan.width
    proj = jnp.asarray(rng.normal(size=(depth, h, n)) * 0.2, jnp.float32)
    p = jnp.asarray(1.0 + rng.normal(size=(depth, n)) * 0.1, jnp.float32)
    p = jnp.pad(p, [(0, 0), (0, plan.n_pad - n)])
    w_blk, s0, xproj, bias, _, mask = hyper_ops
    return pf.HyperInside(
        hyper_plan, w_blk, s0, xproj, bias, mask,
        pf.projection_weights(plan, hyper_plan, proj, jnp.dtype(plan.dtype)),
        jnp.broadcast_to(p[:, None], (depth, plan.b_pad, plan.n_pad)),
    )  # fmt: skip


def _case_plan(
    case, in_flight: int = 0, prefetch: bool = False, multicast: str = ""
) -> pp.PersistentPlan:
    """A `TestCompiled` "case"'s plan: f32 at 2 pipeline stages, bf16 at the most of 4, 3, 2
    whose shared memory fits (a block of 256 rows needs fewer than 4); ``multicast`` the
    layout whose shared operand is multicast (rowgroup: A, grid: the weights)."""
    dtype, batch, width, cols, row_blocks, k_chunk = case[:6]
    for stages in (2,) if dtype == "float32" else (4, 3, 2):
        plan = pp.PersistentPlan(
            batch, width, dtype, cols, row_blocks, k_chunk, stages,
            wgmma_in_flight=in_flight, prefetch_weights=prefetch,
            multicast_a=multicast == "rowgroup", multicast_b=multicast == "grid",
        )  # fmt: skip
        if plan.smem_bytes() <= plan.smem_limit:
            break
    return plan


def _hyper_case_plans(hyper_case) -> tuple[pp.PersistentPlan, pp.PersistentPlan]:
    """A "hyper_case"'s (main plan, hyper plan), both at 2 pipeline stages."""
    dtype, batch, width, hyper_width, n_r, cols, hyper_cols, k_chunk, _, _, *u = hyper_case
    plan = pp.PersistentPlan(batch, width, dtype, cols, n_r, k_chunk, 2, units=(u or [None])[0])
    hp = pp.PersistentPlan(batch, hyper_width, dtype, hyper_cols, n_r, k_chunk, 2, units=16)
    return plan, hp


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
        # (dtype, batch, width, hyper width, row_blocks, col_blocks, hyper col_blocks,
        #  k_chunk, steps, depth)
        "hyper_case": [("bfloat16", 256, 1000, 128, 4, 16, 8, 64, 3, 3),
                       ("float32", 100, 64, 32, 2, 2, 2, 32, 2, 3)],
        # "hyper_case"s with the hyper cell on blocks of its own (4 x (16 + 8) at the paper's)
        "hyper_own_case": [("bfloat16", 256, 1000, 128, 4, 16, 8, 64, 3, 3),
                           ("float32", 100, 64, 32, 2, 2, 2, 32, 2, 3)],
        # "case"s run with one wgmma in flight: K steps 16 of 2 stages; 3 of 2
        "in_flight_case": [("bfloat16", 256, 1000, 66, 1, 64, 4, 3),
                           ("float32", 100, 37, 3, 2, 16, 3, 2)],
        "largest_case": [],  # the paper plans of "case" are the largest
        # the weights multicast to a column's row blocks: the paper bf16 plan; 2 x 3 (f32)
        "multicast_case": [("bfloat16", 256, 1000, 16, 4, 64, 3, 3),
                           ("float32", 100, 37, 3, 2, 16, 3, 2)],
    }  # fmt: skip
    # Compiled, wgmma sums in another order than XLA's reference (and f32 runs as TF32): on
    # an H100 (2026-11-26) the hyper-inside cases missed 1e-4 / 3e-3 by a few elements
    # (1 of 262,144 at 1.26e-4 in bf16, identical in both launch layouts, so arithmetic, not
    # a race; 4 of 8,192 at up to 5.5e-3 in f32). A wrong phase is off by O(0.1) or more.
    TOL = {"bfloat16": 3e-4, "float32": 1e-2}
    LAYOUT = "grid"  # the kernels' launch layout (`kernels/mosaic/rowgroup_layout.py`)

    def run(self, plan, ops, save, hyper=None, save_scales=True, hyper_blocks="shared"):
        """The jitted kernel in this class's mode; the plan must suit the mode."""
        if self.INTERPRET:
            cluster = plan.grid if self.LAYOUT == "grid" else plan.col_blocks
            if hyper_blocks == "own":
                cluster += plan.row_blocks * hyper.plan.col_blocks
            reason = gpu_interpret.cluster_too_large(cluster)
            if reason is not None:
                pytest.skip(reason)
        kernel = functools.partial(
            pf.persistent_forward, plan, save=save, keep=KEEP, interpret=self.interpret(),
            layout=self.LAYOUT, hyper=hyper, save_scales=save_scales, hyper_blocks=hyper_blocks,
        )  # fmt: skip
        return jax.block_until_ready(jax.jit(kernel)(*ops))

    @pytest.mark.parametrize(("has_z", "has_mask"), [(True, True), (False, False)])
    def test_matches_reference(
        self, case, has_z, has_mask, in_flight=0, prefetch=False, multicast=""
    ):
        dtype, batch, width, cols, row_blocks, k_chunk, steps, depth = case
        plan = _case_plan(case, in_flight, prefetch, multicast)
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

    def test_one_wgmma_in_flight_matches_reference(self, in_flight_case):
        """`PersistentPlan.wgmma_in_flight` 1: the same outputs (interpret mode runs wgmma
        synchronously: only a GPU overlaps them)."""
        self.test_matches_reference(in_flight_case, True, True, in_flight=1)

    @pytest.mark.parametrize("in_flight", [0, 1])
    def test_weights_loaded_before_the_barrier_match_reference(self, in_flight_case, in_flight):
        """`PersistentPlan.prefetch_weights` (a phase's first weight chunks load before the
        barrier ending the phase before): the same outputs."""
        self.test_matches_reference(in_flight_case, True, True, in_flight, prefetch=True)

    @pytest.mark.parametrize("in_flight", [0, 1])
    def test_the_shared_operand_multicast_in_a_cluster_matches_reference(
        self, multicast_case, in_flight
    ):
        """`PersistentPlan.multicast_a` in the row-group layout (each A chunk loaded once per
        row-group cluster), `multicast_b` in the grid (each weight chunk once per cluster of
        a column's row blocks): the same outputs. Interpret mode copies the chunk to each
        block: only a GPU multicasts."""
        self.test_matches_reference(multicast_case, True, True, in_flight, multicast=self.LAYOUT)

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

    @pytest.mark.parametrize("has_mask", [True, False])
    def test_hyper_cell_inside_matches_the_two_kernels_and_hyper_scales(self, hyper_case, has_mask):
        """With the hyper cell inside (`HyperInside`): its outputs match the reference on
        the hyper operands as the plain kernel's do (teacher-forced, the A buffer exactly
        its state chain's casts); z is `hyper_scales_reference` of the kernel's own hyper
        states (the tail the last of them, exactly); the main outputs match the reference
        teacher-forced with that z, which is also `scales_from_a_buffer_reference` of the
        saved A buffer and tail (what the backward recomputes it from). Without
        ``save_scales`` the same outputs but z; without save the same states."""
        dtype, batch, width, hyper_width, n_r, cols, hyper_cols, k_chunk, steps, depth, *u = (
            hyper_case
        )
        plan, hp = _hyper_case_plans(hyper_case)
        ops_h = forward_operands(
            hp, forward_problem(7, batch, hyper_width, steps, depth), False, has_mask
        )
        ops = forward_operands(
            plan, forward_problem(8, batch, width, steps, depth), False, has_mask
        )
        hyper = _hyper_inside(plan, hp, ops_h, seed=9)
        outs = self.run(plan, ops, save=True, hyper=hyper)
        s_last, packed, s_mm, h_last, h_packed, sh_mm, z, tail, status = outs
        assert not np.asarray(status).any(), status
        h_states = self.check_saved_chain(hp, ops_h, h_last, h_packed, sh_mm, steps, depth)
        np.testing.assert_array_equal(tail, h_states[-1, :, : hp.k_pad].astype(dtype))
        want_z = pf.hyper_scales_reference(plan, hp, h_states, hyper.proj, hyper.proj_bias, steps)
        tol = self.TOL[dtype]
        np.testing.assert_allclose(z, want_z, rtol=tol, atol=tol)
        from_buffer = pf.scales_from_a_buffer_reference(
            plan, hp, sh_mm, tail, hyper.proj, hyper.proj_bias, steps
        )
        np.testing.assert_array_equal(from_buffer, want_z)
        main_ops = (*ops[:4], z, ops[5])
        outputs = self.check_saved_chain(plan, main_ops, s_last, packed, s_mm, steps, depth)
        without_z = self.run(plan, ops, save=True, hyper=hyper, save_scales=False)
        assert len(without_z) == len(outs) - 1
        for a, e in zip(without_z, (*outs[:6], *outs[7:]), strict=True):
            np.testing.assert_array_equal(a, e)
        unsaved = self.run(plan, ops, save=False, hyper=hyper)
        states, s_mm_unsaved, h_states_unsaved, sh_mm_unsaved, tail_unsaved, status = unsaved
        assert not np.asarray(status).any(), status
        self.check_unsaved(plan, main_ops, states, s_mm_unsaved, outputs, steps, depth)
        self.check_unsaved(hp, ops_h, h_states_unsaved, sh_mm_unsaved, h_states, steps, depth)
        want_tail = h_states_unsaved[-1, :, : hp.k_pad].astype(dtype)
        np.testing.assert_array_equal(tail_unsaved, want_tail)

    def test_the_hyper_cell_on_blocks_of_its_own_gives_the_shared_blocks_outputs(
        self, hyper_own_case
    ):
        """``hyper_blocks="own"``: the hyper phases on blocks after the main columns, at the
        same time as the main phases; every output equal to the hyper cell's on the main
        blocks (the same GEMMs on the same operands), every block's status zero."""
        dtype, batch, width, hyper_width, *_, steps, depth = hyper_own_case[:10]
        plan, hp = _hyper_case_plans(hyper_own_case)
        ops_h = forward_operands(
            hp, forward_problem(3, batch, hyper_width, steps, depth), False, True
        )
        ops = forward_operands(plan, forward_problem(4, batch, width, steps, depth), False, True)
        hyper = _hyper_inside(plan, hp, ops_h, seed=5)
        shared = self.run(plan, ops, save=True, hyper=hyper)
        own = self.run(plan, ops, save=True, hyper=hyper, hyper_blocks="own")
        assert own[-1].shape == (plan.row_blocks * (plan.col_blocks + hp.col_blocks),)
        assert not np.asarray(own[-1]).any() and not np.asarray(shared[-1]).any()
        for a, e in zip(own[:-1], shared[:-1], strict=True):
            np.testing.assert_array_equal(a, e)


class TestInterpret(TestCompiled):
    INTERPRET = True
    CASES = {
        # one block; 2 row blocks; 2 x 3 (the compiled odd case)
        "case": [("bfloat16", 64, 64, 1, 1, 32, 3, 2), ("float32", 100, 32, 1, 2, 16, 2, 3),
                 ("float32", 100, 37, 3, 2, 16, 3, 2)],
        "largest_case": [("bfloat16", 64, 256, 16, 1, 32, 2, 2)],  # an H100's largest cluster
        # two row blocks of 2 blocks, both with hyper units; 4 blocks, 2 with hyper units
        "hyper_case": [("float32", 100, 64, 32, 2, 2, 2, 32, 2, 3),
                       ("bfloat16", 64, 128, 32, 1, 4, 2, 32, 3, 2),
                       ("float32", 5, 96, 20, 1, 4, 4, 64, 4, 2, 32)],
        # 2 x (2 + 2) blocks; 1 x (4 + 2) in bf16
        "hyper_own_case": [("float32", 100, 64, 32, 2, 2, 2, 32, 2, 3),
                           ("bfloat16", 64, 128, 32, 1, 4, 2, 32, 3, 2)],
        # K steps 2 of 4 stages (bf16); 3 of 2 (f32)
        "in_flight_case": [("bfloat16", 64, 64, 1, 1, 32, 3, 2),
                           ("float32", 100, 37, 3, 2, 16, 3, 2)],
        # 2 x 3 (f32); 3 x 2 (bf16)
        "multicast_case": [("float32", 100, 37, 3, 2, 16, 3, 2),
                           ("bfloat16", 150, 64, 2, 3, 32, 2, 2)],
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
    for case in mode.CASES["in_flight_case"]:
        _case_plan(case, in_flight=1).check()
    for case in mode.CASES["multicast_case"]:
        _case_plan(case, in_flight=1, multicast=mode.LAYOUT).check()
    for hyper_case in mode.CASES["hyper_case"]:
        for plan in _hyper_case_plans(hyper_case):
            plan.check()
