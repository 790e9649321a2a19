"""The persistent kernels' time prediction (rhhjax/hlo/persistent_cost.py): a phase is the
barrier plus the slowest of GEMM, L2 and shared-memory fill; the command prints a plan and its
prediction and refuses a bad plan with one line."""

import subprocess
import sys

import pytest
from rhhjax.kernels.mosaic import plan as pp

from rhhjax.hlo import persistent_cost as pc


def test_prediction_is_barrier_plus_the_slowest_of_gemm_l2_and_fill():
    plan = pp.paper_plan("bfloat16")
    rates = pc.Rates(barrier_us=1.0, tflops_per_sm=1.0, l2_tbytes=1e9, smem_fill_bytes_per_clk=1e9)
    gemm_us = plan.flops_per_block() / 1e12 * 1e6
    assert pc.predicted_phase_us(plan, rates) == pytest.approx(1.0 + gemm_us)
    l2_bound = pc.Rates(barrier_us=2.0, tflops_per_sm=1e9, l2_tbytes=5.0)
    expected = 2.0 + plan.l2_bytes_per_phase() / 5e12 * 1e6
    assert pc.predicted_phase_us(plan, l2_bound) == pytest.approx(expected)
    step = pc.predicted_step_ms(plan, depth=7, length=100, rates=l2_bound)
    assert step > 700 * pc.predicted_phase_us(plan, l2_bound) / 1e3


def test_command_prints_the_plan_and_refuses_a_bad_one_with_one_line():
    ok = subprocess.run(
        [sys.executable, "-m", "rhhjax.hlo.persistent_cost", "--dtype=bfloat16"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert '"smem_bytes": 217168' in ok.stdout and "PREDICTION" in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "rhhjax.hlo.persistent_cost", "--dtype=float32"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and bad.stderr.startswith("error: persistent plan needs")
