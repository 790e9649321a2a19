"""Where a persistent kernel's phases go: the stamps `rhhjax.ops.persistent.record_timeline`
saves (npz), summarized per direction.

    python benchmarks/phase_timeline.py STAMPS [--out=DIR] [--top=5] [--record] [--variant=V]

--record (a GPU) first runs the paper plan's kernels at ``model.persistent`` variant V (its
text form, default the default) and saves STAMPS.

Per event: the median and p90, over phases and blocks, of the cycles since the phase's
barrier passed; the whole phase (barrier passed to the next phase's, ``%globaltimer`` ns);
the straggler blocks and SMs (most often the slowest to arrive at a phase's barrier). With
--out: phase_timeline.md, .json and .png (phases across, blocks down, colour = cycles to
barrier arrived).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import numpy as np
from rhhjax.kernels.mosaic import phase_timeline as ptl

DIRECTIONS = ("forward", "backward")


def _stats(x) -> dict:
    x = np.asarray(x, np.float64).ravel()
    return {"median": float(np.median(x)), "p90": float(np.percentile(x, 90))}


def execution_order(stamps) -> np.ndarray:
    """The phases in the order they ran (the backward's in reverse)."""
    return np.argsort(np.median(ptl.start_ns(stamps), axis=1), kind="stable")


def summarize(stamps, sm, top: int = 5) -> dict:
    """One direction: per event (and "phase", in ns) median and p90; stragglers."""
    deltas = ptl.deltas(stamps)
    out = {event: _stats(deltas[..., e]) for e, event in enumerate(ptl.EVENTS)}
    start = ptl.start_ns(stamps)[execution_order(stamps)]
    if len(start) > 1:
        out["phase_ns"] = _stats(np.diff(start, axis=0))
    slowest = np.argmax(deltas[..., -1], axis=1)  # per phase: the last block to arrive
    blocks = collections.Counter(int(b) for b in slowest)
    sms = collections.Counter(int(np.asarray(sm)[b]) for b in slowest)
    out["straggler_blocks"] = [[b, n] for b, n in blocks.most_common(top)]
    out["straggler_sms"] = [[s, n] for s, n in sms.most_common(top)]
    return out


def markdown(summaries: dict) -> str:
    lines = []
    for direction, s in summaries.items():
        lines += [f"## {direction}", "", "| event | median | p90 |", "|---|---:|---:|"]
        for event in (*ptl.EVENTS, "phase_ns"):
            if event in s:
                unit = "ns" if event == "phase_ns" else "cycles"
                name = "whole phase" if event == "phase_ns" else event
                lines.append(f"| {name} ({unit}) | {s[event]['median']:.0f} | "
                             f"{s[event]['p90']:.0f} |")  # fmt: skip
        lines.append("")
        for kind in ("blocks", "sms"):
            most = ", ".join(f"{i} ({n} phases)" for i, n in s[f"straggler_{kind}"])
            lines.append(f"slowest {kind[:-1]}s: {most}")
        lines.append("")
    return "\n".join(lines)


def picture(data: dict, path: Path) -> None:
    """Phases across, blocks down, colour = cycles from barrier passed to arrived."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(DIRECTIONS), 1, figsize=(12, 8), squeeze=False)
    for ax, direction in zip(axes[:, 0], DIRECTIONS, strict=True):
        image = ax.imshow(ptl.deltas(data[f"{direction}_stamps"])[..., -1].T, aspect="auto",
                          interpolation="nearest")  # fmt: skip
        ax.set(title=direction, xlabel="phase", ylabel="block")
        fig.colorbar(image, ax=ax, label="cycles")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stamps", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--variant", default="default")
    args = parser.parse_args(argv)
    if args.record:
        from rhhjax.ops import persistent

        persistent.record_timeline(args.stamps, persistent.parse_variant(args.variant))
    data = dict(np.load(args.stamps))
    summaries = {
        d: summarize(data[f"{d}_stamps"], data[f"{d}_sm"], args.top)
        for d in DIRECTIONS
        if f"{d}_stamps" in data
    }
    text = markdown(summaries)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "phase_timeline.md").write_text(text + "\n")
        (args.out / "phase_timeline.json").write_text(json.dumps(summaries, indent=1) + "\n")
        picture(data, args.out / "phase_timeline.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
