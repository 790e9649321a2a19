"""The persistent whole-sequence backward kernel (`kernels/mosaic/persistent_backward.py`) run
against its reference on fresh random inputs (also with z recomputed from a hyper cell's A
buffer, `ScalesInside`, against the reference that reads that z, and with the hyper cell
inside, `HyperBackward`). `TestCompiled`: compiled, on a GPU only; `TestInterpret`: the same
tests with the kernel executed in GPU interpret mode on a CPU, race detector on (jax >=
0.11.2; one block, clusters of 6 and 16 blocks meeting at a cluster barrier), and a kernel
without its barrier between phases reported as a race. The reference itself, the plan and
the H100 compile: tests/test_kernels_mosaic_persistent_backward.py."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_cases import (
    KEEP,
    MosaicGpuMode,
    assert_race_reported,
    backward_a_buffer,
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
from rhhjax.kernels.mosaic import persistent_forward as pf
from rhhjax.kernels.mosaic import persistent_slots as slots
from rhhjax.kernels.mosaic.plan import PersistentPlan


def _scales(case, hyper_width: int, seed: int) -> pb.ScalesInside:
    """`ScalesInside` on fresh random operands at the case's rows: a hyper plan of
    ``hyper_width`` (k_chunk 32, 2 stages), its A buffer and tail drawn in the matmul dtype,
    a projection P [L, h, n] and a bias p near 1 (z about 1)."""
    plan, steps, depth = case["plan"], case["steps"], case["depth"]
    rng = np.random.default_rng(seed)
    hp = PersistentPlan(plan.batch, hyper_width, plan.dtype, 1, plan.row_blocks, 32, 2)
    mm = jnp.dtype(plan.dtype)

    def normal(*shape, scale=1.0):
        return jnp.asarray(rng.normal(size=shape) * scale, F32)

    s_h = normal(steps * depth, plan.b_pad, hyper_width)
    s_mm = slots.inputs_to_a_buffer(s_h, steps, depth, hp.k_pad).astype(mm)
    tail = jnp.pad(normal(plan.b_pad, hyper_width), [(0, 0), (0, hp.k_pad - hyper_width)])
    proj = pf.projection_weights(plan, hp, normal(depth, hyper_width, plan.width, scale=0.1), mm)
    p = jnp.pad(1.0 + normal(depth, plan.width, scale=0.1), [(0, 0), (0, plan.n_pad - plan.width)])
    p_rows = jnp.broadcast_to(p[:, None], (depth, plan.b_pad, plan.n_pad))
    return pb.ScalesInside(hp, s_mm, tail.astype(mm), proj, p_rows)


def _with_room_for_scales(
    plan, scales_plan, depth: int, has_mask: bool, hyper_plan=None
) -> PersistentPlan:
    """``plan`` at the most pipeline stages whose shared memory fits z's recomputation (and
    the hyper cell inside), as `persistent.scales_backward_plan` picks; stages change no
    layout."""
    for stages in range(plan.stages, 1, -1):
        fitted = dataclasses.replace(plan, stages=stages)
        need = pb.backward_smem_bytes(
            fitted, True, has_mask, depth, scales_plan, hyper_plan, has_mask
        )
        if need <= plan.smem_limit:
            return fitted
    pytest.fail(f"no stages of {plan} fit z's recomputation")


def _hyper_backward(case, scales: pb.ScalesInside, mask_on: bool, seed: int) -> pb.HyperBackward:
    """`HyperBackward` of a hyper cell as wide as ``scales``' (fresh random cotangent of its
    last layer alone, as the model gives it; saved rows, mask; f32: its A buffer) on at most
    3 column blocks of the case's plan, of 16-unit multiples (uint8 mask rows), with the
    projection P that ``scales`` holds."""
    plan, steps, depth = case["plan"], case["steps"], case["depth"]
    width = scales.plan.width
    cols = min(plan.col_blocks, 3)
    units = -(-width // cols // 16) * 16
    hp = PersistentPlan(plan.batch, width, plan.dtype, cols, plan.row_blocks, 32, 2, units=units)
    hyper = backward_case(seed, hp, steps, depth, False, mask_on)
    mm = jnp.dtype(plan.dtype)
    # P [L, h, n] back from `projection_weights`' P^T rows [L * n_pad, kh_pad]
    p_t = scales.proj.reshape(depth, plan.n_pad, -1)[:, : plan.width, :width]
    proj = jnp.swapaxes(p_t, 1, 2).astype(F32)
    return pb.HyperBackward(
        hp, pb.backward_weights(hp, hyper["kernel_s"], mm), hyper["g"][depth - 1 :: depth],
        backward_packed(hyper),
        hyper["decisions"], backward_a_buffer(hyper), pb.projection_rows(plan, hp, proj, mm),
    )  # fmt: skip


def _hyper_inside_problem(plan: PersistentPlan, steps: int, depth: int, mask_on: bool, seeds):
    """(plan with room for z's recomputation, the kernel's arguments, `ScalesInside`,
    `HyperBackward`) of a fresh random problem with z recomputed and the hyper cell inside;
    ``seeds``: the case's, the scales', the hyper cell's."""
    case = backward_case(seeds[0], plan, steps, depth, True, mask_on)
    scales = _scales(case, 40, seed=seeds[1])
    case = _recomputed_scales(case, scales)
    hyper = _hyper_backward(case, scales, mask_on, seed=seeds[2])
    plan = _with_room_for_scales(plan, scales.plan, depth, mask_on, hyper.plan)
    wt = pb.backward_weights(plan, case["kernel_s"], jnp.dtype(plan.dtype))
    _, decisions, bias, s_mm = backward_rest(case)
    args = (wt, case["g"], backward_packed(case), None, decisions, bias, s_mm)
    return plan, args, scales, hyper


