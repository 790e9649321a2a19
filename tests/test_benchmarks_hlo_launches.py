# ruff: noqa: E501  (the HLO fixtures below are real-length HLO lines)
"""The HLO launch accounting (benchmarks/hlo/launches.py), on HLO text written
here: pure Python, runs everywhere."""

from __future__ import annotations

import pytest
from benchmark_scripts import load
from hlo_cases import HIDDEN, HLO, SEQ

hl = load("hlo.launches")


F32 = 4


@pytest.fixture(scope="module")
def comps():
    return hl.parse_module(HLO)


def _loops(comps):
    return {lp.name: lp for lp in hl.classify_loops(hl.find_loops(comps), SEQ, HIDDEN)}


def test_trip_counts_from_backend_config_and_from_the_condition(comps):
    whiles = {i.name: i for c in comps.values() for i in c.instrs if i.opcode == "while"}
    assert hl.trip_count(whiles["while.fwd"], comps) == 3  # known_trip_count
    assert hl.trip_count(whiles["while.hyper"], comps) == 3  # compare LT constant(3)
    assert hl.trip_count(whiles["while.layers"], comps) == 2
    assert hl.trip_count(whiles["while.plain"], comps) == 5  # via the condition's fusion


# ----------------------------------------------------------------------------- loops


def test_time_loops_are_classified_by_carried_shapes_and_order(comps):
    loops = _loops(comps)
    assert set(loops) == {"while.hyper", "while.fwd", "while.bwd"}  # not the 5-trip loop
    assert (loops["while.hyper"].part, loops["while.hyper"].role) == ("hyper", "forward")
    assert (loops["while.fwd"].part, loops["while.fwd"].role) == ("main", "forward")
    assert (loops["while.bwd"].part, loops["while.bwd"].role) == ("main", "backward")


def test_launches_per_step_count_work_not_plumbing(comps):
    loops = _loops(comps)
    # hyper: kernel call + counter fusion (tuple / get-tuple-element are not launches)
    assert hl.per_step(loops["while.hyper"].launches) == 2
    # main fwd: pad, convert, gemm, 2 x (layer tanh + counter) from the nested loop,
    # the call's tanh, copy, dynamic-update-slice, counter = 11
    assert hl.per_step(loops["while.fwd"].launches) == 11
    # main bwd: dynamic-slice fusion, cuBLAS gemm, slice, store, counter
    assert hl.per_step(loops["while.bwd"].launches) == 5
    assert loops["while.fwd"].cond_launches == 1


def test_movement_launches_are_named_by_kind(comps):
    loops = _loops(comps)
    assert hl.movement_counts(loops["while.fwd"].launches) == {
        "pad": 1,
        "convert": 1,
        "copy": 1,
        "store": 1,  # the dynamic-update-slice fusion
    }
    assert hl.movement_counts(loops["while.bwd"].launches) == {"slice": 1, "store": 1}
    # the store fusion copies and writes a slice: it contains a copy
    assert hl.watched_op_counts(loops["while.bwd"].launches) == {"copy": 1}
    # the pad and the convert write [128, 128] copies of W [64, 128] (hidden 64)
    assert hl.weight_op_counts(loops["while.fwd"].launches, HIDDEN) == {"pad": 1, "convert": 1}
    assert hl.weight_op_counts(loops["while.bwd"].launches, HIDDEN) == {}
    cats = hl.category_counts(loops["while.fwd"].launches)
    assert cats["gemm"] == 1 and cats["pad"] == 1 and cats["convert"] == 1


def _launch(comps, loop, name):
    return next(lc for lc in _loops(comps)[loop].launches if lc.name == name)


