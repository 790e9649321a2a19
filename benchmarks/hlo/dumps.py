"""XLA's GPU compile dumps read back: ptxas register / spill reports, the thunk sequence
(kernel grids, time-loop bodies, command buffers) and XLA's own spill warnings.

Pure Python apart from running ``ptxas -v`` (of the nvidia-cuda-nvcc wheel) on dumped PTX.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from pathlib import Path

from rhhjax.kernels.hardware import H100

from . import launches as hl

SMEM_PER_BLOCK_OPTIN = H100.smem_per_block_optin  # shared memory a block may opt in to
REGISTERS_PER_THREAD_MAX = H100.registers_per_thread

_SPILL_LOG_RE = re.compile(
    r"Registers are spilled to local memory in function '([^']+)',\s*(\d+) bytes spill stores,"
    r"\s*(\d+) bytes spill loads"
)
_PTXAS_FUNC_RE = re.compile(r"Compiling entry function '([^']+)'")
_PTXAS_SPILL_RE = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
_PTXAS_REGS_RE = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")
_SMEM_ERR_RE = re.compile(r"[Ss]hared memory size limit exceeded[^\n]*?(\d+)[^\n]*?(\d+)")


def parse_spill_log(log: str) -> dict[str, dict]:
    """XLA's ptxas warnings -> {kernel: {"spill_stores": B, "spill_loads": B}}."""
    out = {}
    for name, stores, loads in _SPILL_LOG_RE.findall(log):
        out[name] = {"spill_stores": int(stores), "spill_loads": int(loads)}
    return out


def parse_ptxas_verbose(text: str) -> dict[str, dict]:
    """``ptxas -v`` output -> {function: {registers, spill_stores, spill_loads, stack, smem}}."""
    out: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        m = _PTXAS_FUNC_RE.search(line)
        if m:
            current = m.group(1)
            out[current] = {}
            continue
        if current is None:
            continue
        m = _PTXAS_SPILL_RE.search(line)
        if m:
            out[current].update(
                stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3))
            )
        m = _PTXAS_REGS_RE.search(line)
        if m:
            out[current]["registers"] = int(m.group(1))
            out[current]["static_smem"] = int(m.group(2) or 0)
    return out


def ptxas_path() -> str | None:
    """ptxas of the nvidia-cuda-nvcc wheel (or on PATH)."""
    try:
        import nvidia.cuda_nvcc as nvcc

        for base in nvcc.__path__:
            cand = Path(base) / "bin" / "ptxas"
            if cand.exists():
                return str(cand)
    except ImportError:
        pass
    return shutil.which("ptxas")


_THUNK_KERNEL_RE = re.compile(
    r"\]\s+(\S+)\s+grid:\s*\[([\d, ]+)\]\s+threads:\s*\[([\d, ]+)\]\s+shared_memory:\s*(\d+)"
)


def parse_thunk_kernels(text: str) -> dict[str, dict]:
    """XLA's dumped thunk sequence -> {kernel: {"grid", "threads", "shared_memory"}}."""
    out = {}
    for name, grid, threads, smem in _THUNK_KERNEL_RE.findall(text):
        out[name] = {
            "grid": [int(x) for x in grid.split(",")],
            "threads": [int(x) for x in threads.split(",")],
            "shared_memory": int(smem),
        }
    return out


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


def triton_kernel_names(hlo_text: str) -> set[str]:
    """The ``name`` of every Triton (Pallas) custom call of an HLO module."""
    names = set()
    for line in hlo_text.splitlines():
        if any(t in line for t in hl.TRITON_TARGETS):
            m = re.search(r'\bname = "([\w.\-]+)"', line) or re.search(
                r'\\?"name\\?"\s*:\s*\\?"([\w.\-]+)', line
            )
            if m:
                names.add(m.group(1))
    return names


def _base_name(kernel: str) -> str:
    return re.sub(r"__\d+$", "", kernel)


def kernel_stats(dump_dir: str, hlo_text: str, log: str) -> list[dict]:
    """Registers, spills and shared memory of every Pallas kernel of a compile.

    Launch shapes and dynamic shared memory come from the dumped thunk sequence, registers
    and spills from ``ptxas -v -arch=sm_90a`` on the dumped PTX (the same ptxas XLA ran),
    cross-checked with XLA's own spill warnings in ``log``.
    """
    wanted = triton_kernel_names(hlo_text)
    thunks: dict[str, dict] = {}
    for path in glob.glob(os.path.join(dump_dir, "*.thunk_sequence.txt")):
        thunks.update(parse_thunk_kernels(Path(path).read_text()))
    kernels = {k: v for k, v in thunks.items() if _base_name(k) in wanted}
    ptxas = ptxas_path()
    verbose: dict[str, dict] = {}
    if ptxas and kernels:
        for path in sorted(glob.glob(os.path.join(dump_dir, "*.ptx"))):
            text = Path(path).read_text(errors="replace")
            if not any(f".entry {k}(" in text for k in kernels):
                continue
            run = subprocess.run(
                [ptxas, "-v", "-arch=sm_90a", path, "-o", os.devnull],
                capture_output=True,
                text=True,
                check=False,
            )
            verbose.update(parse_ptxas_verbose(run.stdout + run.stderr))
    logged = parse_spill_log(log)
    out = []
    for name in sorted(kernels):
        row = {"kernel": name, **kernels[name], **verbose.get(name, {})}
        if name in logged:
            row["xla_log_spill_stores"] = logged[name]["spill_stores"]
            row["xla_log_spill_loads"] = logged[name]["spill_loads"]
        row["spills"] = bool(row.get("spill_stores") or row.get("spill_loads") or name in logged)
        row["smem_overflow"] = row["shared_memory"] > SMEM_PER_BLOCK_OPTIN
        out.append(row)
    return out
