"""A HyperRHN's two backwards in one launch (`kernels/mosaic/persistent_pair_backward.py`)
against its reference on fresh random inputs: `TestCompiled` on a GPU, `TestInterpret` in
GPU interpret mode on a CPU (race detector on); the reference's cotangent, the checks and
fitting; the H100 compile (``gpu_compile``)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_cases import (
    KEEP,
    SMEM_COUNTER,
    MosaicGpuMode,
    assert_no_spills,
    assert_pair_matches,
    backward_case,
    backward_packed,
    backward_rest,
    compile_deviceless,
    needs_cuda,
    pair_plans,
)
from rhhjax.kernels.mosaic import persistent_backward as pb
from rhhjax.kernels.mosaic import persistent_pair_backward as ppb
from rhhjax.kernels.mosaic import persistent_slots as slots
from rhhjax.kernels.mosaic.plan import PersistentPlan, PlanError


def _problem(seed, plans, steps, depth, last_layer_only):
    """(main, hyper) `BackwardOperands` (the main's g of layer L - 1 only if asked), proj."""
    cells = []
    for offset, (plan, has_z) in enumerate(zip(plans, (True, False), strict=True)):
        case = backward_case(seed + offset, plan, steps, depth, has_z, True)
        g = case["g"][depth - 1 :: depth] if has_z and last_layer_only else case["g"]
        wt = pb.backward_weights(plan, case["kernel_s"], jnp.dtype(plan.dtype))
        cells.append(ppb.BackwardOperands(wt, g, backward_packed(case), *backward_rest(case)))
    rng = np.random.default_rng(seed + 2)
    kernel = jnp.asarray(rng.normal(size=(depth, plans[1].width, plans[0].width)) * 0.3)
    return (*cells, ppb.projection(*plans, kernel)), kernel


class TestCompiled(MosaicGpuMode):
    """Every output of the launch (each cell's gradients, the hyper cell's cotangent with
    dz @ P_l) against the reference: the main cell's `persistent_backward_reference`, its dz
    into the hyper cell's g, the hyper cell's. The inputs are drawn, not a forward's: the
    tolerance is the main backward tests' (compiled: TF32 and wgmma sum order)."""

    CASES = {
        # (dtype, batch, width, hyper_width, cols, hyper_cols, row_blocks, k_chunk, T, L)
        "case": [("bfloat16", 256, 1000, 128, 16, 4, 4, 64, 2, 3),
                 ("float32", 100, 60, 32, 2, 1, 2, 32, 3, 2)],
        "option_case": [("bfloat16", 256, 1000, 128, 16, 4, 4, 64, 2, 2)],
    }  # fmt: skip
    TOL = {"bfloat16": 3e-2, "float32": 3e-3}

    def run(self, plans, operands):
        kernel = functools.partial(
            ppb.persistent_pair_backward, *plans, keep=KEEP, interpret=self.interpret()
        )
        return jax.block_until_ready(jax.jit(kernel)(*operands))

    @pytest.mark.parametrize("last_layer_only", [True, False])
    def test_matches_reference(self, case, last_layer_only, **options):
        plans = pair_plans(case, **options)
        operands, _ = _problem(7, plans, *case[8:], last_layer_only)
        outs = self.run(plans, operands)
        expected = ppb.persistent_pair_backward_reference(*plans, *operands, keep=KEEP)
        blocks = plans[0].row_blocks * (case[4] + case[5])
        assert_pair_matches(outs, expected, ("main", "hyper", "g_hyper"), self.TOL[case[0]], blocks)

    @pytest.mark.parametrize(
        "options",
        [dict(in_registers=True), dict(in_registers=True, producer=True),
         dict(in_registers=True, split_k=True)],
        ids=["registers", "producer", "split_k"],
    )  # fmt: skip
    def test_the_tuned_kernels_match_reference(self, option_case, options):
        """The epilogue in registers, a producer warpgroup, the GEMM split between two
        warpgroups: in both cells' blocks."""
        self.test_matches_reference(option_case, False, **options)


class TestInterpret(TestCompiled):
    INTERPRET = True
    CASES = {
        "case": [("float32", 20, 30, 16, 2, 1, 1, 16, 2, 2),
                 ("bfloat16", 100, 30, 16, 2, 1, 2, 16, 2, 2)],
        "option_case": [("float32", 100, 60, 32, 2, 1, 2, 32, 2, 2)],
    }  # fmt: skip
    # bf16: the epilogue's f32 math in another order than the reference's, cast to bf16
    TOL = {"bfloat16": 2e-2, "float32": 2e-5}


def test_the_reference_adds_dz_times_p_to_the_hyper_cells_cotangent():
    """g_hyper = the hyper's own g + dz_l @ P_l^T, dz the main cell's reference's (returned
    in 32s); the hyper cell's gradients are its reference's at that g."""
    plans = pair_plans(("float32", 20, 30, 16, 2, 1, 1, 16))
    (main, hyper, proj), kernel = _problem(8, plans, 3, 2, True)
    out = ppb.persistent_pair_backward_reference(*plans, main, hyper, proj, keep=KEEP)
    dz = pb.persistent_backward_reference(plans[0], *main, keep=KEEP).dz
    dz_pm = slots.scales_to_phase_major(dz, plans[0].n_pad)[:, :, :30]
    layers = jnp.arange(6) % 2
    added = jnp.einsum("pbn,phn->pbh", dz_pm, kernel[layers])
    np.testing.assert_allclose(out.g_hyper[:, :, :16], hyper.g[:, :, :16] + added, atol=1e-5)
    alone = pb.persistent_backward_reference(plans[1], *hyper._replace(g=out.g_hyper), keep=KEEP)
    np.testing.assert_array_equal(out.hyper.d_mm, alone.d_mm)

    # z_width 60: dz 64 wide, the main cell's then zeros
    plans = pair_plans(("float32", 100, 60, 32, 2, 1, 2, 32))
    (main, hyper, proj), _ = _problem(8, plans, 2, 2, True)
    out = ppb.persistent_pair_backward_reference(*plans, main, hyper, proj, keep=KEEP)
    dz = pb.persistent_backward_reference(plans[0], *main, keep=KEEP).dz
    assert (plans[0].z_width, ppb.dz_width(plans[0]), out.main.dz.shape[-1]) == (60, 64, 64)
    np.testing.assert_array_equal(out.main.dz[..., :60], dz)
    assert not np.asarray(out.main.dz[..., 60:]).any()


def test_operands_the_pair_cannot_run_are_one_line_errors():
    plans = pair_plans(("float32", 20, 30, 16, 2, 1, 1, 16))
    (main, hyper, proj), _ = _problem(9, plans, 2, 2, False)
    with pytest.raises(PlanError, match="the main cell with z, the hyper's g per phase"):
        ppb.persistent_pair_backward(*plans, main, hyper._replace(g=hyper.g[1::2]), proj)
    with pytest.raises(PlanError, match="proj"):
        ppb.persistent_pair_backward(*plans, main, hyper, proj.astype(jnp.bfloat16))
    with pytest.raises(PlanError, match="projection kernel"):
        ppb.projection(*plans, jnp.zeros((2, 15, 30)))


def test_fitting_keeps_the_paper_plans_and_lowers_stages_where_the_pair_does_not_fit():
    main = PersistentPlan(256, 1000, "bfloat16", 16, 4, 64, 3)
    hyper = PersistentPlan(256, 128, "bfloat16", 4, 4, 64, 4, units=32)
    assert ppb.fit_plans(main, hyper) == (main, hyper)
    assert ppb.smem_bytes(main, hyper) <= main.smem_limit
    deeper = PersistentPlan(256, 1000, "bfloat16", 16, 4, 64, 4)  # 4 stages: the main's 3
    fitted = ppb.fit_plans(deeper, hyper)
    assert [plan.stages for plan in fitted] == [3, 4]
    assert ppb.smem_bytes(*fitted) <= main.smem_limit < ppb.smem_bytes(deeper, hyper)


_COMPILE = (
    SMEM_COUNTER
    + """
from rhhjax.kernels.mosaic import persistent_pair_backward as ppb
from rhhjax.ops.persistent_plans import plan_for
from rhhjax.ops.persistent_variant import PersistentVariant
for fields in {cases!r}:
    variant = PersistentVariant("paired", **fields)
    plans = [variant.planned(plan_for(256, n, "bfloat16", "grid")) for n in (1000, 128)]
    plan, hyper = ppb.fit_plans(*plans)
    steps, depth = 3, 7
    def ops(p, has_z):
        b, n = p.b_pad, p.n_pad
        g = sds((steps, b, n)) if has_z else sds((steps * depth, b, n))
        return ppb.BackwardOperands(
            sds((depth * n, 2 * n), jnp.bfloat16), g, sds((steps * depth, b, p.packed_rows, n)),
            sds((depth, steps, b, p.z_width)) if has_z else None,
            sds((steps * depth, b, n), jnp.uint8), sds((depth, b, 2, n)) if has_z else None)
    args = (ops(plan, True), ops(hyper, False), sds((depth * hyper.n_pad, plan.n_pad)))
    allocated.clear()
    text = lower_and_compile(lambda *a: ppb.persistent_pair_backward(plan, hyper, *a, keep=0.75),
                             *args)
    rows.append(dict(fields=fields, smem=list(allocated), limit=plan.smem_limit,
                     counted=ppb.smem_bytes(plan, hyper), stages=[plan.stages, hyper.stages],
                     marks=["persistent_pair_backward" in text, "red.release.gpu" in text]))
print(json.dumps(rows))
"""
)


@pytest.mark.gpu_compile
@needs_cuda
def test_the_paired_backward_compiles_for_an_h100_without_a_gpu(tmp_path):
    """The paper's bf16 plans (4 x 16 + 4 x 4 blocks) in one launch, the first design's
    fields and the second design's (and split_k, which fits only in registers): within the
    block's shared memory and `persistent_pair_backward.smem_bytes`, the stages the cells'
    own, no register spilled."""
    cases = [{}, {"epilogue": "registers"}, {"epilogue": "registers", "sharing": "producer"},
             {"epilogue": "registers", "sharing": "split_k"}]  # fmt: skip
    rows, reports = compile_deviceless(_COMPILE.format(cases=cases), tmp_path, log_ptxas=False)
    assert len(rows) == len(cases)
    for row in rows:
        assert all(row["marks"]) and len(row["smem"]) == 1, row
        assert row["smem"][0] <= min(row["counted"], row["limit"]), row
        assert row["counted"] - row["smem"][0] <= 10_240, row
    assert [row["stages"] for row in rows] == [[3, 4], [5, 8], [5, 8], [2, 8]]
    assert len(reports) == len(rows)
    assert_no_spills(reports)
