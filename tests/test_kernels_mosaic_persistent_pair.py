"""A HyperRHN's two forwards in one launch (`kernels/mosaic/persistent_pair.py`) against its
reference on fresh random inputs: `TestCompiled` on a GPU, `TestInterpret` in GPU interpret
mode on a CPU (race detector on); the plans' checks and fitting; the H100 compile
(``gpu_compile``)."""

import dataclasses
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
    compile_deviceless,
    forward_operands,
    forward_problem,
    needs_cuda,
    pair_plans,
)
from rhhjax.kernels.mosaic import persistent_forward as pf
from rhhjax.kernels.mosaic import persistent_pair as pair
from rhhjax.kernels.mosaic.plan import PersistentPlan, PlanError

from rhhjax.ops import cells


def _problem(seed, main_plan, hyper_plan, steps, depth, has_mask):
    """(main, hyper) `CellOperands`, proj, proj_bias and the unpadded (P, p)."""
    cell_ops = []
    for offset, plan in enumerate((main_plan, hyper_plan)):
        prob = forward_problem(seed + offset, plan.batch, plan.width, steps, depth)
        w, s0, xproj, bias, _, mask = forward_operands(plan, prob, False, has_mask)
        cell_ops.append(pair.CellOperands(w, s0, xproj, bias, mask))
    rng = np.random.default_rng(seed + 2)
    kernel = jnp.asarray(rng.normal(size=(depth, hyper_plan.width, main_plan.width)) * 0.3)
    bias = jnp.asarray(1.0 + rng.normal(size=(depth, main_plan.width)) * 0.2)
    proj = pair.projection_weights(main_plan, hyper_plan, kernel, jnp.dtype(main_plan.dtype))
    return (*cell_ops, proj, pair.projection_bias(main_plan, bias)), (kernel, bias)


class TestCompiled(MosaicGpuMode):
    """Every output of the launch (both cells' states, saved rows and A buffers, z) against
    the reference: the hyper cell's `persistent_forward_reference`, z from its states, the
    main cell's. Compiled, bf16 rounding flips propagate through the phases unforced: the
    tolerance is a few bf16 ulps of O(1) values; a wrong phase or z tile is off by O(0.1)."""

    CASES = {
        # (dtype, batch, width, hyper_width, cols, hyper_cols, row_blocks, k_chunk, T, L)
        "case": [("bfloat16", 256, 1000, 128, 16, 4, 4, 64, 3, 3),
                 ("float32", 100, 60, 32, 2, 1, 2, 32, 3, 2)],
        "option_case": [("bfloat16", 256, 1000, 128, 16, 4, 4, 64, 2, 3)],
    }  # fmt: skip
    TOL = {"bfloat16": 3e-2, "float32": 1e-2}

    def run(self, plans, operands, save):
        kernel = functools.partial(
            pair.persistent_pair_forward, *plans, save=save, keep=KEEP, interpret=self.interpret()
        )
        return jax.block_until_ready(jax.jit(kernel)(*operands))

    @pytest.mark.parametrize(("save", "has_mask"), [(True, True), (False, False)])
    def test_matches_reference(self, case, save, has_mask, **options):
        plans = pair_plans(case, **options)
        steps, depth = case[8:]
        operands, _ = _problem(3, *plans, steps, depth, has_mask)
        outs = self.run(plans, operands, save)
        expected = pair.persistent_pair_forward_reference(*plans, *operands, save=save, keep=KEEP)
        blocks = plans[0].row_blocks * (case[4] + case[5])
        assert_pair_matches(outs, expected, ("z", "main", "hyper"), self.TOL[case[0]], blocks)

    @pytest.mark.parametrize(
        "options",
        [dict(in_registers=True), dict(producer=True), dict(in_registers=True, producer=True)],
        ids=["registers", "producer", "both"],
    )
    def test_the_second_designs_fields_match_reference(self, option_case, options):
        """The epilogue in registers and a producer warpgroup, in both cells' blocks."""
        self.test_matches_reference(option_case, True, True, **options)


class TestInterpret(TestCompiled):
    INTERPRET = True
    CASES = {
        "case": [("float32", 20, 30, 16, 2, 1, 1, 16, 2, 2),
                 ("bfloat16", 100, 30, 16, 2, 1, 2, 16, 2, 2)],
        "option_case": [("float32", 100, 60, 32, 2, 1, 2, 32, 2, 2)],
    }  # fmt: skip
    TOL = {"bfloat16": 1e-5, "float32": 1e-5}  # the same operations, in the same order


def test_the_reference_is_the_hyper_cell_its_z_and_the_main_cell():
    """z equals the model's projection (`cells.hyper_scales`) of the hyper cell's states, and
    the main cell is `persistent_forward_reference` with that z."""
    plans = pair_plans(("float32", 20, 30, 16, 2, 1, 1, 16))
    operands, (kernel, bias) = _problem(4, *plans, 3, 2, True)
    main, hyper = operands[:2]
    out = pair.persistent_pair_forward_reference(*plans, *operands, save=False, keep=KEEP)
    states = pf.persistent_forward_reference(plans[1], *hyper[:4], None, hyper.mask, save=False,
                                             keep=KEEP).states  # fmt: skip
    layers = states[:, :20, :16].reshape(3, 2, 20, 16)
    z = jnp.swapaxes(cells.hyper_scales(kernel, bias, layers, jnp.float32), 0, 1)
    np.testing.assert_allclose(out.z[:, :, :20, :30], z, atol=1e-5)
    main_ref = pf.persistent_forward_reference(plans[0], *main[:4], out.z, main.mask, save=False,
                                               keep=KEEP)  # fmt: skip
    np.testing.assert_array_equal(out.main.states, main_ref.states)


