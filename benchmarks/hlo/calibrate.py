"""The compile report's cost model calibrated on measured GPU step times.

A step's time is a sum of latency terms, each a fitted coefficient (seconds) times a count
read from the deviceless compile (``launch_inventory`` of ``launches``' accounting) and,
for the Pallas Triton kernels the fitted rows ran (a retired backend), their block settings:

* ``launch``: launches per step (in-loop launches x seq_len, plus those outside the loops);
* ``k_chain``: per dependent K-iteration of a Pallas kernel: a program walks K in
  ``block_k`` chunks one after another, so a launch costs ``waves x ceil(K / block_k)``
  chunk latencies, waves at the kernel's full occupancy (below);
* ``sm_k_bytes``: per byte of the ``[block_b, block_k]`` state and ``[block_k, block_n]``
  weight tiles the busiest SM streams through its K loops (``ceil(programs / SMs)`` programs x
  ``ceil(K / block_k)`` chunks x the two tiles' bytes): programs resident on one SM share its
  load and issue bandwidth;
* ``sm_out_bytes``: per byte of the ``[block_b, block_n]`` output tiles of the busiest SM
  (``ceil(programs / SMs)`` tiles: the gates and stores after the K loop);
* ``xla_k_iter``: per K-iteration of an XLA GEMM (cuBLAS / Triton GEMM fusion), with an
  assumed ``XLA_TILE`` output tile and ``block_k`` 64 (bf16) / 32 (f32): the deviceless
  compile does not autotune, so its own tiling is not the one the GPU runs.

Geometry: a Pallas kernel runs ``ceil(M / block_b) x ceil(N / block_n)`` programs (M, N: the
last two dims of its ``[M, N]`` result, K = flops / (2 M N)); waves =
``ceil(programs / (SMs x programs per SM))``, programs per SM limited by threads
(2048 / (32 num_warps)) and shared memory (``num_stages x (block_b + 2 block_n) x block_k x
itemsize``). TF32 is not a feature: an f32 row with ``allow_tf32`` has the counts of the
exact-f32 row with the same blocks.

Choices made by looking at the same 44 H100 rows (so the leave-one-out error does not
account for them; ``CHOICES`` is written to ``results/cost_model_h100.json``): the 128 x 128
XLA tile, and the set of Pallas terms: the 3 of 12 candidate counts (per K-iteration per
warp, per state / weight / both tiles' bytes per wave or per SM, the full-occupancy K chain
with and without warps, pipeline fill (num_stages - 1) in iterations or bytes, exact-f32 FMAs
and all MACs per SM, output bytes per SM) with the lowest worst leave-one-out error, 22%
(2 of the 201 sets of 3 meet 25%; no set of 2 does, best 27%; sets of 4-5 reach 19%). The
previous fit (per K-iteration per warp / state byte / weight byte per wave, at most 2
programs per SM) reached 29%.

The fit is least squares on relative error in plain numpy, coefficients >= 0;
``loo_errors`` refits without each row in turn. ``benchmarks/cost_model.py`` assembles the
measured rows and writes ``results/cost_model_h100.json``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from rhhjax.kernels.hardware import H100

from . import launches as hl

TERMS = ("launch", "k_chain", "sm_k_bytes", "sm_out_bytes", "xla_k_iter")
SMS = H100.sms
# The fitted terms take a block's opt-in shared memory as the SM's (what the rows were fitted
# with; the SM has 1 KiB more).
SMEM_PER_SM = H100.smem_per_block_optin
THREADS_PER_SM = H100.threads_per_sm
XLA_TILE = (128, 128)  # assumed output tile of an XLA GEMM
XLA_BLOCK_K = {"bf16": 64, "f32": 32}
CHOICES = (
    "XLA_TILE 128x128 chosen by sweeping on the same 44 rows (before this fit); the Pallas "
    "terms k_chain, sm_k_bytes, sm_out_bytes chosen on the same rows: the 3 of 12 candidate "
    "counts with the lowest worst leave-one-out error (22%; 2 of 201 three-term sets meet 25%, "
    "no two-term set does: best 27%), so the leave-one-out errors do not account for that "
    "choice; TF32 is not a feature (f32 /tf32 rows share the exact-f32 rows' counts)"
)
DEFAULT_BLOCKS = (64, 32, 32, 4, 3)  # the retired Triton kernels' default b/n/k/warps/stages


# ----------------------------------------------------------------------------- features


def launch_inventory(hlo_text: str, seq_len: int, hidden: int) -> list[dict]:
    """Every launch of a compiled step, grouped: ``{kind, count, m, n, k, dtype}`` with
    ``count`` per step (time-loop launches x seq_len, nested loops x their trips) and kind
    ``pallas`` (Triton custom call), ``gemm`` (XLA GEMM) or ``other``."""
    comps = hl.parse_module(hlo_text)
    loops = hl.classify_loops(hl.find_loops(comps), seq_len, hidden)
    in_loop = [(lc, seq_len) for lp in loops for lc in lp.launches]
    names = {lc.name for lc, _ in in_loop}
    outside = [(lc, 1) for lc in hl.computation_launches(hl.entry_name(comps), comps)]
    groups: dict[tuple, int] = {}
    for lc, times in in_loop + [(lc, t) for lc, t in outside if lc.name not in names]:
        key = _launch_key(lc)
        groups[key] = groups.get(key, 0) + lc.multiplicity * times
    return [
        {"kind": kind, "count": count, "m": m, "n": n, "k": k, "dtype": dtype}
        for (kind, m, n, k, dtype), count in sorted(groups.items())
    ]


def _launch_key(lc: hl.Launch) -> tuple:
    """(kind, M, N, K, input dtype) of a launch; M, N from the last two dims of its first
    rank-2 result (else its first result), K = flops / (2 M N) (a split-K or batch dim
    folds into K)."""
    kind = {"triton": "pallas", "gemm": "gemm"}.get(lc.category, "other")
    if kind == "other" or not lc.flops or not lc.result_dims:
        return ("other", 0, 0, 0, lc.input_dtype)
    dims = next((d for d in lc.result_dims if len(d) == 2), lc.result_dims[0])
    m, n = (dims[-2], dims[-1]) if len(dims) >= 2 else (1, dims[-1])
    return (kind, m, n, max(1, round(lc.flops / (2 * m * n))), lc.input_dtype)


def blocks_per_sm(blocks: tuple[int, ...], itemsize: int) -> int:
    """Programs of a Pallas kernel that run at once on one SM: the thread and shared-memory
    limits (``blocks``: block_b/block_n/block_k/num_warps/num_stages)."""
    bb, bn, bk, warps, stages = blocks[:5]
    smem = stages * (bb + 2 * bn) * bk * itemsize
    return max(1, min(THREADS_PER_SM // (32 * warps), SMEM_PER_SM // max(smem, 1)))


def _waves(m: int, n: int, bb: int, bn: int, per_sm: int) -> int:
    return math.ceil(math.ceil(m / bb) * math.ceil(n / bn) / (SMS * per_sm))


def group_terms(group: dict, blocks: tuple[int, ...] | None) -> dict:
    """The counts of ONE launch of an inventory group, per term."""
    out = dict.fromkeys(TERMS, 0.0)
    out["launch"] = 1.0
    item = 2 if group["dtype"] == "bf16" else 4
    m, n, k = group["m"], group["n"], group["k"]
    if group["kind"] == "pallas":
        bb, bn, bk, _, _ = blocks = blocks or DEFAULT_BLOCKS
        chunks = math.ceil(k / bk)
        per_sm = math.ceil(math.ceil(m / bb) * math.ceil(n / bn) / SMS)  # the busiest SM's
        out["k_chain"] = _waves(m, n, bb, bn, blocks_per_sm(blocks, item)) * chunks
        out["sm_k_bytes"] = per_sm * chunks * (bb + bn) * bk * item
        out["sm_out_bytes"] = per_sm * bb * bn * item
    elif group["kind"] == "gemm":
        (tm, tn), bk = XLA_TILE, XLA_BLOCK_K.get(group["dtype"], 32)
        out["xla_k_iter"] = _waves(m, n, tm, tn, 1) * math.ceil(k / bk)
    return out


def features(inventory: list[dict], blocks: tuple[int, ...] | None = None) -> dict:
    """The counts of one step per term (``blocks``: the Pallas kernel setting
    block_b/block_n/block_k/num_warps/num_stages, None for the defaults)."""
    out = dict.fromkeys(TERMS, 0.0)
    for group in inventory:
        for term, value in group_terms(group, blocks).items():
            out[term] += group["count"] * value
    return out


# ----------------------------------------------------------------------------- fit


def fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares on relative error: min sum ((x c - y) / y)^2, c >= 0
    (active set: a negative coefficient's term is dropped and the rest refitted)."""
    a = x / y[:, None]
    keep = list(range(x.shape[1]))
    while True:
        coef = np.zeros(x.shape[1])
        coef[keep] = np.linalg.lstsq(a[:, keep], np.ones(len(y)), rcond=None)[0]
        negative = [j for j in keep if coef[j] < 0]
        if not negative:
            return coef
        keep.remove(min(negative, key=lambda j: coef[j]))


