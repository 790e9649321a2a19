"""XLA's HLO text parsed (benchmarks/hlo/parse.py): shapes and their bytes, one instruction, a
whole module with its computations and entry; pure Python, runs everywhere."""

from __future__ import annotations

from benchmark_scripts import load
from hlo_cases import HLO

parse = load("hlo.parse")


def test_shape_bytes_sums_tuples_and_dtypes():
    assert parse.shape_bytes("f32[2,3]{1,0}") == 24
    assert parse.shape_bytes("(f32[2,3]{1,0}, bf16[4]{0}, pred[5], s32[])") == 24 + 8 + 5 + 4
    assert parse.array_shapes("(s32[], f32[3,4,64]{2,1,0})") == [("s32", ()), ("f32", (3, 4, 64))]


def test_parse_instr_reads_shape_opcode_operands_and_comments():
    line = (
        "  ROOT %t = (s32[], /*index=1*/f32[4,8]{1,0}) tuple(%a, /*index=1*/%b), "
        'metadata={op_name="x"}'
    )
    instr = parse.parse_instr(line)
    assert (instr.name, instr.opcode, instr.operands, instr.is_root) == (
        "t",
        "tuple",
        ["a", "b"],
        True,
    )
    assert parse.array_shapes(instr.shape) == [("s32", ()), ("f32", (4, 8))]
    const = parse.parse_instr("  %c = s32[] constant(42)")
    assert const.opcode == "constant" and const.literal == "42" and const.operands == []


def test_parse_module_finds_every_computation_and_the_entry():
    comps = parse.parse_module(HLO)
    assert parse.entry_name(comps) == "main"
    assert {"main", "main_fwd_body", "main_bwd_body", "hyper_body", "fused_dus"} <= set(comps)
    assert comps["main_fwd_body"].root.opcode == "tuple"
