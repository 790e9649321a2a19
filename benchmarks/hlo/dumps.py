"""XLA's GPU compile dumps read back: the thunk sequence (time-loop bodies, command buffers)
beside the HLO's launch count. Pure Python.
"""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path

from . import launches as hl


def parse_thunk_loops(text: str) -> list[dict]:
    """XLA's thunk sequence (after thunk passes) -> one entry per top-level ``kWhile``, in
    execution order: the leaf thunks in its body and condition (a wrapper such as
    ``kCommandBuffer`` or ``kDynamicSliceFusion`` counts as the thunks nested in it) and
    whether the body holds a command buffer (a CUDA graph: one graph launch per iteration)."""
    lines = text.splitlines()

    def indent(line: str) -> int:
        return len(line) - len(line.lstrip(" "))

    def is_thunk(line: str) -> bool:
        return re.match(r"\s*\d+: k\w+", line) is not None

    loops, i = [], 0
    while i < len(lines):
        if not re.match(r"^\d+: kWhile", lines[i]):
            i += 1
            continue
        counts, mode, graph = {"condition": 0, "body": 0}, None, False
        i += 1
        while i < len(lines) and (lines[i].startswith(" ") or lines[i].startswith("condition")):
            line, item = lines[i], lines[i].strip()
            if item.startswith("condition"):
                mode = "condition"
            elif item.startswith("body"):
                mode = "body"
            elif mode and is_thunk(line):
                graph = graph or (mode == "body" and "kCommandBuffer" in item)
                nxt = lines[i + 1] if i + 1 < len(lines) else ""
                wrapper = is_thunk(nxt) and indent(nxt) > indent(line)
                if not wrapper and "kWhile" not in item:
                    counts[mode] += 1
            i += 1
        loops.append(
            {
                "body_thunks": counts["body"],
                "condition_thunks": counts["condition"],
                "command_buffer": graph,
            }
        )
    return loops


def thunk_check(dump_dir: str, summary: dict, hlo_text: str) -> dict | None:
    """Launches per iteration of each time loop as XLA's thunk sequence has them, next to
    the HLO count (the thunk sequence is what the GPU runs)."""
    paths = glob.glob(os.path.join(dump_dir, "*step_fn*.thunk_sequence_after_thunk_passes.txt"))
    if not paths:
        return None
    thunk_loops = parse_thunk_loops(Path(paths[0]).read_text())
    comps = hl.parse_module(hlo_text)
    entry = comps[hl.entry_name(comps)]
    whiles = [i.name for i in entry.instrs if i.opcode == "while"]
    if len(whiles) != len(thunk_loops):
        return {"matched": False, "reason": f"{len(whiles)} HLO whiles, {len(thunk_loops)} kWhile"}
    by_name = dict(zip(whiles, thunk_loops, strict=True))
    loops = []
    for lp in summary["time_loops"]:
        th = by_name.get(lp["name"])
        if th is None:
            return {"matched": False, "reason": f"{lp['name']} is not a top-level while"}
        loops.append({"name": lp["name"], "hlo": lp["launches_per_step"], **th})
    return {
        "matched": all(lp["hlo"] == lp["body_thunks"] for lp in loops),
        "launches_per_step": sum(lp["body_thunks"] for lp in loops),
        "graph_launches_per_step": sum(lp["command_buffer"] for lp in loops),
        "loops": loops,
    }