def _recomputed_scales(case, scales: pb.ScalesInside) -> dict:
    """The case with z and the gates made from ``scales`` (z as the kernel recomputes it)."""
    plan = case["plan"]
    z_op = pf.scales_from_a_buffer_reference(
        plan, scales.plan, scales.s_mm, scales.tail, scales.proj, scales.proj_bias,
        case["steps"],
    )  # fmt: skip
    return dict(case, z_op=z_op, z=slots.scales_to_phase_major(z_op, plan.n_pad))


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
        # "case"s with z, the hyper cell inside on blocks of its own: 4 x (16 + 3) blocks
        "hyper_own_case": [((256, 1000, "bfloat16"), 4, 2, True, False)],
        # "case"s run with one wgmma in flight: K steps 33 of 4 stages; 3 of 4
        "in_flight_case": [
            ((256, 1000, "bfloat16"), 4, 2, True, False),
            ((100, 37, "float32", 3, 2, 32), 2, 3, False, True),
        ],
        "largest_case": [],  # the paper plan of "case" is the largest
        # the weights multicast to a column's row blocks: the paper bf16 plan; 2 x 3 (f32)
        "multicast_case": [
            ((256, 1000, "bfloat16", 16, 4, 64, 3), 3, 2, True, True),
            ((100, 37, "float32", 3, 2, 32), 2, 3, False, True),
        ],
    }
    TOL = {"bfloat16": 3e-2, "float32": 3e-3}
    LAYOUT = "grid"  # the kernels' launch layout (`kernels/mosaic/rowgroup_layout.py`)

    def runnable_plan(
        self, plan_args, in_flight: int = 0, prefetch=False, multicast="", split_k=False
    ) -> PersistentPlan:
        """The case's plan; skipped where this mode cannot run its blocks at once.
        ``multicast``: the layout whose shared operand is multicast (rowgroup: A, grid: B)."""
        plan = PersistentPlan(
            *plan_args, wgmma_in_flight=in_flight, prefetch_weights=prefetch,
            multicast_a=multicast == "rowgroup", multicast_b=multicast == "grid",
            split_k=split_k,
        )  # fmt: skip
        cluster = plan.grid if self.LAYOUT == "grid" else plan.col_blocks
        if self.INTERPRET and gpu_interpret.cluster_too_large(cluster):
            pytest.skip(gpu_interpret.cluster_too_large(cluster))
        return plan

    def test_matches_reference(
        self, case, in_flight=0, prefetch=False, multicast="", split_k=False
    ):
        plan_args, steps, depth, z_on, mask_on = case
        plan = self.runnable_plan(plan_args, in_flight, prefetch, multicast, split_k)
        case = backward_case(plan.batch + steps, plan, steps, depth, z_on, mask_on)
        wt, expected = backward_reference(plan, case, jnp.dtype(plan.dtype))
        kernel = functools.partial(
            pb.persistent_backward, plan, keep=KEEP, interpret=self.interpret(),
            layout=self.LAYOUT,
        )  # fmt: skip
        actual = jax.jit(kernel)(wt, case["g"], backward_packed(case), *backward_rest(case))
        assert not np.asarray(actual[-1]).any(), "grid barrier timed out"
        assert len(actual) == len(expected) == 5 + 2 * z_on  # with z: dz and its sums
        tol = self.TOL[plan.dtype]
        for a, e in zip(actual[:-1], expected[:-1], strict=True):
            a, e = np.asarray(a, np.float32), np.asarray(e, np.float32)
            np.testing.assert_allclose(a, e, rtol=tol, atol=tol * float(np.abs(e).max()))

    def test_the_largest_cluster_matches_reference(self, largest_case):
        """The mode's largest grid, once (the other tests run smaller multi-block cases)."""
        self.test_matches_reference(largest_case)

    def test_one_wgmma_in_flight_matches_reference(self, in_flight_case):
        """`PersistentPlan.wgmma_in_flight` 1: the same outputs (interpret mode runs wgmma
        synchronously: only a GPU overlaps them)."""
        self.test_matches_reference(in_flight_case, in_flight=1)

    @pytest.mark.parametrize("in_flight", [0, 1])
    def test_weights_loaded_before_the_barrier_match_reference(self, in_flight_case, in_flight):
        """`PersistentPlan.prefetch_weights` (a phase's first weight chunks load before the
        barrier ending the phase before): the same outputs."""
        self.test_matches_reference(in_flight_case, in_flight, prefetch=True)

    @pytest.mark.parametrize("in_flight", [0, 1])
    def test_the_shared_operand_multicast_in_a_cluster_matches_reference(
        self, multicast_case, in_flight
    ):
        """`PersistentPlan.multicast_a` in the row-group layout, `multicast_b` in the grid
        (the shared operand's chunks loaded once per cluster): the same outputs. Interpret
        mode copies the chunk to each block: only a GPU multicasts."""
        self.test_matches_reference(multicast_case, in_flight, multicast=self.LAYOUT)

    @pytest.mark.parametrize("in_flight", [0, 1])
    def test_the_gemm_split_between_two_warpgroups_matches_reference(
        self, in_flight_case, in_flight
    ):
        """`PersistentPlan.split_k` (warpgroup 1 runs the second half of each phase's K
        chunks on its own stages, warpgroup 0 adds it): the same outputs."""
        self.test_matches_reference(in_flight_case, in_flight, split_k=True)

    def test_z_recomputed_from_the_hyper_buffer_is_z_read(self, case):
        """With `ScalesInside` (z from the hyper cell's A buffer, the forward's GEMM, p_l
        added) every output is the reference's with that z read: z never leaves the kernel."""
        plan_args, steps, depth, z_on, mask_on = case
        plan = self.runnable_plan(plan_args)
        if not z_on:
            pytest.skip("z recomputed applies to the cases with z")
        case = backward_case(plan.batch + 3 * steps, plan, steps, depth, True, mask_on)
        scales = _scales(case, 40, seed=plan.batch + steps)
        case = _recomputed_scales(case, scales)
        plan = _with_room_for_scales(plan, scales.plan, depth, mask_on)
        wt, expected = backward_reference(plan, case, jnp.dtype(plan.dtype))
        z_op, decisions, bias, s_mm = backward_rest(case)
        kernel = functools.partial(
            pb.persistent_backward, plan, keep=KEEP, interpret=self.interpret(),
            layout=self.LAYOUT,
        )  # fmt: skip
        args = (wt, case["g"], backward_packed(case), None, decisions, bias, s_mm)
        actual = jax.jit(lambda *a: kernel(*a, scales=scales))(*args)
        assert not np.asarray(actual[-1]).any(), "grid barrier timed out"
        assert len(actual) == len(expected) == 7
        tol = self.TOL[plan.dtype]
        for a, e in zip(actual[:-1], expected[:-1], strict=True):
            a, e = np.asarray(a, np.float32), np.asarray(e, np.float32)
            np.testing.assert_allclose(a, e, rtol=tol, atol=tol * float(np.abs(e).max()))

    def test_the_hyper_cell_inside_matches_its_reference(self, case):
        """With `HyperBackward` (the hyper cell one phase behind, ds_h = dz P^T from the main
        cell's dz): every output of both cells matches the reference, which is the main
        cell's reference, then the hyper cell's with g + ds_h; the main cell's outputs are
        those of the kernel without the hyper cell."""
        plan_args, steps, depth, z_on, mask_on = case
        plan = self.runnable_plan(plan_args)
        if not z_on:
            pytest.skip("the hyper cell inside needs z (its ds_h is dz P^T)")
        seeds = (plan.batch + 5 * steps, plan.batch + 2 * steps, plan.batch + 7)
        plan, args, scales, hyper = _hyper_inside_problem(plan, steps, depth, mask_on, seeds)
        options = dict(keep=KEEP, scales=scales, hyper=hyper)
        expected = pb.persistent_backward_reference(plan, *args, **options)
        kernel = functools.partial(
            pb.persistent_backward, plan, interpret=self.interpret(), layout=self.LAYOUT,
            **options,
        )  # fmt: skip
        actual = jax.jit(kernel)(*args)
        assert not np.asarray(actual[-1]).any(), "grid barrier timed out"
        assert len(actual) == len(expected) == 11  # the main cell's 6, the hyper cell's 4
        tol = self.TOL[plan.dtype]
        for a, e in zip(actual[:-1], expected[:-1], strict=True):
            a, e = np.asarray(a, np.float32), np.asarray(e, np.float32)
            np.testing.assert_allclose(a, e, rtol=tol, atol=tol * float(np.abs(e).max()))
        alone = pb.persistent_backward_reference(plan, *args, keep=KEEP, scales=scales)
        for a, e in zip(expected[:6], alone[:6], strict=True):
            np.testing.assert_array_equal(a, e)

    def test_the_hyper_cell_on_blocks_of_its_own_gives_the_shared_blocks_outputs(
        self, hyper_own_case
    ):
        """``hyper_blocks="own"``: the hyper phases on blocks after the main columns, at the
        same time as the main phases; every output equal to the hyper cell's on the main
        blocks (the same GEMMs on the same operands), every block's status zero."""
        plan_args, steps, depth, _, mask_on = hyper_own_case
        plan = self.runnable_plan(plan_args)
        seeds = (plan.batch + 3, plan.batch + 4, plan.batch + 6)
        plan, args, scales, hyper = _hyper_inside_problem(plan, steps, depth, mask_on, seeds)

        def run(hyper_blocks):
            kernel = functools.partial(
                pb.persistent_backward, plan, keep=KEEP, interpret=self.interpret(),
                layout=self.LAYOUT, scales=scales, hyper=hyper, hyper_blocks=hyper_blocks,
            )  # fmt: skip
            return jax.jit(kernel)(*args)

        shared, own = run("shared"), run("own")
        assert own[-1].shape == (plan.row_blocks * (plan.col_blocks + hyper.plan.col_blocks),)
        assert not np.asarray(own[-1]).any() and not np.asarray(shared[-1]).any()
        for a, e in zip(own[:-1], shared[:-1], strict=True):
            np.testing.assert_array_equal(a, e)

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
        # 1 + 1 blocks (bf16); 3 + 3 (f32, z_width past the last block's units)
        "hyper_own_case": [
            ((64, 64, "bfloat16", 1, 1, 32), 3, 2, True, True),
            ((64, 40, "float32", 3, 1, 16), 2, 2, True, True),
        ],
        # K steps 4 of 4 stages (bf16); 6 of 4 (f32)
        "in_flight_case": [
            ((64, 64, "bfloat16", 1, 1, 32), 3, 2, True, True),
            ((64, 40, "float32", 3, 1, 16), 2, 2, True, True),
        ],
        "multicast_case": [
            ((100, 37, "float32", 3, 2, 32), 2, 3, False, True),  # 2 x 3
            ((150, 64, "bfloat16", 2, 3, 32), 3, 2, True, True),  # 3 x 2, dz too
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

        def lead_without_waiting(out, staged, split, a, b, a_block, b_block, *, k_steps, in_flight):
            plgpu.barrier_arrive(split.go)
            gemm.gemm_nt_staged(
                out, staged, a, b, a_block, b_block, k_steps=gemm.SplitK.halves(k_steps)[0],
                in_flight=in_flight, b_loaded=False,
            )  # fmt: skip
            out[...] = out[...] + split.partial[...]

        monkeypatch.setattr(gemm, "lead_gemm", lead_without_waiting)
        assert_race_reported(run, capsys, monkeypatch)


@pytest.mark.parametrize("mode", [TestCompiled, TestInterpret], ids=["compiled", "interpret"])
def test_every_kernel_case_is_a_plan_the_kernel_accepts(mode):
    """Checked on a CPU, where the cases of more blocks than interpret mode runs never
    reach the kernel (the forward's 66-block case was first found invalid on a GPU)."""
    for plan_args, _, depth, z_on, mask_on in mode.CASES["case"] + mode.CASES["largest_case"]:
        pb.check_plan(PersistentPlan(*plan_args), z_on, mask_on, depth)
    for plan_args, _, depth, z_on, mask_on in mode.CASES["in_flight_case"]:
        for prefetch in (False, True):
            plan = PersistentPlan(*plan_args, wgmma_in_flight=1, prefetch_weights=prefetch)
            pb.check_plan(plan, z_on, mask_on, depth)
    for plan_args, _, depth, z_on, mask_on in mode.CASES["multicast_case"]:
        plan = PersistentPlan(*plan_args, wgmma_in_flight=1, multicast_b=True)
        pb.check_plan(plan, z_on, mask_on, depth)
