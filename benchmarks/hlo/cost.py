"""The compile report's stated cost model and the per-module summary it predicts from.

``summarize`` turns one optimised HLO module (``compiled.as_text()`` of the training step
compiled for an H100) into the report's figures: launches per time step split by loop part
and role, data-movement launches, bytes per step and a predicted step time from
``CostModel`` (every rate an assumption).
Pure Python (no JAX import).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable

from rhhjax.kernels.hardware import H100

from .launches import (
    Launch,
    Loop,
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
    precision); everything else at ``f32_simt_flops``."""

    bf16_matmul_flops: float = 989e12  # H100 SXM dense bf16 tensor core (datasheet)
    f32_matmul_flops: float = 494.7e12  # TF32 tensor core: XLA's default f32 dot precision
    f32_simt_flops: float = round(_SIMT_FLOPS, -11)  # 66.9e12: the CUDA cores' FMA rate
    hbm_bytes_per_s: float = round(H100.hbm_bytes_per_s, -10)  # 3.35e12
    launch_s: float = 4e-6  # fixed cost per launch (launch latency + tail)

    def rate(self, launch: Launch) -> float:
        if launch.input_dtype in ("bf16", "f16"):
            return self.bf16_matmul_flops
        if launch.category == "gemm":
            return self.f32_matmul_flops
        return self.f32_simt_flops

    def seconds(self, launch: Launch) -> float:
        compute = launch.flops / self.rate(launch) if launch.flops else 0.0
        return max(compute, launch.bytes / self.hbm_bytes_per_s) + self.launch_s


# The cost model's assumptions, as the report's JSON states them (meta.assumptions).
ASSUMPTIONS = {
    "cost_model": "per launch max(flops / rate, bytes / hbm_bandwidth) + launch_s; "
    "in-loop launches x seq_len + out-of-loop launches; no overlap between launches, "
    "every byte from HBM (none from L2), peak datasheet rates",
    "flops": "dots / cuBLAS gemms: 2*M*N*K from HLO shapes; other custom calls (Mosaic GPU "
    "kernels): 0; elementwise work: 0 FLOPs (bandwidth bound)",
    "rates": "launches with bf16/f16 matmul inputs at bf16_matmul_flops; f32 XLA gemms at "
    "f32_matmul_flops (TF32, XLA's default f32 dot precision); other launches at "
    "f32_simt_flops",
}


def predict_seconds(launches: Iterable[Launch], model: CostModel) -> float:
    return sum(model.seconds(lc) * lc.multiplicity for lc in launches)


def _bytes(launches: Iterable[Launch], read: bool = False) -> int:
    """Bytes of ``launches`` per execution, by the old rule or (``read``) the corrected one."""
    return sum((lc.bytes_read if read else lc.bytes) * lc.multiplicity for lc in launches)


