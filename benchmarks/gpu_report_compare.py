"""Markdown table comparing two GPU compile reports (before -> after).

    python benchmarks/gpu_report_compare.py results/gpu_report_h100_before.json \
        results/gpu_report_h100.json

One line per config present in both: launches per time step (total, and hyper fwd / hyper
bwd / main fwd / main bwd after), in-loop pads or casts of weight-sized arrays, MB moved per
time step, the worst Pallas Triton kernel (registers / spill-store bytes: reports from before
that backend's retirement), compiled peak memory and
the predicted step time (a cost model, see `benchmarks/gpu_report.py`).
"""

from __future__ import annotations

import json
import sys

PARTS = ("hyper_forward", "hyper_backward", "main_forward", "main_backward")


def _key(row: dict) -> tuple:
    return row["model"], row.get("hyper_rank", 0), row["impl"], row["dtype"]


def _label(row: dict) -> str:
    rank = f" r{row.get('hyper_rank', 0)}" if row["model"] == "hyperrhn" else ""
    return f"{row['model']}{rank} {row['impl']} {row['dtype']}"


def _kernels(row: dict) -> str:
    kernels = row.get("pallas_kernels") or []
    if not kernels:
        return ""
    regs = max(k.get("registers", 0) for k in kernels)
    spill = max(k.get("spill_stores", 0) for k in kernels)
    return f"{regs} / {spill} B"


def _weight_moves(row: dict) -> int:
    return sum((row.get("weight_sized_ops_per_step") or {}).values())


def compare(before: list[dict], after: list[dict]) -> str:
    """The markdown table of every config that compiled in both reports."""
    old = {_key(r): r for r in before if r["status"] == "ok"}
    lines = [
        "| config | launches / step | split after (hf / hb / mf / mb) | W pad+cast / step "
        "| MB / step | Pallas regs / spill | peak GB after | predicted ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for new in after:
        if new["status"] != "ok" or _key(new) not in old:
            continue
        was = old[_key(new)]
        split = " / ".join(str(new["launches_split"].get(p, 0)) for p in PARTS)
        arrow = "{} -> {}".format
        kernels = arrow(_kernels(was), _kernels(new)) if _kernels(new) else ""
        peak = (new.get("memory") or {}).get("peak_bytes") or 0
        lines.append(
            f"| {_label(new)} | {arrow(was['launches_per_step'], new['launches_per_step'])} "
            f"| {split} | {arrow(_weight_moves(was), _weight_moves(new))} "
            f"| {arrow(round(was['bytes_per_step'] / 1e6), round(new['bytes_per_step'] / 1e6))} "
            f"| {kernels} | {peak / 1e9:.2f} "
            f"| {arrow(round(was['predicted_step_ms'], 1), round(new['predicted_step_ms'], 1))} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: gpu_report_compare.py BEFORE.json AFTER.json", file=sys.stderr)
        return 2
    before, after = (json.load(open(path))["rows"] for path in argv[1:])
    print(compare(before, after))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
