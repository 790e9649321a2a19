"""The compile report's stated cost model and the per-module summary it predicts from.

``summarize`` turns one optimised HLO module (``compiled.as_text()`` of the training step
compiled for an H100) into the report's figures: launches per time step split by loop part
and role, data-movement launches, bytes per step and a predicted step time from
``CostModel`` (every rate an assumption).
Pure Python (no JAX import).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable

from rhhjax.kernels.hardware import H100

from .launches import (
    Launch,
    category_counts,
    classify_loops,
    computation_launches,
    entry_name,
    find_loops,
    movement_counts,
    movement_kind,
    parse_module,
    per_step,
    watched_op_counts,
    weight_op_counts,
)

# SMs x f32 lanes per SM x 2 (an FMA) x clock: the H100's CUDA-core f32 rate, flop/s.
_SIMT_FLOPS = H100.sms * H100.fpus_per_sm * 2 * H100.clock_ghz * 1e9


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Per launch: ``max(flops / rate, bytes / bandwidth) + launch_s``. All assumptions.

    Rates: launches with bf16 / f16 matmul inputs at ``bf16_matmul_flops``; f32 XLA gemms
    (cuBLAS / Triton gemm fusions) at ``f32_matmul_flops`` (TF32: XLA's default f32 dot
    precision); f32 kernels of the retired Pallas Triton backend (custom calls of dated HLO)
    at ``f32_pallas_flops`` (their exact f32 dots: FMA loops on the CUDA cores); everything
    else at ``f32_simt_flops``."""

    bf16_matmul_flops: float = 989e12  # H100 SXM dense bf16 tensor core (datasheet)
    f32_matmul_flops: float = 494.7e12  # TF32 tensor core: XLA's default f32 dot precision
    f32_simt_flops: float = round(_SIMT_FLOPS, -11)  # 66.9e12: the CUDA cores' FMA rate
    f32_pallas_flops: float = round(_SIMT_FLOPS, -11)  # exact-f32 Pallas dots: CUDA cores
    hbm_bytes_per_s: float = round(H100.hbm_bytes_per_s, -10)  # 3.35e12
    launch_s: float = 4e-6  # fixed cost per launch (launch latency + tail)

    def rate(self, launch: Launch) -> float:
        if launch.input_dtype in ("bf16", "f16"):
            return self.bf16_matmul_flops
        if launch.category == "gemm":
            return self.f32_matmul_flops
        if launch.category == "triton":
            return self.f32_pallas_flops
        return self.f32_simt_flops

    def seconds(self, launch: Launch) -> float:
        compute = launch.flops / self.rate(launch) if launch.flops else 0.0
        return max(compute, launch.bytes / self.hbm_bytes_per_s) + self.launch_s


def predict_seconds(launches: Iterable[Launch], model: CostModel) -> float:
    return sum(model.seconds(lc) * lc.multiplicity for lc in launches)


