"""Where a profiled training step's time goes: a `jax.profiler` trace (the ``*.xplane.pb``
files `bench.py --profile_dir` writes) summed per event name and timeline line.

On a GPU the device planes (``/device:GPU:N``) hold the kernels each stream ran (CUPTI) and
XLA's own lines ("XLA Modules": one event per jitted step, "XLA Ops": one per HLO op); on a
CPU, or where CUPTI is missing, only the host plane exists, and its lines are summarized
instead (XLA:CPU's executor thread holds the ops). Per line: events, busy time (the sum of
their durations, per profiled step), and the top event names with count and time.

    python benchmarks/profile_summary.py DIR [--steps 2] [--top 20] [--json OUT]

DIR: a folder searched for ``*.xplane.pb`` (one summary per file, named by its folder).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

from jax.profiler import ProfileData


def _summaries(plane, steps: int, top: int) -> list[dict]:
    """One dict per timeline line of ``plane`` that has events: name, events, busy_ms per
    step, the first-to-last span in ms, and the ``top`` event names by time."""
    out = []
    for line in plane.lines:
        total: dict[str, float] = collections.defaultdict(float)
        count: dict[str, int] = collections.Counter()
        start, end = None, None
        for event in line.events:
            total[event.name] += event.duration_ns
            count[event.name] += 1
            start = event.start_ns if start is None else min(start, event.start_ns)
            end = max(end or 0.0, event.start_ns + event.duration_ns)
        if not count:
            continue
        ranked = sorted(total, key=total.get, reverse=True)[:top]
        per_step = {name: (count[name] / steps, total[name] / 1e6 / steps) for name in ranked}
        out.append({
            "plane": plane.name,
            "line": line.name,
            "events": sum(count.values()),
            "busy_ms_per_step": sum(total.values()) / 1e6 / steps,
            "span_ms": (end - start) / 1e6,
            "top": [
                {"name": name, "count": n, "ms_per_step": ms} for name, (n, ms) in per_step.items()
            ],
        })  # fmt: skip
    return out


def summarize(path: Path, steps: int = 2, top: int = 20, name: str = "") -> dict:
    """The summary of one ``*.xplane.pb`` (``name``: what it profiled): its device planes'
    lines, else the host's."""
    profile = ProfileData.from_file(str(path))
    planes = list(profile.planes)
    device = [p for p in planes if p.name.startswith("/device:")]
    chosen = device or [p for p in planes if p.name.startswith("/host:CPU")]
    lines = [s for plane in chosen for s in _summaries(plane, steps, top)]
    return {
        "name": name or path.stem, "file": str(path), "device_planes": bool(device),
        "steps": steps, "lines": lines,
    }  # fmt: skip


def to_markdown(summary: dict, top: int) -> str:
    """The summary as a heading, one line per timeline line, and its top events' table."""
    what = "device" if summary["device_planes"] else "host (no device plane: CUPTI missing?)"
    out = [f"## {summary['name']}: {what}, per step of {summary['steps']} profiled"]
    for line in summary["lines"]:
        out.append(
            f"\n{line['plane']} / {line['line']}: {line['events']} events, "
            f"busy {line['busy_ms_per_step']:.3f} ms a step, span {line['span_ms']:.3f} ms\n"
        )
        out.append("| event | count a step | ms a step |\n|---|---|---|")
        out += [
            f"| {e['name'][:90]} | {e['count']:g} | {e['ms_per_step']:.3f} |"
            for e in line["top"][:top]
        ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", help="folder searched for *.xplane.pb")
    parser.add_argument("--steps", type=int, default=2, help="steps the trace holds")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--json", default=None, help="write the summaries here")
    args = parser.parse_args(argv)
    files = sorted(Path(args.dir).rglob("*.xplane.pb"))
    if not files:
        print(f"error: no *.xplane.pb under {args.dir}", file=sys.stderr)
        raise SystemExit(1)
    if args.steps < 1:
        print(f"error: --steps must be >= 1, got {args.steps}", file=sys.stderr)
        raise SystemExit(1)
    root = Path(args.dir)
    summaries = [summarize(f, args.steps, args.top, f.relative_to(root).parts[0]) for f in files]
    print("\n\n".join(to_markdown(s, args.top) for s in summaries))
    if args.json:
        Path(args.json).write_text(json.dumps(summaries, indent=1))
    return summaries


if __name__ == "__main__":
    main()
