"""The benchmark's bookkeeping: FLOP counts, row plan, and one timed row."""

import sys
from pathlib import Path

import jax
import pytest

from rhhjax import models

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench  # noqa: E402


def test_flops_per_step_counts_every_matmul_three_times():
    config = bench.model_config("rhn", "paper", "scan", "float32")
    n, e, v, depth = 1000, 27, 50, 7
    per_token = 2 * e * 2 * n + depth * 2 * n * 2 * n + 2 * n * v
    assert bench.flops_per_step(config, 256, 100) == 3 * per_token * 256 * 100
    hyper = bench.model_config("hyperrhn", "paper", "scan", "float32")
    h = 128
    extra = 2 * e * 2 * h + depth * (2 * h * 2 * h + 2 * h * n)
    assert bench.flops_per_step(hyper, 256, 100) == 3 * (per_token + extra) * 256 * 100


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="CPU plan only")
def test_plan_runs_pallas_only_at_small_size_on_cpu():
    rows = bench.plan(["scan", "pallas"], ["rhn"], ["paper", "small"], ["float32"])
    assert ("pallas", "rhn", "paper", "float32") not in rows
    assert ("pallas", "rhn", "small", "float32") in rows
    assert ("scan", "rhn", "paper", "float32") in rows


def test_time_row_reports_consistent_efficiency(monkeypatch):
    monkeypatch.setitem(bench.SIZES, "test", (16, 8, 2, 4, 10))
    row = bench.time_row("fused", "hyperrhn", "test", "float32", repeats=2, rate=1e9)
    assert row.step_ms_min <= row.step_ms_median
    assert row.efficiency == pytest.approx(row.flops_per_step / (row.step_ms_median / 1e3 * 1e9))
    assert row.flops_per_step == bench.flops_per_step(
        bench.model_config("hyperrhn", "test", "fused", "float32"), 4, 10
    )
    assert isinstance(bench.model_config("rhn", "test", "scan", "float32"), models.ModelConfig)
