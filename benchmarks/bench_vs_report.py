"""Measured GPU step times beside the compile report's predictions.

    python benchmarks/bench_vs_report.py results/bench_gpu_h100.json \\
        --report=results/gpu_report_h100.json

The bench JSON comes from ``benchmarks/bench.py`` run on a GPU (paper size); the report from
``benchmarks/gpu_report.py`` (compiled for an H100 on a CPU host, with a stated cost model).
Prints a markdown table: measured median step, predicted step, measured / predicted, and the
speed-up of each impl over ``scan`` and of ``pallas`` over ``fused`` in the same run.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence


def predicted_ms(report: dict) -> dict[tuple[str, str, str], float]:
    """(model, impl, dtype) -> predicted step ms, for the paper-size rank-0 rows."""
    out = {}
    for row in report["rows"]:
        if row.get("status") == "ok" and not row.get("hyper_rank"):
            out[(row["model"], row["impl"], row["dtype"])] = row["predicted_step_ms"]
    return out


def measured_ms(bench: dict) -> dict[tuple[str, str, str], float]:
    """(model, impl, dtype) -> measured median step ms, for the paper-size rows."""
    return {
        (r["model"], r["impl"], r["dtype"]): r["step_ms_median"]
        for r in bench["rows"]
        if r["size"] == "paper"
    }


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
        pallas = measured.get((model, "pallas", dtype))
        if fused and pallas:
            lines.append(f"- pallas over fused, {model} {dtype}: {fused / pallas:.2f}x")
    return "\n".join(lines)


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