def summarize(text: str, seq_len: int, hidden: int, model: CostModel | None = None) -> dict:
    """Everything the report needs from one optimised HLO module (JSON-ready)."""
    model = model or CostModel()
    comps = parse_module(text)
    entry = entry_name(comps)
    loops = find_loops(comps)
    time_loops = classify_loops(loops, seq_len, hidden)
    time_bodies = {lp.body for lp in time_loops}
    # out-of-loop launches: the entry's own launches (and calls), time loops excluded
    outside = []
    for lc in computation_launches(entry, comps):
        outside.append(lc)
    in_loop_names = set()
    for lp in time_loops:
        in_loop_names.update(lc.name for lc in lp.launches)
    # computation_launches(entry) already expanded time-loop bodies x trips: remove them
    outside = [lc for lc in outside if lc.name not in in_loop_names]
    loops_out = []
    split: dict[str, int] = {}
    moves: dict[str, int] = {}
    with_ops: dict[str, int] = {}
    weight_ops: dict[str, int] = {}
    in_loop_bytes = 0
    in_loop_bytes_read = 0
    in_loop_seconds = 0.0
    for lp in time_loops:
        key = f"{lp.part}_{lp.role}"
        n = per_step(lp.launches)
        split[key] = split.get(key, 0) + n
        for k, v in movement_counts(lp.launches).items():
            moves[k] = moves.get(k, 0) + v
        for k, v in watched_op_counts(lp.launches).items():
            with_ops[k] = with_ops.get(k, 0) + v
        for k, v in weight_op_counts(lp.launches, hidden).items():
            weight_ops[k] = weight_ops.get(k, 0) + v
        b = sum(lc.bytes * lc.multiplicity for lc in lp.launches)
        b_read = sum(lc.bytes_read * lc.multiplicity for lc in lp.launches)
        in_loop_bytes += b
        in_loop_bytes_read += b_read
        secs = predict_seconds(lp.launches, model)
        in_loop_seconds += secs
        loops_out.append(
            {
                "name": lp.name,
                "part": lp.part,
                "role": lp.role,
                "launches_per_step": n,
                "cond_launches": lp.cond_launches,
                "categories": category_counts(lp.launches),
                "movement": movement_counts(lp.launches),
                "launches_with_op": watched_op_counts(lp.launches),
                "weight_sized_ops": weight_op_counts(lp.launches, hidden),
                "bytes_per_step": b,
                "bytes_per_step_read": b_read,
                "flops_per_step": sum(lc.flops * lc.multiplicity for lc in lp.launches),
                "predicted_us_per_step": secs * 1e6,
                "movement_launches": [
                    {"name": lc.name, "kind": movement_kind(lc), "bytes": lc.bytes}
                    for lc in lp.launches
                    if movement_kind(lc)
                ],
            }
        )
    del time_bodies
    outside_seconds = predict_seconds(outside, model)
    return {
        "time_loops": loops_out,
        "other_loops": [
            {
                "name": lp.name,
                "in": lp.computation,
                "trips": lp.trips,
                "launches_per_iter": per_step(lp.launches),
            }
            for lp in loops
            if lp not in time_loops
        ],
        "launches_per_step": sum(split.values()),
        "launches_split": dict(sorted(split.items())),
        "movement_per_step": dict(sorted(moves.items())),
        "launches_with_op_per_step": dict(sorted(with_ops.items())),
        "weight_sized_ops_per_step": dict(sorted(weight_ops.items())),
        "bytes_per_step": in_loop_bytes,
        "bytes_per_step_read": in_loop_bytes_read,
        "launches_outside_loops": per_step(outside),
        "bytes_outside_loops": sum(lc.bytes * lc.multiplicity for lc in outside),
        "bytes_outside_loops_read": sum(lc.bytes_read * lc.multiplicity for lc in outside),
        "bytes_per_train_step": in_loop_bytes * seq_len
        + sum(lc.bytes * lc.multiplicity for lc in outside),
        "bytes_per_train_step_read": in_loop_bytes_read * seq_len
        + sum(lc.bytes_read * lc.multiplicity for lc in outside),
        "largest_launches": largest_launches(time_loops, outside, seq_len),
        "predicted_step_ms": (in_loop_seconds * seq_len + outside_seconds) * 1e3,
        "predicted_in_loop_ms": in_loop_seconds * seq_len * 1e3,
        "predicted_outside_ms": outside_seconds * 1e3,
    }


def largest_launches(time_loops, outside: list[Launch], seq_len: int, count: int = 16) -> list:
    """The ``count`` launches of the training step that move the most bytes (old rule, per
    training step: an in-loop launch times its multiplicity and ``seq_len``), each with both
    byte figures: ``{name, kind, where, per_step, bytes, bytes_read}``, largest first."""
    rows = [(lc, lp.name, lc.multiplicity * seq_len) for lp in time_loops for lc in lp.launches]
    rows += [(lc, "outside", lc.multiplicity) for lc in outside]
    rows.sort(key=lambda r: -r[0].bytes * r[2])
    return [
        {
            "name": lc.name,
            "kind": lc.category if lc.category != "fusion" else lc.kind,
            "where": where,
            "per_step": times,
            "bytes": lc.bytes * times,
            "bytes_read": lc.bytes_read * times,
        }
        for lc, where, times in rows[:count]
    ]


def dumps(obj) -> str:
    return json.dumps(obj, indent=2, sort_keys=True)