def test_bytes_count_operands_and_results_with_in_place_slices(comps):
    pad = _launch(comps, "while.fwd", "loop_pad_fusion")
    assert pad.bytes == 64 * 128 * F32 + 128 * 128 * F32
    convert = _launch(comps, "while.fwd", "loop_convert_fusion")
    assert convert.bytes == 128 * 128 * F32 + 128 * 128 * 2
    # dynamic-update-slice into the [3, 4, 64] buffer: the update is read and written,
    # plus the index, not the whole buffer
    dus = _launch(comps, "while.fwd", "loop_dynamic_update_slice_fusion")
    assert dus.bytes == 4 * 64 * F32 + 4 + 4 * 64 * F32
    # dynamic-slice of the buffer: the slice read, the index, the slice written
    ds = _launch(comps, "while.bwd", "loop_dynamic_slice_fusion")
    assert ds.bytes == 4 * 64 * F32 + 4 + 4 * 64 * F32
    # a buffer passed twice (the kernel call's s) is read once
    tri = _launch(comps, "while.hyper", "pallas_call.1")
    assert tri.bytes == 4 * 8 * F32 + (4 * 8 + 4 * 2 * 8) * F32


FUSED_CHAIN = """\
%fused_chain (param_0: f32[3,2,4,64], param_1: s32[], param_2: f32[4,64]) -> f32[4,64] {
  %param_1 = s32[] parameter(1)
  %param_0 = f32[3,2,4,64]{3,2,1,0} parameter(0)
  %c0 = s32[] constant(0)
  %ds = f32[1,2,4,64]{3,2,1,0} dynamic-slice(%param_0, %param_1, %c0, %c0, %c0), dynamic_slice_sizes={1,2,4,64}
  %bc = f32[2,4,64]{2,1,0} bitcast(%ds)
  %sl = f32[1,4,64]{2,1,0} slice(%bc), slice={[1:2], [0:4], [0:64]}
  %bc2 = f32[4,64]{1,0} bitcast(%sl)
  %param_2 = f32[4,64]{1,0} parameter(2)
  ROOT %add = f32[4,64]{1,0} add(%bc2, %param_2)
}

ENTRY %main (buf: f32[3,2,4,64], i: s32[], x: f32[4,64]) -> f32[4,64] {
  %buf = f32[3,2,4,64]{3,2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %x = f32[4,64]{1,0} parameter(2)
  ROOT %f = f32[4,64]{1,0} fusion(%buf, %i, %x), kind=kLoop, calls=%fused_chain
}
"""
# the buffer as the last operand: fusion operand k is parameter(k), whatever the order
FUSED_CHAIN_BUFFER_LAST = (
    FUSED_CHAIN.replace("parameter(0)", "parameter(@)")
    .replace("parameter(2)", "parameter(0)")
    .replace("parameter(@)", "parameter(2)")
    .replace("fusion(%buf, %i, %x)", "fusion(%x, %i, %buf)")
)


@pytest.mark.parametrize("text", [FUSED_CHAIN, FUSED_CHAIN_BUFFER_LAST])
def test_bytes_follow_slice_chains_to_the_elements_used(text):
    comps = hl.parse_module(text)
    (launch,) = hl.computation_launches("main", comps)
    # one [4, 64] layer of one step of the [3, 2, 4, 64] buffer, the index, x, the result;
    # fusion operand k is the fused computation's parameter(k), whatever the listing order
    assert launch.bytes == 4 * 64 * F32 + 4 + 4 * 64 * F32 + 4 * 64 * F32


def test_flops_of_dots_gemm_custom_calls_and_elementwise(comps):
    gemm = _launch(comps, "while.fwd", "gemm_fusion_dot")
    assert gemm.flops == 2 * 4 * 64 * 128 and gemm.category == "gemm"
    cublas = _launch(comps, "while.bwd", "custom-call.g")
    assert cublas.flops == 2 * 4 * 64 * 128 and cublas.category == "gemm"
    assert _launch(comps, "while.fwd", "loop_pad_fusion").flops == 0


def test_input_dtype_reads_the_fused_dot_operands():
    comps = hl.parse_module(HLO)
    fwd = {lc.name: lc for lc in _loops(comps)["while.fwd"].launches}
    assert fwd["gemm_fusion_dot"].input_dtype == "f32"
    bf16 = HLO.replace(
        "%gemm_computation (p0: f32[4,64], p1: f32[64,128]) -> f32[4,128] {\n"
        "  %p0 = f32[4,64]{1,0} parameter(0)",
        "%gemm_computation (p0: bf16[4,64], p1: f32[64,128]) -> f32[4,128] {\n"
        "  %p0 = bf16[4,64]{1,0} parameter(0)",
    )
    assert bf16 != HLO
    fwd = {lc.name: lc for lc in _loops(hl.parse_module(bf16))["while.fwd"].launches}
    assert fwd["gemm_fusion_dot"].input_dtype == "bf16"


