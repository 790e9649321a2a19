"""`rhhjax.ops.persistent_plans`: the plans both kernels accept and the rule that picks the one
a [batch, width] cell runs: the most row blocks, then the fewest blocks at or above MIN_BLOCKS."""

import pytest
from rhhjax.kernels.hardware import H100
from rhhjax.kernels.mosaic import rowgroup_layout
from rhhjax.kernels.mosaic.plan import PersistentPlan, PlanError

from rhhjax.ops import persistent_plans as pp


def _shape(plan):
    return plan.row_blocks, plan.col_blocks, plan.units_per_block, plan.k_chunk, plan.stages


# (batch, width, dtype, layout) -> (row blocks, column blocks, units, K chunk, stages) of the
# plans the GPU runs of 2026-11-26..28 (H100, H200) ran: the paper's main cell (1000) and
# hyper cell (128) at batch 256.
MEASURED = {
    (256, 1000, "bfloat16", "rowgroup"): (4, 16, 64, 64, 3),
    (256, 1000, "bfloat16", "grid"): (4, 16, 64, 64, 3),
    (256, 1000, "float32", "rowgroup"): (4, 16, 64, 32, 2),
    (256, 1000, "float32", "grid"): (4, 32, 32, 64, 4),
    (256, 128, "bfloat16", "rowgroup"): (4, 4, 32, 64, 4),
    (256, 128, "float32", "grid"): (4, 4, 32, 64, 4),
}


@pytest.mark.parametrize("shape", list(MEASURED), ids=lambda s: "-".join(map(str, s)))
def test_the_paper_cells_run_the_plans_the_gpu_measured(shape):
    assert _shape(pp.plan_for(*shape)) == MEASURED[shape]


@pytest.mark.parametrize(
    ("batch", "width"), [(256, 1000), (256, 128), (5, 13), (3, 70), (64, 8), (512, 64)]
)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("layout", rowgroup_layout.LAYOUTS)
def test_the_plan_is_the_runnable_candidate_the_rule_names(batch, width, dtype, layout):
    """Both kernels accept it; of the candidates of the most row blocks it has the fewest
    blocks at or above MIN_BLOCKS, or where none reaches it the most."""
    plan = pp.plan_for(batch, width, dtype, layout)
    pp.check_runnable(plan)
    rowgroup_layout.check(plan, layout, None)
    assert plan.n_pad >= width and plan.b_pad - batch < 64 and plan.grid <= 2 * H100.sms
    others = list(pp.candidates(batch, width, dtype, layout))
    assert plan in others and plan.row_blocks == max(p.row_blocks for p in others)
    same_rows = [p.grid for p in others if p.row_blocks == plan.row_blocks]
    enough = [grid for grid in same_rows if grid >= pp.MIN_BLOCKS]
    assert plan.grid == (min(enough) if enough else max(same_rows))


def test_a_plan_no_kernel_can_run_is_one_plan_error_line():
    with pytest.raises(PlanError) as error:
        pp.check_runnable(PersistentPlan(256, 1000, "float32", 132, 1, 64, 4))
    assert "\n" not in str(error.value)
    with pytest.raises(PlanError, match="no persistent plan fits an H100") as error:
        pp.plan_for(256, 10**6, "bfloat16")
    assert "\n" not in str(error.value) and "a smaller batch or width" in str(error.value)
