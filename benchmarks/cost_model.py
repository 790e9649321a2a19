"""Calibrates the compile report's cost model on the measured H100 rows.

    # once, with the CUDA venv: the rank-0 compile report, keeping each optimised HLO
    build/venv-cuda/bin/python benchmarks/gpu_report.py --ranks=0 --save-hlo=build/hlo_h100 \\
        --out=build/gpu_report_rank0.json
    # the launch inventories (cached in results/cost_model_features_h100.json), the fit, the
    # leave-one-out errors before and after calibration
    python benchmarks/cost_model.py --hlo-dir=build/hlo_h100
    # refit from the cached inventories (no CUDA plugin, no HLO)
    python benchmarks/cost_model.py

Rows: ``results/bench_gpu_h100.json`` (paper-size step, rank 0) and
``results/kernel_blocks_h100.json`` (Pallas block settings). "Before" is the stated cost
model of ``results/gpu_report_h100.json`` (one prediction per configuration: its FLOP and
byte counts do not depend on the Pallas blocks); "after" is each row predicted by the fit to
every other row (leave-one-out). The coefficients go to ``results/cost_model_h100.json``,
which ``gpu_report.py --calibration`` reads. Terms and geometry: ``benchmarks/hlo/calibrate.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hlo import calibrate as hc

SEQ_LEN, HIDDEN = 100, 1000  # the paper size the rows were measured at


def inventories_from_hlo(hlo_dir: Path) -> dict[str, list[dict]]:
    """{config key: launch inventory} of every ``*.hlo.txt`` ``gpu_report.py --save-hlo`` wrote."""
    out = {}
    for path in sorted(hlo_dir.glob("*.hlo.txt")):
        words = path.name.removesuffix(".hlo.txt").split("_")
        model, dtype, impl = words[0], words[-1], words[-2]
        rank = int(words[1][1:]) if model == "hyperrhn" else 0
        out[hc.config_key(model, impl, dtype, rank)] = hc.launch_inventory(
            path.read_text(), SEQ_LEN, HIDDEN
        )
    return out


def before_errors(rows: list[dict], report: dict) -> dict[str, float]:
    """Relative error of the stated cost model (the report's predicted_step_ms) per row."""
    predicted = {
        hc.config_key(r["model"], r["impl"], r["dtype"], r.get("hyper_rank", 0)): r[
            "predicted_step_ms"
        ]
        for r in report["rows"]
        if r.get("status") == "ok"
    }
    return {
        r["label"]: (predicted[r["config"]] - r["measured_ms"]) / r["measured_ms"] for r in rows
    }


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hlo-dir", default="", help="rebuild the inventories from these HLO texts")
    p.add_argument("--features", default="results/cost_model_features_h100.json")
    p.add_argument("--bench", default="results/bench_gpu_h100.json")
    p.add_argument("--blocks", default="results/kernel_blocks_h100.json")
    p.add_argument("--report", default="results/gpu_report_h100.json")
    p.add_argument("--out", default="results/cost_model_h100.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = " ".join(["python benchmarks/cost_model.py", *(argv or sys.argv[1:])])
    if args.hlo_dir:
        if not Path(args.hlo_dir).is_dir():
            print(f"error: --hlo-dir={args.hlo_dir} is not a directory", file=sys.stderr)
            return 2
        cache = {
            "command": command,
            "hlo_from": "python benchmarks/gpu_report.py --ranks=0 --save-hlo="
            f"{args.hlo_dir} (the CUDA venv: compile-only H100, no GPU)",
            "inventories": inventories_from_hlo(Path(args.hlo_dir)),
        }
        Path(args.features).write_text(json.dumps(cache, indent=1) + "\n")
    try:
        inventories = json.loads(Path(args.features).read_text())["inventories"]
        bench, blocks, report = (
            json.loads(Path(p).read_text()) for p in (args.bench, args.blocks, args.report)
        )
    except (OSError, json.JSONDecodeError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = hc.measured_rows(bench, blocks, inventories)
    result = hc.calibrate(rows)
    before = before_errors(rows, report)
    for r in result["rows"]:
        r["before_error"] = before[r["label"]]
    result["by_impl"] = hc.dominant_by_impl(rows, result["coefficients_s"])
    result["command"] = command
    result["terms"] = hc.__doc__.split("\n\n")[1]
    result["choices"] = hc.CHOICES
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    return 0


def table(result: dict) -> str:
    """Markdown: per row measured, before error, fitted, leave-one-out error, dominant term."""
    lines = [
        "| row | measured ms | before error | fitted ms | LOO error | dominant term |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['label']} | {r['measured_ms']:.1f} | {r['before_error']:+.0%} | "
            f"{r['fitted_ms']:.1f} | {r['loo_error']:+.0%} | {r['dominant_term']} |"
        )
    coef = ", ".join(f"{t} {v:.3g} s" for t, v in result["coefficients_s"].items())
    lines += ["", f"Coefficients: {coef}", f"Max |LOO error|: {result['max_abs_loo_error']:.0%}"]
    for impl, d in sorted(result["by_impl"].items()):
        shares = ", ".join(f"{t} {s:.0%}" for t, s in d["shares"].items() if s >= 0.005)
        lines.append(f"- {impl}: dominated by {d['dominant_term']} ({shares})")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