# ----------------------------------------------------------------------------- bytes read

# The compile report's persistent step, in small: layer 0 of every step of a phase-major
# [T * L, B, n] array (T 3, L 2, B 4, n 64) read by a strided slice, but through a bitcast,
# a transpose and a pad first (the padded z of `rhhjax.ops.persistent`, [L, T * B, n] as the
# hyper projection writes it). The old rule counts the whole operand whenever its first use
# is not a slice; the corrected rule counts layer 0 only.
THROUGH_TRANSPOSE_PAD = """\
%fused_z0 (param_0: f32[2,12,60]) -> f32[3,4,64] {
  %param_0 = f32[2,12,60]{2,1,0} parameter(0)
  %bc = f32[2,3,4,60]{3,2,1,0} bitcast(%param_0)
  %tr = f32[3,2,4,60]{3,2,1,0} transpose(%bc), dimensions={1,0,2,3}
  %zero = f32[] constant(0)
  %pad = f32[3,2,4,64]{3,2,1,0} pad(%tr, %zero), padding=0_0x0_0x0_0x0_4
  %bc2 = f32[6,4,64]{2,1,0} bitcast(%pad)
  ROOT %sl = f32[3,4,64]{2,1,0} slice(%bc2), slice={[0:6:2], [0:4], [0:64]}
}

ENTRY %main (z: f32[2,12,60]) -> f32[3,4,64] {
  %z = f32[2,12,60]{2,1,0} parameter(0)
  ROOT %f = f32[3,4,64]{2,1,0} fusion(%z), kind=kLoop, calls=%fused_z0
}
"""

# A read through a reshape, then a slice: the first half of the rows.
THROUGH_RESHAPE = """\
%fused_half (param_0: f32[8,64], param_1: f32[4,2,32]) -> f32[2,2,32] {
  %param_0 = f32[8,64]{1,0} parameter(0)
  %rs = f32[4,2,64]{2,1,0} reshape(%param_0)
  %sl = f32[2,2,32]{2,1,0} slice(%rs), slice={[0:2], [0:2], [0:32]}
  %param_1 = f32[4,2,32]{2,1,0} parameter(1)
  %sl1 = f32[2,2,32]{2,1,0} slice(%param_1), slice={[2:4], [0:2], [0:32]}
  ROOT %add = f32[2,2,32]{2,1,0} add(%sl, %sl1)
}

ENTRY %main (a: f32[8,64], b: f32[4,2,32]) -> f32[2,2,32] {
  %a = f32[8,64]{1,0} parameter(0)
  %b = f32[4,2,32]{2,1,0} parameter(1)
  ROOT %f = f32[2,2,32]{2,1,0} fusion(%a, %b), kind=kLoop, calls=%fused_half
}
"""


def _only_launch(text):
    comps = hl.parse_module(text)
    (launch,) = hl.computation_launches("main", comps)
    return launch


def test_bytes_read_follow_a_transpose_and_a_pad_to_the_strided_slice():
    launch = _only_launch(THROUGH_TRANSPOSE_PAD)
    result = 3 * 4 * 64 * F32
    whole = 2 * 12 * 60 * F32
    assert launch.bytes == whole + result  # the old rule: the whole operand, unchanged
    # the corrected rule: one layer of two (the stride-2 slice), the pad's zeros not read
    assert launch.bytes_read == whole // 2 + result


def test_bytes_read_follow_a_reshape_to_the_slice():
    launch = _only_launch(THROUGH_RESHAPE)
    result = 2 * 2 * 32 * F32
    # operand 0 through a reshape: the old rule counts all 8 x 64, operand 1 (a slice first)
    # its slice under both rules
    assert launch.bytes == 8 * 64 * F32 + 2 * 2 * 32 * F32 + result
    assert launch.bytes_read == 2 * 2 * 32 * F32 + 2 * 2 * 32 * F32 + result


