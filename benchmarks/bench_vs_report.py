"""Measured GPU step times beside the compile report's predictions.

    python benchmarks/bench_vs_report.py results/bench_gpu_h100.json \\
        --report=results/gpu_report_h100.json

The bench JSON comes from ``benchmarks/bench.py`` run on a GPU (paper size); the report from
``benchmarks/gpu_report.py`` (compiled for an H100 on a CPU host, with a stated cost model).
Prints a markdown table: measured median step, predicted step, measured / predicted, and the
speed-up of each impl over ``scan`` and of each kernel impl (``mosaic``, ``persistent``) over
``fused`` in the same run.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

KERNEL_IMPLS = ("mosaic", "persistent")  # each compared with `fused` in the same run


def predicted_ms(report: dict) -> dict[tuple[str, str, str], float]:
    """(model, impl, dtype) -> predicted step ms, for the paper-size rank-0 rows."""
    out = {}
    for row in report["rows"]:
        if row.get("status") == "ok" and not row.get("hyper_rank"):
            out[(row["model"], row["impl"], row["dtype"])] = row["predicted_step_ms"]
    return out


def measured_ms(bench: dict) -> dict[tuple[str, str, str], float]:
    """(model, impl, dtype) -> measured median step ms, for the paper-size rank-0 rows with
    XLA's default command buffers."""
    return {
        (r["model"], r["impl"], r["dtype"]): r["step_ms_median"]
        for r in bench["rows"]
        if r["size"] == "paper"
        and not r.get("hyper_rank")
        and r.get("command_buffer", "default") == "default"
    }


def instrument_tables(bench: dict) -> str:
    """The GEMM-loop rates, phase latencies, rank-d rows and command-buffer rows, as lists."""
    lines = []
    for g in bench.get("gemm_rows", []):
        lines.append(
            f"- GEMM loop {g['gemm']} {g['shape']} {g['dtype']}: {g['us_per_gemm']:.1f} us "
            f"per GEMM, {g['tflops']:.1f} TFLOP/s"
        )
    for p in bench.get("phase_rows", []):
        rank = f" r{p['hyper_rank']}" if p["model"] == "hyperrhn" else ""
        lines.append(
            f"- phase {p['model']}{rank} {p['impl']} {p['dtype']} ({p['size']}): "
            f"{p['phase_us']:.1f} us per micro-layer"
        )
    for r in bench["rows"]:
        if r.get("hyper_rank") or r.get("command_buffer", "default") != "default":
            peak = r.get("peak_bytes")
            lines.append(
                f"- step {r['model']} r{r.get('hyper_rank', 0)} {r['impl']} {r['dtype']} "
                f"({r['size']}, command buffers {r.get('command_buffer', 'default')}): "
                f"{r['step_ms_median']:.1f} ms" + (f", peak {peak / 1e9:.2f} GB" if peak else "")
            )
    return "\n".join(lines)


def table(bench: dict, report: dict) -> str:
    """The markdown table of measured against predicted step times."""
    measured, predicted = measured_ms(bench), predicted_ms(report)
    lines = [
        f"Measured: {bench['device']}, jax {bench['jax']}, {bench['date']}: "
        + "; ".join(f"`{c}`" for c in bench.get("commands") or [bench["command"]]),
        f"Predicted: {report['meta']['target']}, commit {report['meta']['git_commit'][:7]}",
        "",
        "| model | dtype | impl | measured ms | predicted ms | measured / predicted "
        "| speed-up over scan |",
        "|---|---|---|---|---|---|---|",
    ]
    for key in sorted(measured):
        model, impl, dtype = key
        ms, pred = measured[key], predicted.get(key)
        scan = measured.get((model, "scan", dtype))
        ratio = f"{ms / pred:.2f}" if pred else "-"
        speedup = f"{scan / ms:.2f}x" if scan else "-"
        pred_text = f"{pred:.1f}" if pred else "-"
        lines.append(
            f"| {model} | {dtype} | {impl} | {ms:.1f} | {pred_text} | {ratio} | {speedup} |"
        )
    lines.append("")
    for model, dtype in sorted({(m, d) for m, _, d in measured}):
        fused = measured.get((model, "fused", dtype))
        for impl in KERNEL_IMPLS:
            ms = measured.get((model, impl, dtype))
            if fused and ms:
                lines.append(f"- {impl} over fused, {model} {dtype}: {fused / ms:.2f}x")
    extra = instrument_tables(bench)
    return "\n".join(lines) + ("\n\n" + extra if extra else "")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", help="benchmarks/bench.py --out JSON, measured on a GPU")
    parser.add_argument("--report", default="results/gpu_report_h100.json")
    args = parser.parse_args(argv)
    with open(args.bench) as f:
        bench = json.load(f)
    with open(args.report) as f:
        report = json.load(f)
    print(table(bench, report))


if __name__ == "__main__":
    main()
