"""`rhhjax.ops.persistent_cost`: the plan model the persistent implementation runs. A phase
is PREDICTED as the barrier plus the slowest of GEMM, L2 and shared-memory fill; the plan is
the runnable candidate of the lowest predicted phase time. (The step's PREDICTION table
built on it: tests/test_benchmarks_persistent_prediction.py.)"""

import pytest
from rhhjax.kernels.mosaic import plan as kplan
from rhhjax.kernels.mosaic.plan import PersistentPlan, PlanError

from rhhjax.ops import persistent_cost as pc
from rhhjax.ops.persistent_cost import Rates


def test_prediction_is_barrier_plus_the_slowest_of_gemm_l2_and_fill():
    plan = kplan.paper_plan("bfloat16")
    rates = Rates(barrier_us=1.0, tflops_per_sm=1.0, l2_tbytes=1e9, smem_fill_bytes_per_clk=1e9)
    gemm_us = plan.flops_per_block() / 1e12 * 1e6
    assert pc.predicted_phase_us(plan, rates) == pytest.approx(1.0 + gemm_us)
    l2_bound = Rates(barrier_us=2.0, tflops_per_sm=1e9, l2_tbytes=5.0)
    expected = 2.0 + plan.l2_bytes_per_phase() / 5e12 * 1e6
    assert pc.predicted_phase_us(plan, l2_bound) == pytest.approx(expected)


def test_the_plan_is_the_runnable_candidate_of_the_lowest_predicted_phase_time():
    def cost(plan):
        return pc.predicted_phase_us(plan) + pc.predicted_phase_us(plan, backward=True)

    for dtype in ("bfloat16", "float32"):
        plans = list(pc.candidates(256, 1000, dtype))
        chosen = pc.plan_for(256, 1000, dtype)
        assert chosen in plans
        assert cost(chosen) == min(cost(plan) for plan in plans)
        pc.check_runnable(chosen)
        assert chosen.units_per_block in pc.UNITS and chosen.stages in pc.STAGES


def test_a_plan_no_kernel_can_run_is_one_plan_error_line():
    with pytest.raises(PlanError) as error:
        pc.check_runnable(PersistentPlan(256, 1000, "float32", 132, 1, 64, 4))
    assert "\n" not in str(error.value)
    with pytest.raises(PlanError, match="no persistent plan fits an H100"):
        pc.plan_for(256, 10**6, "bfloat16")
