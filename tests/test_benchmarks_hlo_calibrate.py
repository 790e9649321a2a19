"""The calibrated cost model (benchmarks/hlo/calibrate.py): the geometry of a launch, the
non-negative fit, leave-one-out, and the committed H100 calibration refitted from its rows."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from benchmark_scripts import load
from hlo_cases import HIDDEN, HLO, SEQ

hc = load("hlo.calibrate")
hlo_cost = load("hlo.cost")


RESULTS = Path(__file__).resolve().parents[1] / "results"


def test_pallas_launch_counts_k_chain_per_sm_bytes_and_occupancy():
    group = {"kind": "pallas", "count": 1, "m": 256, "n": 1024, "k": 2048, "dtype": "bf16"}
    terms = hc.group_terms(group, (64, 32, 32, 4, 3))
    # 4 x 32 = 128 programs on 132 SMs: one per SM, one wave of 2048 / 32 = 64 K-chunks
    assert terms["k_chain"] == 64
    assert terms["sm_k_bytes"] == 64 * (64 * 32 + 32 * 32) * 2
    assert terms["sm_out_bytes"] == 64 * 32 * 2 and terms["launch"] == 1
    # 16-row blocks: 16 x 32 = 512 programs, the busiest SM runs 4 of them (their tiles add
    # up) but 7 fit at once (shared memory), so one wave of 32 K-chunks
    terms = hc.group_terms(group, (16, 32, 64, 4, 3))
    assert hc.blocks_per_sm((16, 32, 64, 4, 3), 2) == 232448 // (3 * (16 + 64) * 64 * 2) == 7
    assert terms["k_chain"] == 32
    assert terms["sm_k_bytes"] == 4 * 32 * (16 * 64 + 64 * 32) * 2
    assert terms["sm_out_bytes"] == 4 * 16 * 32 * 2
    # 16 warps: 4 resident per SM by threads; 16 x 64 = 1024 programs: 2 waves of the chain
    assert hc.blocks_per_sm((16, 16, 64, 16, 3), 2) == 4
    assert hc.group_terms(group, (16, 16, 64, 16, 3))["k_chain"] == 2 * 32
    # shared memory binds: 3 stages x (128 + 2 x 64) x 64 x 2 bytes = 96 KiB: 2 per SM
    assert hc.blocks_per_sm((128, 64, 64, 8, 3), 2) == 2
    # an XLA GEMM: 128 x 128 tiles (2 x 8 = 16, one wave), K in 64-chunks for bf16
    gemm = dict(group, kind="gemm")
    assert hc.group_terms(gemm, None)["xla_k_iter"] == math.ceil(2048 / 64)
    assert hc.group_terms(dict(group, kind="other"), None)["xla_k_iter"] == 0


def test_inventory_counts_every_launch_of_the_step():
    inventory = hc.launch_inventory(HLO, SEQ, HIDDEN)
    summary = hlo_cost.summarize(HLO, SEQ, HIDDEN)
    total = sum(g["count"] for g in inventory)
    assert total == summary["launches_per_step"] * SEQ + summary["launches_outside_loops"]
    assert hc.features(inventory)["launch"] == total


def test_fit_recovers_exact_coefficients_and_keeps_them_non_negative():
    rng = np.random.default_rng(0)
    x = rng.uniform(1, 10, size=(12, 3))
    truth = np.array([2.0, 0.5, 0.0])
    y = x @ truth
    np.testing.assert_allclose(hc.fit(x, y), truth, atol=1e-9)
    np.testing.assert_allclose(hc.loo_errors(x, y), 0.0, atol=1e-9)
    # a term that would need a negative coefficient is dropped, not fitted negative
    y2 = x[:, 0] * 3.0 - 0.01 * x[:, 1] + 1.0
    assert (hc.fit(x, y2) >= 0).all()


def _committed():
    cal = json.loads((RESULTS / "cost_model_h100.json").read_text())
    inventories = json.loads((RESULTS / "cost_model_features_h100.json").read_text())
    bench = json.loads((RESULTS / "bench_gpu_h100.json").read_text())
    blocks = json.loads((RESULTS / "kernel_blocks_h100.json").read_text())
    rows = hc.measured_rows(bench, blocks, inventories["inventories"])
    return cal, rows


def test_refit_from_the_measured_rows_reproduces_the_committed_calibration():
    cal, rows = _committed()
    assert len(rows) == 44  # 12 benchmark rows + 32 timed block settings
    refit = hc.calibrate(rows)
    for term in hc.TERMS:
        assert refit["coefficients_s"][term] == pytest.approx(cal["coefficients_s"][term], 1e-9)
    assert [r["label"] for r in refit["rows"]] == [r["label"] for r in cal["rows"]]
    for new, old in zip(refit["rows"], cal["rows"], strict=True):
        assert new["loo_error"] == pytest.approx(old["loo_error"], abs=1e-9)
    assert cal["choices"] == hc.CHOICES  # the choices made on these rows are disclosed
    # the calibration is a real improvement on the stated model, row by row on average
    before = np.abs([r["before_error"] for r in cal["rows"]])
    after = np.abs([r["loo_error"] for r in refit["rows"]])
    assert after.mean() < 0.5 * before.mean() and after.max() < before.max()
    assert after.max() < 0.25


def test_leave_one_out_error_is_within_25_percent_on_every_row():
    _, rows = _committed()
    assert all(abs(r["loo_error"]) <= 0.25 for r in hc.calibrate(rows)["rows"])