def loo_errors(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Relative error of each row predicted by the fit to every other row."""
    errors = np.empty(len(y))
    for i in range(len(y)):
        mask = np.arange(len(y)) != i
        errors[i] = (x[i] @ fit(x[mask], y[mask]) - y[i]) / y[i]
    return errors


def dominant_term(coef: dict, feats: dict) -> str:
    """The term with the largest share of the predicted time."""
    return max(TERMS, key=lambda t: coef[t] * feats[t])


def calibrate(rows: list[dict]) -> dict:
    """Coefficients (seconds per count), fitted and leave-one-out errors per row, the
    dominant term of each row. ``rows``: ``{"label", "measured_ms", "features"}``."""
    x = np.array([[r["features"][t] for t in TERMS] for r in rows])
    y = np.array([r["measured_ms"] * 1e-3 for r in rows])
    coef = dict(zip(TERMS, fit(x, y).tolist(), strict=True))
    loo = loo_errors(x, y)
    out = []
    for r, err in zip(rows, loo, strict=True):
        pred = sum(coef[t] * r["features"][t] for t in TERMS)
        share = {t: coef[t] * r["features"][t] / pred for t in TERMS}
        out.append(
            {
                "label": r["label"],
                "measured_ms": r["measured_ms"],
                "fitted_ms": 1e3 * pred,
                "loo_error": float(err),
                "dominant_term": dominant_term(coef, r["features"]),
                "term_shares": share,
            }
        )
    return {"coefficients_s": coef, "rows": out, "max_abs_loo_error": float(np.abs(loo).max())}


def predict_ms(coef: dict, feats: dict) -> float:
    """The calibrated step time of one configuration's features."""
    return 1e3 * sum(coef[t] * feats[t] for t in TERMS)


def load_coefficients(path: str | Path) -> dict:
    """The fitted coefficients the compile report reads (``results/cost_model_h100.json``)."""
    return json.loads(Path(path).read_text())["coefficients_s"]


# ----------------------------------------------------------------------------- measured rows


def config_key(model: str, impl: str, dtype: str, rank: int = 0) -> str:
    """The inventory key of one compiled configuration, e.g. ``hyperrhn r0 pallas bfloat16``."""
    return f"{model}{f' r{rank}' if model == 'hyperrhn' else ''} {impl} {dtype}"


def measured_rows(bench: dict, blocks: dict, inventories: dict) -> list[dict]:
    """The calibration rows: every rank-0 paper-size row of ``benchmarks/bench.py``'s JSON and
    every timed block setting of the retired Triton kernels (``results/kernel_blocks_h100.json``,
    ``{"runs": [...]}``), each with
    its measured median ms and the features of its compiled configuration."""
    rows = []
    for r in bench["rows"]:
        if r.get("size", "paper") != "paper" or r.get("hyper_rank", 0):
            continue
        key = config_key(r["model"], r["impl"], r["dtype"])
        ms, feats = r["step_ms_median"], features(inventories[key])
        rows.append({"label": key, "config": key, "blocks": None, "measured_ms": ms,
                     "features": feats})  # fmt: skip
    for run in blocks["runs"]:
        for r in run["rows"]:
            if "error" in r:
                continue
            setting = tuple(
                r[f] for f in ("block_b", "block_n", "block_k", "num_warps", "num_stages")
            )
            key = config_key(r["model"], "pallas", r["dtype"])
            label = f"{key} {'/'.join(map(str, setting))}" + (
                "/tf32" if r.get("allow_tf32") else ""
            )
            rows.append({"label": label, "config": key, "blocks": list(setting),
                         "measured_ms": r["step_ms_median"],
                         "features": features(inventories[key], setting)})  # fmt: skip
    return rows


def dominant_by_impl(rows: list[dict], coef: dict) -> dict[str, dict]:
    """Per impl (the second word of a row's config): each term's share of the summed
    predicted time of its rows, and the largest."""
    out: dict[str, dict] = {}
    for r in rows:
        impl = r["config"].split()[-2]
        acc = out.setdefault(impl, dict.fromkeys(TERMS, 0.0))
        for t in TERMS:
            acc[t] += coef[t] * r["features"][t]
    result = {}
    for impl, acc in out.items():
        total = sum(acc.values())
        shares = {t: v / total for t, v in acc.items()}
        result[impl] = {"dominant_term": max(shares, key=shares.get), "shares": shares}
    return result
