"""The compile report's stated cost model and summary (benchmarks/hlo/cost.py)."""

from __future__ import annotations

import pytest
from benchmark_scripts import load
from hlo_cases import HIDDEN, HLO, SEQ

hlo_cost = load("hlo.cost")
hl = load("hlo.launches")


def _loops(comps):
    return {lp.name: lp for lp in hl.classify_loops(hl.find_loops(comps), SEQ, HIDDEN)}


def test_summarize_splits_counts_and_predicts_time():
    model = hlo_cost.CostModel(launch_s=1e-6, hbm_bytes_per_s=1e9, f32_matmul_flops=1e12)
    s = hlo_cost.summarize(HLO, SEQ, HIDDEN, model)
    assert s["launches_split"] == {"hyper_forward": 2, "main_backward": 5, "main_forward": 11}
    assert s["launches_per_step"] == 18
    assert s["movement_per_step"] == {"convert": 1, "copy": 1, "pad": 1, "slice": 1, "store": 2}
    assert s["weight_sized_ops_per_step"] == {"convert": 1, "pad": 1}
    # outside the time loops: the entry's broadcasts (3), the 5-trip loop's counter x 5,
    # the final fusion
    assert s["launches_outside_loops"] == 3 + 5 + 1
    # the other loops: the 5-trip one and the layer loop nested in the forward time loop
    others = {lp["name"]: (lp["in"], lp["trips"]) for lp in s["other_loops"]}
    assert others == {"while.layers": ("main_fwd_body", 2), "while.plain": ("main", 5)}
    loops = _loops(hl.parse_module(HLO))
    in_loop = sum(
        model.seconds(lc) * lc.multiplicity for lp in loops.values() for lc in lp.launches
    )
    assert s["predicted_in_loop_ms"] == pytest.approx(in_loop * SEQ * 1e3)
    assert s["predicted_step_ms"] == pytest.approx(
        s["predicted_in_loop_ms"] + s["predicted_outside_ms"]
    )
    # each launch costs at least the launch overhead
    assert s["predicted_in_loop_ms"] >= 18 * SEQ * 1e-6 * 1e3


def test_cost_model_takes_the_max_of_compute_and_bandwidth():
    model = hlo_cost.CostModel(bf16_matmul_flops=1e12, hbm_bytes_per_s=1e9, launch_s=2e-6)
    compute_bound = hl.Launch(
        "a", "fusion", "triton_gemm", bytes=1000, flops=10**9, dtype="f32", input_dtype="bf16"
    )
    memory_bound = hl.Launch("b", "fusion", "kLoop", bytes=10**6, flops=0, dtype="f32")
    assert model.seconds(compute_bound) == pytest.approx(1e-3 + 2e-6)
    assert model.seconds(memory_bound) == pytest.approx(1e-3 + 2e-6)


def test_cost_model_rates_by_matmul_input_dtype_and_kind():
    model = hlo_cost.CostModel(bf16_matmul_flops=4.0, f32_matmul_flops=3.0, f32_simt_flops=1.0)

    def launch(kind, input_dtype):
        return hl.Launch("x", "custom-call", kind, 0, 1, "f32", input_dtype=input_dtype)

    assert model.rate(launch("mosaic_gpu", "bf16")) == 4.0  # f32 out, bf16 in
    assert model.rate(launch("__cublas$gemm", "f32")) == 3.0
    assert model.rate(launch("mosaic_gpu", "f32")) == 1.0
    assert model.rate(launch("kLoop", "f32")) == 1.0


def test_summarize_reports_the_step_bytes_under_both_rules():
    s = hlo_cost.summarize(HLO, SEQ, HIDDEN)
    outside, in_loop = s["bytes_outside_loops"], s["bytes_per_step"]
    assert s["bytes_per_train_step"] == in_loop * SEQ + outside
    assert s["bytes_per_train_step_read"] == (
        s["bytes_per_step_read"] * SEQ + s["bytes_outside_loops_read"]
    )
    # the fixture's one unfused slice (in the backward loop) reads its slice only
    assert s["bytes_per_step_read"] < in_loop
    assert s["bytes_outside_loops_read"] <= outside
    items = s["largest_launches"]
    sizes = [i["bytes"] for i in items]
    assert sizes and sizes == sorted(sizes, reverse=True)
    assert all(i["bytes_read"] <= i["bytes"] for i in items)
    loops = {lp["name"]: lp for lp in s["time_loops"]}
    assert loops["while.bwd"]["bytes_per_step_read"] < loops["while.bwd"]["bytes_per_step"]
