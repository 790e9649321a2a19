"""Parse XLA's HLO text into computations and instructions (shapes, operands, attributes).

Pure Python (no JAX import). ``hlo.launches`` builds the launch and loop
accounting of the compile report on it.
"""

from __future__ import annotations

import dataclasses
import math
import re

DTYPE_BYTES = {
    "pred": 1,
    "s4": 1,
    "u4": 1,
    "s8": 1,
    "u8": 1,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
    "token": 0,
}

_ARRAY_RE = re.compile(
    r"\b(" + "|".join(sorted(DTYPE_BYTES, key=len, reverse=True)) + r")\[([0-9,]*)\]"
)
_COMP_HEADER_RE = re.compile(r"^(ENTRY\s+)?%?([\w.\-$]+)\s*(\(.*)?\{\s*$")
_INSTR_RE = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-$]+)\s*=\s*(.*)$")
_COMMENT_RE = re.compile(r"/\*.*?\*/")


# ----------------------------------------------------------------------------- shapes


def array_shapes(shape_text: str) -> list[tuple[str, tuple[int, ...]]]:
    """Every array shape in an HLO shape string: ``"(f32[2,3]{1,0}, s32[])"`` ->
    ``[("f32", (2, 3)), ("s32", ())]``."""
    out = []
    for dtype, dims in _ARRAY_RE.findall(shape_text):
        out.append((dtype, tuple(int(d) for d in dims.split(",") if d)))
    return out


def shape_bytes(shape_text: str) -> int:
    """Total bytes of every array in an HLO shape string (tuples summed)."""
    return sum(DTYPE_BYTES[d] * math.prod(dims) for d, dims in array_shapes(shape_text))


# ----------------------------------------------------------------------------- parsing


@dataclasses.dataclass
class Instr:
    """One HLO instruction: ``name = shape opcode(operands), attributes``."""

    name: str
    shape: str  # result shape text
    opcode: str
    operands: list[str]  # operand names (without %)
    operand_shapes: list[str]  # operand shape text where printed, else ""
    attrs: str  # everything after the operand list
    is_root: bool = False
    literal: str = ""  # a constant's value text

    @property
    def called(self) -> list[str]:
        """Computations this instruction calls (calls=, to_apply=, body=, condition=, ...)."""
        names = re.findall(
            r"\b(?:calls|to_apply|body|condition|true_computation|false_computation)=%?([\w.\-$]+)",
            self.attrs,
        )
        m = re.search(r"branch_computations=\{([^}]*)\}", self.attrs)
        if m:
            names += [s.strip().lstrip("%") for s in m.group(1).split(",") if s.strip()]
        return names

    def attr(self, key: str) -> str | None:
        """The value text of ``key=...`` (up to the next top-level comma), or None."""
        m = re.search(r"\b" + re.escape(key) + r"=", self.attrs)
        if not m:
            return None
        return _balanced_prefix(self.attrs[m.end() :])

    @property
    def custom_call_target(self) -> str:
        target = self.attr("custom_call_target")
        return target.strip('"') if target else ""


@dataclasses.dataclass
class Computation:
    name: str
    instrs: list[Instr]
    is_entry: bool = False

    def by_name(self) -> dict[str, Instr]:
        return {i.name: i for i in self.instrs}

    @property
    def root(self) -> Instr | None:
        for i in self.instrs:
            if i.is_root:
                return i
        return self.instrs[-1] if self.instrs else None


def _balanced_prefix(text: str) -> str:
    """The prefix of ``text`` up to the first comma outside brackets / quotes."""
    depth, quoted = 0, False
    for k, ch in enumerate(text):
        if ch == '"' and (k == 0 or text[k - 1] != "\\"):
            quoted = not quoted
        elif quoted:
            continue
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                return text[:k].strip()
            depth -= 1
        elif ch == "," and depth == 0:
            return text[:k].strip()
    return text.strip()


def _split_shape(rest: str) -> tuple[str, str]:
    """``"f32[2]{0} add(...), x=y"`` -> (shape text, remainder starting at the opcode)."""
    rest = rest.strip()
    if rest.startswith("("):  # tuple shape: balanced parentheses
        depth = 0
        for k, ch in enumerate(rest):
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
                if depth == 0:
                    return rest[: k + 1], rest[k + 1 :].strip()
    m = re.match(r"(\S+)\s+(.*)$", rest)
    if not m:
        return rest, ""
    shape, remainder = m.group(1), m.group(2)
    # a layout such as {1,0:T(8,128)} is part of the token already (no spaces inside)
    return shape, remainder


def _split_operands(text: str) -> tuple[str, str]:
    """``"(a, b), attrs"`` -> (``"a, b"``, ``"attrs"``) with balanced parentheses."""
    depth = 0
    for k, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return text[1:k], text[k + 1 :].lstrip(", ").strip()
    return text[1:], ""


def _split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for k, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:k].strip())
            start = k + 1
    if text[start:].strip():
        parts.append(text[start:].strip())
    return parts


def parse_instr(line: str) -> Instr | None:
    """One instruction line of HLO text, or None if the line is not an instruction."""
    m = _INSTR_RE.match(_COMMENT_RE.sub("", line))
    if not m:
        return None
    is_root, name, rest = bool(m.group(1)), m.group(2), m.group(3)
    shape, remainder = _split_shape(rest)
    om = re.match(r"([\w\-$.]+)(\(.*)$", remainder)
    if not om:
        return None
    opcode = om.group(1)
    operand_text, attrs = _split_operands(om.group(2))
    names, shapes = [], []
    if opcode == "constant":
        return Instr(name, shape, opcode, [], [], attrs, is_root, operand_text.strip())
    for part in _split_top_level(operand_text):
        nm = re.search(r"%?([\w.\-$]+)\s*$", part)
        if not nm:
            continue
        names.append(nm.group(1))
        head = part[: nm.start()].strip()
        shapes.append(head)
    return Instr(name, shape, opcode, names, shapes, attrs, is_root)


def parse_module(text: str) -> dict[str, Computation]:
    """HLO module text -> {computation name: Computation}, in file order."""
    comps: dict[str, Computation] = {}
    current: Computation | None = None
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip() or line.lstrip().startswith("//"):
            continue
        if current is None:
            m = _COMP_HEADER_RE.match(line.strip())
            if m and not line.startswith("HloModule"):
                current = Computation(m.group(2), [], is_entry=bool(m.group(1)))
            continue
        if line.strip() == "}":
            comps[current.name] = current
            current = None
            continue
        instr = parse_instr(line)
        if instr is not None:
            current.instrs.append(instr)
    return comps


def entry_name(comps: dict[str, Computation]) -> str:
    for name, comp in comps.items():
        if comp.is_entry:
            return name
    raise ValueError("the HLO module has no ENTRY computation")
