"""`benchmarks/calibrate_persistent.py`'s refit of the plan model's Rates, on synthetic
measurements (the measuring itself needs a GPU, or interpret mode for a smoke run)."""

import dataclasses
import subprocess
import sys

import pytest
from benchmark_scripts import BENCH, load
from rhhjax.kernels.mosaic import interpret as gpu_interpret
from rhhjax.kernels.mosaic.plan import PlanError, paper_plan

from rhhjax.ops.persistent_cost import Rates, plan_for, predicted_phase_us

cal = load("calibrate_persistent")
SCRIPT = BENCH / "calibrate_persistent.py"
PLAN = paper_plan("bfloat16", col_blocks=16, row_blocks=4, k_chunk=64, stages=3)


@pytest.mark.parametrize(("barrier", "tflops", "l2"), [(0.6, 3.0, 6.0), (2.5, 5.5, 9.0)])
def test_refit_recovers_the_rates_of_gemm_bound_synthetic_measurements(barrier, tflops, l2):
    """Measurements made by the model itself at known rates (GEMM-bound phase): the refit
    gives those rates back, and the refitted model predicts the measured phase."""
    truth = dataclasses.replace(Rates(), barrier_us=barrier, tflops_per_sm=tflops, l2_tbytes=l2)
    gemm_us = 1e6 * PLAN.flops_per_block() / (tflops * 1e12)
    l2_us = 1e6 * PLAN.l2_bytes_per_phase() / (l2 * 1e12)
    assert gemm_us > l2_us  # the case this test is about
    measured = {
        "barrier_us": barrier,
        "fwd_phase_us": predicted_phase_us(PLAN, truth),
        "bwd_phase_us": predicted_phase_us(PLAN, truth, backward=True),
        "l2_tbytes": l2,
    }
    new = cal.refit(PLAN, measured)
    assert new.barrier_us == barrier and new.l2_tbytes == l2
    assert new.tflops_per_sm == pytest.approx(tflops, rel=1e-9)
    assert predicted_phase_us(PLAN, new) == pytest.approx(measured["fwd_phase_us"], rel=1e-9)


def test_an_l2_bound_phase_keeps_the_gemm_rate():
    """A phase no slower than the measured L2 term says nothing about the GEMM rate."""
    l2 = 1.0
    l2_us = 1e6 * PLAN.l2_bytes_per_phase() / (l2 * 1e12)
    measured = {"barrier_us": 1.0, "fwd_phase_us": 1.0 + l2_us, "l2_tbytes": l2}
    new = cal.refit(PLAN, measured)
    assert new.tflops_per_sm == Rates().tflops_per_sm and new.l2_tbytes == l2


def test_a_phase_faster_than_the_measured_l2_rate_allows_refits_the_l2_rate_to_the_phase():
    """The kernel's own L2 reads outran the reduction's (on an H100: a 7.8 us forward phase
    whose bytes take 17 us at the reduction's 1.48 TB/s): the refitted model predicts the
    measured phase, at the rate the phase reached, and keeps the GEMM rate."""
    l2 = 1.0
    l2_us = 1e6 * PLAN.l2_bytes_per_phase() / (l2 * 1e12)
    measured = {"barrier_us": 1.0, "fwd_phase_us": 1.0 + l2_us / 3, "l2_tbytes": l2}
    new = cal.refit(PLAN, measured)
    assert new.l2_tbytes == pytest.approx(3 * l2, rel=1e-9)
    assert new.tflops_per_sm == Rates().tflops_per_sm
    assert predicted_phase_us(PLAN, new) == pytest.approx(measured["fwd_phase_us"], rel=1e-9)


@pytest.mark.parametrize("missing", ["barrier_us", "fwd_phase_us", "l2_tbytes"])
def test_a_missing_measurement_is_one_value_error_line(missing):
    measured = {"barrier_us": 1.0, "fwd_phase_us": 5.0, "l2_tbytes": 5.0}
    measured[missing] = 0.0
    with pytest.raises(ValueError, match=f"needs a positive {missing}"):
        cal.refit(PLAN, measured)


@pytest.mark.skipif(
    gpu_interpret.unavailable() is not None, reason=str(gpu_interpret.unavailable())
)
@pytest.mark.parametrize("layout", ["grid", "rowgroup"])
def test_the_calibration_kernels_run_interpreted_at_a_tiny_shape(tmp_path, layout):
    """The barrier kernel and both persistent kernels of the calibration run in GPU interpret
    mode (race detector on) at a one-block plan, in both layouts; interpreted times refit
    nothing."""
    argv = ["--interpret", "--reps", "1", "--layout", layout, "--out", str(tmp_path / "c.json")]
    out = cal.main(argv)
    measured = out["measured"]
    assert measured["layout"] == layout
    assert measured["interpret"] and measured["plan"]["row_blocks"] == 1
    for key in ("barrier_us", "fwd_phase_us", "bwd_phase_us", "l2_tbytes"):
        assert key in measured
    assert "rates_refitted" not in out


def test_the_plan_at_other_stages_or_k_chunks_is_checked_in_both_kernels():
    """``--stages`` / ``--k-chunk``: the chosen plan at 2 stages (the main GEMM's beside the
    hyper cell inside, bf16), or at 6 stages of 32 (the shared memory of 3 x 64), is the same
    plan but for its pipeline; 4 stages of 64 do not fit a bf16 block's shared memory, and
    a chunk that does not divide K is refused: one PlanError line each."""
    chosen = plan_for(256, 1000, "bfloat16")
    assert cal.replanned(chosen, 2) == dataclasses.replace(chosen, stages=2)
    assert cal.replanned(chosen, 6, 32) == dataclasses.replace(chosen, stages=6, k_chunk=32)
    assert cal.replanned(chosen) == chosen
    for stages, k_chunk, message in [(4, 0, "shared memory"), (0, 48, "k_chunk")]:
        with pytest.raises(PlanError, match=message) as error:
            cal.replanned(chosen, stages, k_chunk)
        assert "\n" not in str(error.value)


def test_stages_that_do_not_fit_end_the_command_with_one_error_line_before_any_kernel(tmp_path):
    out = tmp_path / "c.json"
    command = [sys.executable, str(SCRIPT), "--stages", "4", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout == "" and not out.exists()
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    assert "shared memory" in done.stderr