def _merged(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    """The sum of several ``{kind: count}``, sorted by kind."""
    total: collections.Counter = collections.Counter()
    for c in counts:
        total.update(c)
    return dict(sorted(total.items()))


def loop_row(lp: Loop, hidden: int, model: CostModel) -> dict:
    """One time loop's figures per time step (JSON-ready)."""
    return {
        "name": lp.name,
        "part": lp.part,
        "role": lp.role,
        "launches_per_step": per_step(lp.launches),
        "cond_launches": lp.cond_launches,
        "categories": category_counts(lp.launches),
        "movement": movement_counts(lp.launches),
        "launches_with_op": watched_op_counts(lp.launches),
        "weight_sized_ops": weight_op_counts(lp.launches, hidden),
        "bytes_per_step": _bytes(lp.launches),
        "bytes_per_step_read": _bytes(lp.launches, read=True),
        "flops_per_step": sum(lc.flops * lc.multiplicity for lc in lp.launches),
        "predicted_us_per_step": predict_seconds(lp.launches, model) * 1e6,
        "movement_launches": [
            {"name": lc.name, "kind": movement_kind(lc), "bytes": lc.bytes}
            for lc in lp.launches
            if movement_kind(lc)
        ],
    }


def summarize(text: str, seq_len: int, hidden: int, model: CostModel | None = None) -> dict:
    """Everything the report needs from one optimised HLO module (JSON-ready; its fields are
    defined in ``DEFINITIONS``)."""
    model = model or CostModel()
    comps = parse_module(text)
    loops = find_loops(comps)
    time_loops = classify_loops(loops, seq_len, hidden)
    # the entry's launches expand the time loops' bodies x trips: those are left out here
    in_loop = {lc.name for lp in time_loops for lc in lp.launches}
    outside = [
        lc for lc in computation_launches(entry_name(comps), comps) if lc.name not in in_loop
    ]
    rows = [loop_row(lp, hidden, model) for lp in time_loops]
    in_loop_seconds = sum(predict_seconds(lp.launches, model) for lp in time_loops)
    outside_seconds = predict_seconds(outside, model)
    in_loop_bytes = sum(r["bytes_per_step"] for r in rows)
    in_loop_bytes_read = sum(r["bytes_per_step_read"] for r in rows)
    return {
        "time_loops": rows,
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
        "launches_per_step": sum(r["launches_per_step"] for r in rows),
        "launches_split": _merged(
            {f"{r['part']}_{r['role']}": r["launches_per_step"]} for r in rows
        ),
        "movement_per_step": _merged(r["movement"] for r in rows),
        "launches_with_op_per_step": _merged(r["launches_with_op"] for r in rows),
        "weight_sized_ops_per_step": _merged(r["weight_sized_ops"] for r in rows),
        "bytes_per_step": in_loop_bytes,
        "bytes_per_step_read": in_loop_bytes_read,
        "launches_outside_loops": per_step(outside),
        "bytes_outside_loops": _bytes(outside),
        "bytes_outside_loops_read": _bytes(outside, read=True),
        "bytes_per_train_step": in_loop_bytes * seq_len + _bytes(outside),
        "bytes_per_train_step_read": in_loop_bytes_read * seq_len + _bytes(outside, read=True),
        "largest_launches": largest_launches(time_loops, outside, seq_len),
        "predicted_step_ms": (in_loop_seconds * seq_len + outside_seconds) * 1e3,
        "predicted_in_loop_ms": in_loop_seconds * seq_len * 1e3,
        "predicted_outside_ms": outside_seconds * 1e3,
    }


# The summary's fields, as the report's JSON defines them (meta.definitions).
DEFINITIONS = {
    "launches_per_step": "GPU-work instructions (fusions, custom calls incl. cuBLAS and "
    "Mosaic GPU, copies, ...; not parameter/tuple/get-tuple-element/bitcast/constant) in the "
    "bodies of the while loops whose trip count is seq_len, summed over those loops",
    "launches_split": "per loop part_role: part = main if the loop carries an array with two "
    "dims >= hidden (the main W), else hyper (the scan HyperRHN runs both cells in one main "
    "loop); role = forward for the first loop of a part in schedule order, backward after",
    "movement_per_step": "in-loop launches that only move or reformat data (pad, convert, "
    "copy, transpose, slice, concatenate, broadcast; fusions of only those ops and "
    "indexing ops count as their most specific kind; store = a slice written into a loop "
    "buffer with dynamic-update-slice, e.g. stacked residuals)",
    "launches_with_op_per_step": "in-loop launches that contain a pad / convert / copy / "
    "transpose op (fused with other work or alone)",
    "weight_sized_ops_per_step": "of those, the launches that write a weight-sized array (an "
    "array with two dims >= hidden: W [n, 2n] or a padded / cast copy of it)",
    "bytes_per_step": "sum over in-loop launches of operand + result bytes from HLO shapes; "
    "a fused dynamic-slice / slice of an operand counts as the slice, a fused "
    "dynamic-update-slice as the update; a buffer passed twice counts once (the old rule, "
    "unchanged: an operand whose first fused use is not a slice counts whole, e.g. one read "
    "through a reshape and then a slice)",
    "bytes_per_step_read": "bytes_per_step under the corrected rule (launches.read_fraction): "
    "a fused operand counts the fraction of its elements the fusion reads, followed through "
    "index-only ops (bitcast, reshape, transpose, copy, pad, reverse) and converts (fraction "
    "unchanged) to "
    "slices and dynamic-slices, strided or not (each keeps its share, elements out / "
    "elements in); any other use reads it whole; an unfused slice counts its result read "
    "and written; custom calls (Mosaic GPU kernels) still count whole operands",
    "bytes_outside_loops": "operand + result bytes (old rule) of the launches outside the "
    "time loops, once per training step (for impl=persistent: everything, kernels included)",
    "bytes_outside_loops_read": "the same under the corrected rule",
    "bytes_per_train_step": "bytes_per_step x seq_len + bytes_outside_loops (old rule): HLO "
    "bytes of one training step; the table's 'GB/train step' is old/corrected",
    "bytes_per_train_step_read": "bytes_per_step_read x seq_len + bytes_outside_loops_read",
    "largest_launches": "the 16 launches of a training step with the most bytes (old rule, in-"
    "loop ones x multiplicity x seq_len), each with bytes (old rule) and bytes_read "
    "(corrected), largest first",
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
