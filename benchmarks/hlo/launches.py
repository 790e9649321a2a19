"""XLA's optimised GPU HLO text (parsed by ``parse``): time loops, launches per step, bytes
and FLOPs per launch.

Pure Python (no JAX import), so the parser is tested everywhere on small HLO text
(``tests/test_benchmarks_hlo_launches.py``). ``benchmarks/gpu_report.py`` feeds it
``compiled.as_text()`` of the training step compiled for an H100; ``cost`` summarises
and predicts from it.

Definitions (documented in the report's JSON under ``"definitions"``):

* A *launch* is an instruction that starts GPU work: every instruction except the ones in
  ``NO_LAUNCH`` (parameters, tuples, get-tuple-element, bitcasts, constants, ...). ``call``
  and ``conditional`` are not launches themselves; the launches of the computations they call
  are counted instead (a ``call`` may be a command buffer holding several kernels).
  ``while`` is not a launch; the launches of its body count ``trip count`` times. Of an async
  pair (``copy-start`` / ``copy-done``) only the start counts.
* A *time loop* is a ``while`` whose trip count is the sequence length (100 at the paper
  size). XLA writes the trip count into the while's ``backend_config``
  (``"known_trip_count":{"n":"100"}``); without it the loop condition's ``compare`` against a
  constant is read.
* *Launches per time step* of a time loop are the launches of its body, with a nested loop's
  body counted trip-count times. The condition computation's launches are reported apart
  (``cond_launches``): with a known trip count XLA's while thunk does not need them.
* *Bytes* of a launch (``launch_bytes``, the old rule) and *bytes read* (``read_rule=True``,
  the corrected rule, ``read_fraction``) are defined in ``cost.DEFINITIONS``
  (``bytes_per_step``, ``bytes_per_step_read``), *FLOPs* (``launch_flops``) in
  ``cost.ASSUMPTIONS``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterable

# The parser, re-exported: callers use launches alone.
from .parse import (  # noqa: F401
    Computation,
    Instr,
    array_shapes,
    entry_name,
    parse_instr,
    parse_module,
    shape_bytes,
)

# Instructions that start no GPU work of their own.
NO_LAUNCH = frozenset(
    {
        "parameter",
        "tuple",
        "get-tuple-element",
        "bitcast",
        "constant",
        "after-all",
        "add-dependency",
        "opt-barrier",
        "domain",
        "partition-id",
        "replica-id",
        "copy-done",
        "send-done",
        "recv-done",
        "all-reduce-done",
        "all-gather-done",
        "collective-permute-done",
        "async-done",
        "async-update",
        "while",
        "call",
        "conditional",
    }
)

# Launches that only move or reformat data; reported by kind ("in-loop pads/converts/copies").
DATA_MOVEMENT = ("pad", "convert", "copy", "transpose", "slice", "concatenate", "broadcast")

# Fused ops that only select elements (a fusion of these and DATA_MOVEMENT ops moves data).
INDEXING = ("reshape", "dynamic-slice", "dynamic-update-slice", "reverse")
PLUMBING = ("parameter", "bitcast", "tuple", "get-tuple-element", "constant")
# Ops whose presence in an in-loop launch is counted ("launches with a pad per step").
WATCHED_OPS = ("pad", "convert", "copy", "transpose")

SLICES = ("dynamic-slice", "slice")
GEMM_TARGETS = ("__cublas$gemm", "__cublas$lt$matmul", "__cudnn$matmul")

_TRIP_RE = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)"?')


# ----------------------------------------------------------------------------- loops


def trip_count(instr: Instr, comps: dict[str, Computation]) -> int | None:
    """A while's trip count: ``known_trip_count`` in its backend_config, else the constant
    its condition compares the counter with (``i < N``), else None."""
    m = _TRIP_RE.search(instr.attrs)
    if m:
        return int(m.group(1))
    cond = comps.get((instr.attr("condition") or "").lstrip("%"))
    if cond is None:
        return None
    # the compare may sit in the condition or in a fusion it calls
    scopes = [cond] + [comps[c] for i in cond.instrs for c in i.called if c in comps]
    for scope in scopes:
        consts = {
            i.name: int(i.literal)
            for i in scope.instrs
            if i.opcode == "constant" and re.fullmatch(r"-?\d+", i.literal)
        }
        for i in scope.instrs:
            if i.opcode == "compare" and "direction=LT" in i.attrs:
                for op in i.operands[1:]:
                    if op in consts:
                        return consts[op]
    return None


@dataclasses.dataclass
class Launch:
    """One launch inside a loop body (or the entry), with its cost figures."""

    name: str
    opcode: str
    kind: str  # fusion kind / custom-call target / opcode
    bytes: int
    flops: int
    dtype: str  # dtype of the result's first array
    fused_ops: tuple[str, ...] = ()  # opcodes inside the fused computation
    multiplicity: int = 1  # times per enclosing-loop iteration (nested loops)
    result_dims: tuple[tuple[int, ...], ...] = ()  # dims of each array of the result
    input_dtype: str = ""  # bf16 if a matmul input (or any operand) is bf16 / f16, else f32
    bytes_read: int = -1  # the corrected rule (module docstring); -1: not computed

    @property
    def category(self) -> str:
        """gemm | pad | convert | copy | transpose | ... | fusion | other."""
        if self.kind in GEMM_TARGETS or self.kind == "triton_gemm":
            return "gemm"
        movement = movement_kind(self)
        if movement:
            return movement
        return "fusion" if self.opcode == "fusion" else self.opcode


def movement_kind(launch: Launch) -> str:
    """pad / convert / copy / ... if the launch only moves or reformats data, else "".

    A fusion of only data-movement and indexing ops is named after its most specific op;
    one that writes with ``dynamic-update-slice`` is a ``store`` (a slice written into a loop
    buffer, e.g. the stacked residuals of a scan)."""
    if launch.opcode in DATA_MOVEMENT:
        return launch.opcode
    if launch.opcode == "fusion":
        ops = [o for o in launch.fused_ops if o not in PLUMBING]
        if ops and all(o in DATA_MOVEMENT + INDEXING for o in ops):
            if "dynamic-update-slice" in ops:
                return "store"  # writes a slice into a loop buffer (stacked residuals)
            for kind in DATA_MOVEMENT:  # the most specific first
                if kind in ops:
                    return kind
    return ""


def _fused_computation(instr: Instr, comps: dict[str, Computation]) -> Computation | None:
    for name in instr.called:
        if name in comps:
            return comps[name]
    return None


def _operand_shape(instr: Instr, k: int, table: dict[str, Instr]) -> str:
    if k < len(instr.operand_shapes) and instr.operand_shapes[k]:
        return instr.operand_shapes[k]
    src = table.get(instr.operands[k])
    return src.shape if src is not None else ""


def launch_bytes(
    instr: Instr,
    table: dict[str, Instr],
    comps: dict[str, Computation],
    read_rule: bool = False,
) -> int:
    """Bytes a launch reads and writes (the rules: ``cost.DEFINITIONS``);
    ``read_rule``: the corrected rule (*bytes read*), which follows reads through reshapes,
    transposes and pads to the slice that selects the elements actually read."""
    operand_bytes = [
        shape_bytes(_operand_shape(instr, k, table)) for k in range(len(instr.operands))
    ]
    result = shape_bytes(instr.shape)
    fused = _fused_computation(instr, comps) if instr.opcode == "fusion" else None
    if fused is None:
        for k, nm in enumerate(instr.operands):
            if nm in instr.operands[:k]:
                operand_bytes[k] = 0  # the same buffer passed twice is read once
        if instr.opcode == "dynamic-update-slice" and len(operand_bytes) > 1:
            return 2 * operand_bytes[1] + sum(operand_bytes[2:])
        if instr.opcode == "dynamic-slice" and operand_bytes:
            return 2 * result + sum(operand_bytes[1:])
        if read_rule and instr.opcode == "slice" and operand_bytes:
            return 2 * result  # the slice's elements, read and written
        return sum(operand_bytes) + result
    params: dict[int, Instr] = {}
    for i in fused.instrs:
        if i.opcode == "parameter":
            params[parameter_number(i)] = i
    users: dict[str, list[Instr]] = {}
    for i in fused.instrs:
        for op in i.operands:
            users.setdefault(op, []).append(i)
    total = 0
    in_place_results = 0
    duplicate = {k for k, nm in enumerate(instr.operands) if nm in instr.operands[:k]}
    for k, nbytes in enumerate(operand_bytes):
        p = params.get(k)
        uses = users.get(p.name, []) if p is not None else []
        if k in duplicate:
            continue  # the same buffer passed twice is read once
        if uses and all(
            u.opcode == "dynamic-update-slice" and u.operands[0] == p.name for u in uses
        ):
            ftable = fused.by_name()
            for u in uses:
                upd = ftable.get(u.operands[1])
                ub = shape_bytes(upd.shape) if upd is not None else 0
                # the buffer is not read; of the result only the update is written
                in_place_results += shape_bytes(u.shape) - ub
        elif read_rule and uses:
            total += math.ceil(read_fraction(p, users) * nbytes)
        elif uses and all(u.opcode in SLICES and u.operands[0] == p.name for u in uses):
            total += min(_read_bytes(p, users), nbytes)
        else:
            total += nbytes
    return total + max(result - in_place_results, 0)


# Fused ops that move elements without reading more or fewer of them (the fraction of an
# operand that is read passes through them unchanged; a pad's new elements are not read).
INDEX_ONLY = ("bitcast", "reshape", "transpose", "copy", "pad", "reverse")
# Fused elementwise ops of one operand whose element i reads the operand's element i only: a
# fusion computes the elements its slices keep, so the fraction read passes through too (a
# convert to bf16 before a slice of the states reads the slice, not the whole array).
ONE_TO_ONE = ("convert",)


def _elements(shape_text: str) -> int:
    arrays = array_shapes(shape_text)
    return math.prod(arrays[0][1]) if arrays else 0


def read_fraction(value: Instr, users: dict[str, list[Instr]], _depth: int = 0) -> float:
    """The fraction of ``value``'s elements a fused computation reads (the corrected rule):
    through ``INDEX_ONLY`` and ``ONE_TO_ONE`` ops unchanged, through a slice times the
    slice's share of its input; 1 where any other op uses it (or it is the root); several
    uses summed, at most 1.
    """
    uses = users.get(value.name, [])
    if not uses or _depth > 64:
        return 1.0
    total = 0.0
    for u in uses:
        if not u.operands or u.operands[0] != value.name:
            return 1.0  # e.g. a slice's index operand, a pad's padding value
        if u.opcode in INDEX_ONLY or u.opcode in ONE_TO_ONE:
            total += read_fraction(u, users, _depth + 1)
        elif u.opcode in SLICES:
            share = _elements(u.shape) / max(_elements(value.shape), 1)
            total += read_fraction(u, users, _depth + 1) * share
        else:
            return 1.0
    return min(total, 1.0)


def parameter_number(instr: Instr) -> int:
    """N of ``parameter(N)`` (the parser keeps it as the instruction's only operand)."""
    if instr.operands and instr.operands[0].isdigit():
        return int(instr.operands[0])
    raise ValueError(f"{instr.name} is not a numbered parameter")


def _read_bytes(value: Instr, users: dict[str, list[Instr]], _depth: int = 0) -> int:
    """Bytes of ``value`` a fused computation reads: through chains of slices, bitcasts and
    reshapes only the elements finally used (XLA's emitters read what the output needs)."""
    uses = users.get(value.name, [])
    through = SLICES + ("bitcast", "reshape")
    if not uses or _depth > 32:
        return shape_bytes(value.shape)
    if all(u.opcode in through and u.operands[0] == value.name for u in uses):
        return min(sum(_read_bytes(u, users, _depth + 1) for u in uses), shape_bytes(value.shape))
    return shape_bytes(value.shape)


def dot_flops(instr: Instr, table: dict[str, Instr]) -> int:
    """2 * prod(batch) * M * N * K of a dot / cuBLAS gemm from its shapes and dimension numbers."""
    lhs = array_shapes(_operand_shape(instr, 0, table))
    out = array_shapes(instr.shape)
    if not lhs or not out:
        return 0
    lhs_dims = lhs[0][1]
    contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", instr.attrs)
    if contracting:
        cdims = [int(d) for d in contracting.group(1).split(",") if d]
    else:  # cuBLAS backend_config: "lhs_contracting_dimensions":["1"]
        cm = re.search(r'"lhs_contracting_dimensions"\s*:\s*\[([^\]]*)\]', instr.attrs)
        cdims = (
            [int(d.strip().strip('"')) for d in cm.group(1).split(",") if d.strip()]
            if cm
            else [len(lhs_dims) - 1]
        )
    k = math.prod(lhs_dims[d] for d in cdims if d < len(lhs_dims))
    out_elems = math.prod(out[0][1])  # a gemm custom call's first result is the product
    return 2 * out_elems * k


def launch_flops(instr: Instr, table: dict[str, Instr], comps: dict[str, Computation]) -> int:
    if instr.opcode in ("dot", "convolution"):
        return dot_flops(instr, table)
    if instr.opcode == "custom-call":
        target = instr.custom_call_target
        if target in GEMM_TARGETS:
            return dot_flops(instr, table)
        return 0
    if instr.opcode == "fusion":
        fused = _fused_computation(instr, comps)
        if fused is not None:
            ftable = fused.by_name()
            return sum(
                dot_flops(i, ftable) for i in fused.instrs if i.opcode in ("dot", "convolution")
            )
    return 0


def launch_kind(instr: Instr) -> str:
    if instr.opcode == "custom-call":
        return instr.custom_call_target
    if instr.opcode == "fusion":
        if "__triton_gemm" in instr.attrs or '"kind":"__triton' in instr.attrs:
            return "triton_gemm"
        kind = instr.attr("kind")
        return kind or "fusion"
    return instr.opcode


def is_launch(instr: Instr) -> bool:
    return instr.opcode not in NO_LAUNCH


def computation_launches(
    name: str, comps: dict[str, Computation], multiplicity: int = 1, _depth: int = 0
) -> list[Launch]:
    """Every launch of computation ``name`` per execution, recursing into ``call`` /
    ``conditional`` (each branch counted: an upper bound) and nested ``while`` bodies
    (times their trip count, 1 if unknown)."""
    comp = comps[name]
    table = comp.by_name()
    out: list[Launch] = []
    for instr in comp.instrs:
        if instr.opcode == "while":
            body = instr.attr("body")
            trips = trip_count(instr, comps) or 1
            if body and body.lstrip("%") in comps and _depth < 16:
                out += computation_launches(
                    body.lstrip("%"), comps, multiplicity * trips, _depth + 1
                )
            continue
        if instr.opcode in ("call", "conditional"):
            for callee in instr.called:
                if callee in comps and _depth < 16:
                    out += computation_launches(callee, comps, multiplicity, _depth + 1)
            continue
        if not is_launch(instr):
            continue
        fused = _fused_computation(instr, comps) if instr.opcode == "fusion" else None
        dtypes = array_shapes(instr.shape)
        out.append(
            Launch(
                name=instr.name,
                opcode=instr.opcode,
                kind=launch_kind(instr),
                bytes=launch_bytes(instr, table, comps),
                flops=launch_flops(instr, table, comps),
                dtype=dtypes[0][0] if dtypes else "",
                fused_ops=tuple(i.opcode for i in fused.instrs) if fused else (),
                multiplicity=multiplicity,
                result_dims=tuple(dims for _, dims in dtypes),
                input_dtype=input_dtype(instr, table, fused),
                bytes_read=launch_bytes(instr, table, comps, read_rule=True),
            )
        )
    return out


def _operand_dtypes(instr: Instr, table: dict[str, Instr]) -> set[str]:
    return {
        d
        for k in range(len(instr.operands))
        for d, _ in array_shapes(_operand_shape(instr, k, table))
    }


def input_dtype(instr: Instr, table: dict[str, Instr], fused: Computation | None) -> str:
    """``bf16`` if the launch multiplies bf16 / f16 inputs (a fused dot's operands, else any
    operand of the launch), else ``f32``: what decides the tensor-core rate."""
    dots = [i for i in fused.instrs if i.opcode in ("dot", "convolution")] if fused else []
    if dots:
        ftable = fused.by_name()
        found = set().union(*(_operand_dtypes(i, ftable) for i in dots))
    else:
        found = _operand_dtypes(instr, table)
    return "bf16" if found & {"bf16", "f16"} else "f32"


@dataclasses.dataclass
class Loop:
    """A ``while`` of the module with its body's launches per iteration."""

    name: str
    computation: str  # where the while instruction is
    trips: int | None
    carried: list[tuple[str, tuple[int, ...]]]
    launches: list[Launch]
    cond_launches: int
    order: int  # position in file order among all whiles
    role: str = ""  # forward | backward (set by classify_loops)
    part: str = ""  # hyper | main


def find_loops(comps: dict[str, Computation]) -> list[Loop]:
    """Every ``while`` in the module (outermost and nested), in file order."""
    loops = []
    for cname, comp in comps.items():
        for instr in comp.instrs:
            if instr.opcode != "while":
                continue
            body = (instr.attr("body") or "").lstrip("%")
            cond = (instr.attr("condition") or "").lstrip("%")
            launches = computation_launches(body, comps) if body in comps else []
            cond_n = len(computation_launches(cond, comps)) if cond in comps else 0
            loops.append(
                Loop(
                    name=instr.name,
                    computation=cname,
                    trips=trip_count(instr, comps),
                    carried=array_shapes(instr.shape),
                    launches=launches,
                    cond_launches=cond_n,
                    order=len(loops),
                )
            )
    return loops


def classify_loops(loops: Iterable[Loop], seq_len: int, hidden: int) -> list[Loop]:
    """The time loops (trip count == ``seq_len``), each given a part and a role.

    part: ``main`` if the loop carries a weight-sized array (an array with at least two
    dims >= ``hidden``, e.g. W [n, 2n] or its padded copy), else ``hyper``. (The scan
    HyperRHN runs both cells in one loop: it is ``main``.)
    role: within one part, loops in schedule (file) order; the first is ``forward``, every
    later one ``backward`` (the backward loop consumes the forward's residuals, so it is
    always scheduled after it; a rematerialised forward would count as backward).
    """
    time_loops = [lp for lp in loops if lp.trips == seq_len]
    seen: set[str] = set()
    for lp in sorted(time_loops, key=lambda lp: lp.order):
        big = any(sum(d >= hidden for d in dims) >= 2 for _, dims in lp.carried)
        lp.part = "main" if big else "hyper"
        lp.role = "backward" if lp.part in seen else "forward"
        seen.add(lp.part)
    return time_loops


# ----------------------------------------------------------------------------- summaries


def per_step(launches: Iterable[Launch]) -> int:
    return sum(lc.multiplicity for lc in launches)


def _tally(launches: Iterable[Launch], keys: Callable[[Launch], Iterable[str]]) -> dict[str, int]:
    """{key: launches per iteration} of the keys ``keys(launch)`` names for each launch."""
    out: dict[str, int] = {}
    for lc in launches:
        for key in keys(lc):
            out[key] = out.get(key, 0) + lc.multiplicity
    return out


def movement_counts(launches: Iterable[Launch]) -> dict[str, int]:
    """{pad: k, convert: k, copy: k, ...} of the data-movement launches, per iteration."""
    return _tally(launches, lambda lc: [movement_kind(lc)] if movement_kind(lc) else [])


def watched_op_counts(launches: Iterable[Launch]) -> dict[str, int]:
    """{pad: k, ...}: launches per iteration that contain the op (fused or alone)."""
    return _tally(launches, lambda lc: [o for o in WATCHED_OPS if o in {*lc.fused_ops, lc.opcode}])


def weight_sized(launch: Launch, hidden: int) -> bool:
    """Whether the launch writes a weight-sized array (two dims >= ``hidden``, e.g. W
    [n, 2n] or a padded / cast copy of it; the batch, < n, never qualifies)."""
    return any(sum(d >= hidden for d in dims) >= 2 for dims in launch.result_dims)


def weight_op_counts(launches: Iterable[Launch], hidden: int) -> dict[str, int]:
    """{pad: k, convert: k, ...}: launches per iteration that contain the op and write a
    weight-sized array (the pads / casts of W that belong outside the time loop)."""
    return watched_op_counts(lc for lc in launches if weight_sized(lc, hidden))


def category_counts(launches: Iterable[Launch]) -> dict[str, int]:
    return dict(sorted(_tally(launches, lambda lc: [lc.category]).items()))