def test_bytes_read_follow_a_convert_to_the_strided_slice():
    """A convert between the operand and its slice (the bf16 head reading the last layer
    of the persistent states from packed): the slice's elements, in the operand's dtype."""
    text = """\
%fused_last (param_0: f32[8,4,64]) -> bf16[2,4,64] {
  %param_0 = f32[8,4,64]{2,1,0} parameter(0)
  %cv = bf16[8,4,64]{2,1,0} convert(%param_0)
  ROOT %sl = bf16[2,4,64]{2,1,0} slice(%cv), slice={[3:8:4], [0:4], [0:64]}
}

ENTRY %main (a: f32[8,4,64]) -> bf16[2,4,64] {
  %a = f32[8,4,64]{2,1,0} parameter(0)
  ROOT %f = bf16[2,4,64]{2,1,0} fusion(%a), kind=kLoop, calls=%fused_last
}
"""
    launch = _only_launch(text)
    result = 2 * 4 * 64 * 2
    assert launch.bytes == 8 * 4 * 64 * F32 + result  # the old rule: the whole operand
    assert launch.bytes_read == 2 * 4 * 64 * F32 + result
    # a convert that the root reads whole still reads it all
    whole = text.replace(
        "ROOT %sl = bf16[2,4,64]{2,1,0} slice(%cv), slice={[3:8:4], [0:4], [0:64]}",
        "%sl = bf16[2,4,64]{2,1,0} slice(%cv), slice={[3:8:4], [0:4], [0:64]}\n"
        "  ROOT %t = (bf16[2,4,64]{2,1,0}, bf16[8,4,64]{2,1,0}) tuple(%sl, %cv)",
    )
    whole = whole.replace(
        "-> bf16[2,4,64] {\n  %param_0", "-> (bf16[2,4,64], bf16[8,4,64]) {\n  %param_0"
    )
    assert _only_launch(whole).bytes_read >= 8 * 4 * 64 * F32


def test_bytes_read_equal_the_old_rule_where_it_already_counted_the_slice(comps):
    for lp in _loops(comps).values():
        for launch in lp.launches:
            if launch.opcode == "slice":  # unfused: its result, not its operand (below)
                assert launch.bytes_read < launch.bytes
                continue
            assert launch.bytes_read == launch.bytes, launch.name
    for text in (FUSED_CHAIN, FUSED_CHAIN_BUFFER_LAST):
        launch = _only_launch(text)
        assert launch.bytes_read == launch.bytes


def test_bytes_read_count_a_whole_operand_when_any_use_reads_it_all():
    # the reshaped operand is also added whole: no saving
    text = THROUGH_RESHAPE.replace(
        "ROOT %add = f32[2,2,32]{2,1,0} add(%sl, %sl1)",
        "%add = f32[2,2,32]{2,1,0} add(%sl, %sl1)\n"
        "  %neg = f32[4,2,64]{2,1,0} negate(%rs)\n"
        "  ROOT %t = (f32[2,2,32]{2,1,0}, f32[4,2,64]{2,1,0}) tuple(%add, %neg)",
    ).replace("-> f32[2,2,32] {\n  %param_0", "-> (f32[2,2,32], f32[4,2,64]) {\n  %param_0")
    launch = _only_launch(text)
    assert launch.bytes_read >= 8 * 64 * F32


def test_an_unfused_slice_reads_its_result_under_the_corrected_rule():
    text = """\
ENTRY %main (a: f32[8,64]) -> f32[2,64] {
  %a = f32[8,64]{1,0} parameter(0)
  ROOT %s = f32[2,64]{1,0} slice(%a), slice={[0:8:4], [0:64]}
}
"""
    launch = _only_launch(text)
    assert launch.bytes == 8 * 64 * F32 + 2 * 64 * F32
    assert launch.bytes_read == 2 * 2 * 64 * F32