def test_plans_of_other_rows_or_too_many_blocks_are_one_line_errors():
    main = PersistentPlan(256, 1000, "bfloat16", 16, 4, 64, 3)
    with pytest.raises(PlanError, match="rows per block, row blocks") as err:
        pair.check_pair(main, PersistentPlan(256, 128, "bfloat16", 4, 2, 64, 3), None)
    assert "\n" not in str(err.value)
    f32 = PersistentPlan(256, 1000, "float32", 132, 4, 64, 2)
    with pytest.raises(PlanError, match="544 blocks exceed the 132 SMs"):
        pair.check_pair(f32, PersistentPlan(256, 128, "float32", 4, 4, 64, 2), None)
    with pytest.raises(PlanError, match="B of shared memory a block exceed"):
        pair.check_pair(main, PersistentPlan(256, 128, "bfloat16", 4, 4, 64, 8, units=32), None)
    with pytest.raises(PlanError, match="need the same sharing"):
        producer = dataclasses.replace(main, producer=True)
        pair.check_pair(producer, PersistentPlan(256, 128, "bfloat16", 4, 4, 64, 3), None)
    with pytest.raises(PlanError, match="sharing=multicast runs in"):
        multicast = dataclasses.replace(main, multicast_b=True)
        pair.check_pair(multicast, PersistentPlan(256, 128, "bfloat16", 4, 4, 64, 3), None)
    with pytest.raises(PlanError, match="projection kernel has shape"):
        pair.projection_weights(main, PersistentPlan(256, 128, "bfloat16", 4, 4, 64, 3),
                                jnp.zeros((7, 100, 1000)), jnp.bfloat16)  # fmt: skip


def test_fitting_lowers_the_hyper_cells_stages_before_the_main_cells():
    """At the paper's bf16 plans nothing is lowered; at the f32 plans of 4 stages of 64 (the
    interpret mode's) no hyper depth fits beside the main cell's 4: 3 and 3."""
    main = PersistentPlan(256, 1000, "bfloat16", 16, 4, 64, 3)
    hyper = PersistentPlan(256, 128, "bfloat16", 4, 4, 64, 4, units=32)
    assert pair.fit_plans(main, hyper) == (main, hyper)
    main = PersistentPlan(5, 13, "float32", 2, 1, 64, 4, units=32)
    hyper = PersistentPlan(5, 7, "float32", 2, 1, 64, 4, units=32)
    fitted_main, fitted_hyper = pair.fit_plans(main, hyper)
    assert (fitted_main.stages, fitted_hyper.stages) == (3, 3)
    assert pair.smem_bytes(fitted_main, fitted_hyper) <= main.smem_limit
    assert pair.smem_bytes(main, dataclasses.replace(hyper, stages=1)) > main.smem_limit


_COMPILE = (
    SMEM_COUNTER
    + """
from rhhjax.kernels.mosaic import persistent_pair as pair
from rhhjax.ops.persistent_plans import plan_for
from rhhjax.ops.persistent_variant import PersistentVariant
for fields in {cases!r}:
    variant = PersistentVariant("paired", **fields)
    plans = [variant.planned(plan_for(256, n, "bfloat16", "grid")) for n in (1000, 128)]
    plans = pair.fit_plans(*plans)
    steps, depth = 3, 7
    def cell(plan):
        b, n, k = plan.b_pad, plan.n_pad, plan.k_pad
        return pair.CellOperands(sds((depth * 2 * n, k), jnp.bfloat16), sds((b, n)),
                                 sds((steps, b, 2, plan.z_width)), sds((depth, b, 2, n)),
                                 sds((steps * depth, b, n), jnp.uint8))
    main, hyper = plans
    args = (cell(main), cell(hyper), sds((depth * main.n_pad, hyper.k_pad), jnp.bfloat16),
            sds((depth, main.rows_per_block, main.n_pad)))
    for save in (True, False):
        allocated.clear()
        f = lambda *a: pair.persistent_pair_forward(*plans, *a, save=save, keep=0.75)
        text = lower_and_compile(f, *args)
        rows.append(dict(fields=fields, save=save, smem=list(allocated), limit=main.smem_limit,
                         counted=pair.smem_bytes(main, hyper, save),
                         stages=[main.stages, hyper.stages],
                         marks=["persistent_pair_forward" in text, "red.release.gpu" in text]))
print(json.dumps(rows))
"""
)


@pytest.mark.gpu_compile
@needs_cuda
def test_the_paired_forward_compiles_for_an_h100_without_a_gpu(tmp_path):
    """The paper's bf16 plans (4 x 16 + 4 x 4 blocks) in one launch, saved and not, the first
    design's fields and the second design's: within the block's shared memory and
    `persistent_pair.smem_bytes` (an upper bound), the main cell's stages its own (the hyper
    cell's 8 in registers lowered to 7), no register spilled."""
    cases = [{}, {"epilogue": "registers"}, {"epilogue": "registers", "sharing": "producer"}]
    rows, reports = compile_deviceless(_COMPILE.format(cases=cases), tmp_path, log_ptxas=False)
    assert len(rows) == 2 * len(cases)
    for row in rows:
        assert all(row["marks"]) and len(row["smem"]) == 1, row
        assert row["smem"][0] <= min(row["counted"], row["limit"]), row
        assert row["counted"] - row["smem"][0] <= 10_240, row
    assert [row["stages"] for row in rows[::2]] == [[3, 4], [5, 7], [5, 7]]
    assert len(reports) == len(rows)
    assert_no_spills(reports)
