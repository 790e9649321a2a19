# ruff: noqa: E501  (the HLO fixtures below are real-length HLO lines)
"""The GPU compile report (benchmarks/gpu_report.py, benchmarks/hlo_launches.py).

The parser tests run everywhere (pure Python, on HLO text written here). The tests marked
``gpu_compile`` compile the Pallas kernels for an H100 without a GPU; they need the JAX CUDA
plugin (a second venv, see README "GPU compile report") and skip without it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


def _load(name: str):
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


hl = _load("hlo_launches")
report = _load("gpu_report")
compare_reports = _load("gpu_report_compare")

# A hand-written optimised-HLO module with the shapes of a tiny HyperRHN (seq_len 3,
# hidden 64, hyper 8): a hyper forward loop, a main forward loop (with a nested 2-trip
# layer loop and a call), a main backward loop, and a 5-trip loop that is not a time loop.
HLO = """\
HloModule jit_step_fn, is_scheduled=true, entry_computation_layout={(f32[64,128]{1,0})->f32[]}

%fused_pad (param_0: f32[64,128]) -> f32[128,128] {
  %param_0 = f32[64,128]{1,0} parameter(0)
  %constant_1 = f32[] constant(0)
  ROOT %pad.1 = f32[128,128]{1,0} pad(%param_0, %constant_1), padding=0_64x0_0
}

%fused_convert (param_0.1: f32[128,128]) -> bf16[128,128] {
  %param_0.1 = f32[128,128]{1,0} parameter(0)
  ROOT %convert.1 = bf16[128,128]{1,0} convert(%param_0.1)
}

%fused_tanh (param_0.2: f32[4,64]) -> f32[4,64] {
  %param_0.2 = f32[4,64]{1,0} parameter(0)
  ROOT %tanh.1 = f32[4,64]{1,0} tanh(%param_0.2)
}

%fused_dus (param_0.3: f32[3,4,64], param_1.3: s32[], param_2.3: f32[4,64]) -> f32[3,4,64] {
  %param_0.3 = f32[3,4,64]{2,1,0} parameter(0)
  %param_2.3 = f32[4,64]{1,0} parameter(2)
  %bitcast.9 = f32[1,4,64]{2,1,0} bitcast(%param_2.3)
  %param_1.3 = s32[] parameter(1)
  %constant_0 = s32[] constant(0)
  ROOT %dynamic-update-slice.1 = f32[3,4,64]{2,1,0} dynamic-update-slice(%param_0.3, %bitcast.9, %param_1.3, %constant_0, %constant_0)
}

%fused_ds (param_0.4: f32[3,4,64], param_1.4: s32[]) -> f32[4,64] {
  %param_0.4 = f32[3,4,64]{2,1,0} parameter(0)
  %param_1.4 = s32[] parameter(1)
  %constant_2 = s32[] constant(0)
  %dynamic-slice.1 = f32[1,4,64]{2,1,0} dynamic-slice(%param_0.4, %param_1.4, %constant_2, %constant_2), dynamic_slice_sizes={1,4,64}
  ROOT %bitcast.10 = f32[4,64]{1,0} bitcast(%dynamic-slice.1)
}

%gemm_computation (p0: f32[4,64], p1: f32[64,128]) -> f32[4,128] {
  %p0 = f32[4,64]{1,0} parameter(0)
  %p1 = f32[64,128]{1,0} parameter(1)
  ROOT %dot.1 = f32[4,128]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_add (param_0.5: s32[]) -> s32[] {
  %param_0.5 = s32[] parameter(0)
  %constant_3 = s32[] constant(1)
  ROOT %add.1 = s32[] add(%param_0.5, %constant_3)
}

%fused_compare (param_0.6: s32[]) -> pred[] {
  %param_0.6 = s32[] parameter(0)
  %constant_4 = s32[] constant(3)
  ROOT %compare.1 = pred[] compare(%param_0.6, %constant_4), direction=LT
}

%cond_time (arg.c: (s32[], f32[4,64], f32[64,128])) -> pred[] {
  %arg.c = (s32[], f32[4,64]{1,0}, f32[64,128]{1,0}) parameter(0)
  %gte.c = s32[] get-tuple-element(%arg.c), index=0
  ROOT %loop_compare_fusion = pred[] fusion(%gte.c), kind=kLoop, calls=%fused_compare
}

%cond_plain (arg.p: (s32[], f32[4,8])) -> pred[] {
  %arg.p = (s32[], f32[4,8]{1,0}) parameter(0)
  %gte.p = s32[] get-tuple-element(%arg.p), index=0
  %constant_7 = s32[] constant(3)
  ROOT %compare.2 = pred[] compare(%gte.p, %constant_7), direction=LT
}

%fused_compare5 (param_0.7: s32[]) -> pred[] {
  %param_0.7 = s32[] parameter(0)
  %constant_5 = s32[] constant(5)
  ROOT %compare.5 = pred[] compare(%param_0.7, %constant_5), direction=LT
}

%cond_plain5 (arg.p5: (s32[], f32[4,8])) -> pred[] {
  %arg.p5 = (s32[], f32[4,8]{1,0}) parameter(0)
  %gte.p5 = s32[] get-tuple-element(%arg.p5), index=0
  ROOT %loop_compare_fusion.5 = pred[] fusion(%gte.p5), kind=kLoop, calls=%fused_compare5
}

%hyper_body (arg.h: (s32[], f32[4,8])) -> (s32[], f32[4,8]) {
  %arg.h = (s32[], f32[4,8]{1,0}) parameter(0)
  %i.h = s32[] get-tuple-element(%arg.h), index=0
  %s.h = f32[4,8]{1,0} get-tuple-element(%arg.h), index=1
  %pallas_call.1 = (f32[4,8]{1,0}, f32[4,2,8]{2,1,0}) custom-call(%s.h, %s.h), custom_call_target="__gpu$xla.gpu.triton", backend_config={name = "highway_forward", num_warps = 4 : i32}
  %gte.h = f32[4,8]{1,0} get-tuple-element(%pallas_call.1), index=0
  %next.h = s32[] fusion(%i.h), kind=kLoop, calls=%fused_add
  ROOT %tuple.h = (s32[], f32[4,8]{1,0}) tuple(%next.h, %gte.h)
}

%layer_body (arg.l: (s32[], f32[4,64])) -> (s32[], f32[4,64]) {
  %arg.l = (s32[], f32[4,64]{1,0}) parameter(0)
  %i.l = s32[] get-tuple-element(%arg.l), index=0
  %s.l = f32[4,64]{1,0} get-tuple-element(%arg.l), index=1
  %loop_tanh_fusion.l = f32[4,64]{1,0} fusion(%s.l), kind=kLoop, calls=%fused_tanh
  %next.l = s32[] fusion(%i.l), kind=kLoop, calls=%fused_add
  ROOT %tuple.l = (s32[], f32[4,64]{1,0}) tuple(%next.l, %loop_tanh_fusion.l)
}

%cond_layer (arg.cl: (s32[], f32[4,64])) -> pred[] {
  %arg.cl = (s32[], f32[4,64]{1,0}) parameter(0)
  %gte.cl = s32[] get-tuple-element(%arg.cl), index=0
  %constant_8 = s32[] constant(2)
  ROOT %compare.3 = pred[] compare(%gte.cl, %constant_8), direction=LT
}

%called (pc: f32[4,64]) -> f32[4,64] {
  %pc = f32[4,64]{1,0} parameter(0)
  ROOT %loop_tanh_fusion.c = f32[4,64]{1,0} fusion(%pc), kind=kLoop, calls=%fused_tanh
}

%main_fwd_body (arg.m: (s32[], f32[4,64], f32[64,128], f32[3,4,64])) -> (s32[], f32[4,64], f32[64,128], f32[3,4,64]) {
  %arg.m = (s32[], f32[4,64]{1,0}, f32[64,128]{1,0}, f32[3,4,64]{2,1,0}) parameter(0)
  %i.m = s32[] get-tuple-element(%arg.m), index=0
  %s.m = f32[4,64]{1,0} get-tuple-element(%arg.m), index=1
  %w.m = f32[64,128]{1,0} get-tuple-element(%arg.m), index=2
  %buf.m = f32[3,4,64]{2,1,0} get-tuple-element(%arg.m), index=3
  %loop_pad_fusion = f32[128,128]{1,0} fusion(%w.m), kind=kLoop, calls=%fused_pad
  %loop_convert_fusion = bf16[128,128]{1,0} fusion(%loop_pad_fusion), kind=kLoop, calls=%fused_convert
  %gemm_fusion_dot = f32[4,128]{1,0} fusion(%s.m, %w.m), kind=kCustom, calls=%gemm_computation, backend_config={"fusion_backend_config":{"kind":"__triton_nested_gemm_fusion"}}
  %bitcast.m = f32[4,2,64]{2,1,0} bitcast(%gemm_fusion_dot)
  %tuple.in = (s32[], f32[4,64]{1,0}) tuple(%i.m, %s.m)
  %while.layers = (s32[], f32[4,64]{1,0}) while(%tuple.in), condition=%cond_layer, body=%layer_body
  %gte.layers = f32[4,64]{1,0} get-tuple-element(%while.layers), index=1
  %call.1 = f32[4,64]{1,0} call(%gte.layers), to_apply=%called
  %copy.1 = f32[4,64]{1,0} copy(%call.1)
  %loop_dynamic_update_slice_fusion = f32[3,4,64]{2,1,0} fusion(%buf.m, %i.m, %copy.1), kind=kLoop, calls=%fused_dus
  %next.m = s32[] fusion(%i.m), kind=kLoop, calls=%fused_add
  ROOT %tuple.m = (s32[], f32[4,64]{1,0}, f32[64,128]{1,0}, f32[3,4,64]{2,1,0}) tuple(%next.m, %copy.1, %w.m, %loop_dynamic_update_slice_fusion)
}

%fused_store (param_0.8: f32[3,4,64], param_1.8: s32[], param_2.8: f32[4,64]) -> f32[3,4,64] {
  %param_0.8 = f32[3,4,64]{2,1,0} parameter(0)
  %param_2.8 = f32[4,64]{1,0} parameter(2)
  %copy.8 = f32[4,64]{0,1} copy(%param_2.8)
  %bitcast.8 = f32[1,4,64]{2,1,0} bitcast(%copy.8)
  %param_1.8 = s32[] parameter(1)
  %constant_10 = s32[] constant(0)
  ROOT %dynamic-update-slice.8 = f32[3,4,64]{2,1,0} dynamic-update-slice(%param_0.8, %bitcast.8, %param_1.8, %constant_10, %constant_10)
}

%main_bwd_body (arg.b: (s32[], f32[4,64], f32[64,128], f32[3,4,64])) -> (s32[], f32[4,64], f32[64,128], f32[3,4,64]) {
  %arg.b = (s32[], f32[4,64]{1,0}, f32[64,128]{1,0}, f32[3,4,64]{2,1,0}) parameter(0)
  %i.b = s32[] get-tuple-element(%arg.b), index=0
  %w.b = f32[64,128]{1,0} get-tuple-element(%arg.b), index=2
  %buf.b = f32[3,4,64]{2,1,0} get-tuple-element(%arg.b), index=3
  %loop_dynamic_slice_fusion = f32[4,64]{1,0} fusion(%buf.b, %i.b), kind=kLoop, calls=%fused_ds
  %custom-call.g = (f32[4,128]{1,0}, s8[1024]{0}) custom-call(%loop_dynamic_slice_fusion, %w.b), custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"]}}}
  %gte.g = f32[4,128]{1,0} get-tuple-element(%custom-call.g), index=0
  %slice.b = f32[4,64]{1,0} slice(%gte.g), slice={[0:4], [0:64]}
  %loop_store_fusion = f32[3,4,64]{2,1,0} fusion(%buf.b, %i.b, %slice.b), kind=kLoop, calls=%fused_store
  %next.b = s32[] fusion(%i.b), kind=kLoop, calls=%fused_add
  ROOT %tuple.b = (s32[], f32[4,64]{1,0}, f32[64,128]{1,0}, f32[3,4,64]{2,1,0}) tuple(%next.b, %slice.b, %w.b, %loop_store_fusion)
}

%plain_body (arg.q: (s32[], f32[4,8])) -> (s32[], f32[4,8]) {
  %arg.q = (s32[], f32[4,8]{1,0}) parameter(0)
  %i.q = s32[] get-tuple-element(%arg.q), index=0
  %s.q = f32[4,8]{1,0} get-tuple-element(%arg.q), index=1
  %next.q = s32[] fusion(%i.q), kind=kLoop, calls=%fused_add
  ROOT %tuple.q = (s32[], f32[4,8]{1,0}) tuple(%next.q, %s.q)
}

ENTRY %main (w: f32[64,128]) -> f32[] {
  %w = f32[64,128]{1,0} parameter(0)
  %constant_9 = s32[] constant(0)
  %zeros = f32[4,8]{1,0} broadcast(%constant_9), dimensions={}
  %init.h = (s32[], f32[4,8]{1,0}) tuple(%constant_9, %zeros)
  %while.hyper = (s32[], f32[4,8]{1,0}) while(%init.h), condition=%cond_plain, body=%hyper_body
  %zeros.m = f32[4,64]{1,0} broadcast(%constant_9), dimensions={}
  %buf0 = f32[3,4,64]{2,1,0} broadcast(%constant_9), dimensions={}
  %init.m = (s32[], f32[4,64]{1,0}, f32[64,128]{1,0}, f32[3,4,64]{2,1,0}) tuple(%constant_9, %zeros.m, %w, %buf0)
  %while.fwd = (s32[], f32[4,64]{1,0}, f32[64,128]{1,0}, f32[3,4,64]{2,1,0}) while(%init.m), condition=%cond_time, body=%main_fwd_body, backend_config={"known_trip_count":{"n":"3"},"known_init_step":{"init":"0","step":"1"}}
  %while.bwd = (s32[], f32[4,64]{1,0}, f32[64,128]{1,0}, f32[3,4,64]{2,1,0}) while(%while.fwd), condition=%cond_time, body=%main_bwd_body, backend_config={"known_trip_count":{"n":"3"}}
  %init.q = (s32[], f32[4,8]{1,0}) tuple(%constant_9, %zeros)
  %while.plain = (s32[], f32[4,8]{1,0}) while(%init.q), condition=%cond_plain5, body=%plain_body
  %gte.out = f32[4,64]{1,0} get-tuple-element(%while.bwd), index=1
  ROOT %reduce_fusion = f32[] fusion(%gte.out), kind=kInput, calls=%fused_tanh
}
"""

SEQ, HIDDEN = 3, 64
F32 = 4


@pytest.fixture(scope="module")
def comps():
    return hl.parse_module(HLO)


def _loops(comps):
    return {lp.name: lp for lp in hl.classify_loops(hl.find_loops(comps), SEQ, HIDDEN)}


# ----------------------------------------------------------------------------- parsing


def test_shape_bytes_sums_tuples_and_dtypes():
    assert hl.shape_bytes("f32[2,3]{1,0}") == 24
    assert hl.shape_bytes("(f32[2,3]{1,0}, bf16[4]{0}, pred[5], s32[])") == 24 + 8 + 5 + 4
    assert hl.array_shapes("(s32[], f32[3,4,64]{2,1,0})") == [("s32", ()), ("f32", (3, 4, 64))]


def test_parse_instr_reads_shape_opcode_operands_and_comments():
    line = (
        "  ROOT %t = (s32[], /*index=1*/f32[4,8]{1,0}) tuple(%a, /*index=1*/%b), "
        'metadata={op_name="x"}'
    )
    instr = hl.parse_instr(line)
    assert (instr.name, instr.opcode, instr.operands, instr.is_root) == (
        "t",
        "tuple",
        ["a", "b"],
        True,
    )
    assert hl.array_shapes(instr.shape) == [("s32", ()), ("f32", (4, 8))]
    const = hl.parse_instr("  %c = s32[] constant(42)")
    assert const.opcode == "constant" and const.literal == "42" and const.operands == []


def test_parse_module_finds_every_computation_and_the_entry(comps):
    assert hl.entry_name(comps) == "main"
    assert {"main", "main_fwd_body", "main_bwd_body", "hyper_body", "fused_dus"} <= set(comps)
    assert comps["main_fwd_body"].root.opcode == "tuple"


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
    # hyper: triton call + counter fusion (tuple / get-tuple-element are not launches)
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
    # a buffer passed twice (the triton call's s) is read once
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


def test_triton_flops_find_the_weight_and_state_operands():
    table = {
        "s": hl.parse_instr("  %s = f32[256,1024]{1,0} parameter(0)"),
        "w": hl.parse_instr("  %w = f32[1024,2,1024]{2,1,0} parameter(1)"),
        "x": hl.parse_instr("  %x = f32[256,2,1024]{2,1,0} parameter(2)"),
    }
    call = hl.parse_instr(
        "  %k = (f32[256,1024]{1,0}) custom-call(%s, %w, %w, %x), "
        'custom_call_target="__gpu$xla.gpu.triton"'
    )
    assert hl.triton_flops(call, table) == 2 * 256 * 1024 * 2048
    elementwise = hl.parse_instr(
        '  %e = f32[256,1024]{1,0} custom-call(%s, %x), custom_call_target="__gpu$xla.gpu.triton"'
    )
    assert hl.triton_flops(elementwise, table) == 0


def test_summarize_splits_counts_and_predicts_time():
    model = hl.CostModel(launch_s=1e-6, hbm_bytes_per_s=1e9, f32_matmul_flops=1e12)
    s = hl.summarize(HLO, SEQ, HIDDEN, model)
    assert s["launches_split"] == {"hyper_forward": 2, "main_backward": 5, "main_forward": 11}
    assert s["launches_per_step"] == 18
    assert s["movement_per_step"] == {"convert": 1, "copy": 1, "pad": 1, "slice": 1, "store": 2}
    assert s["weight_sized_ops_per_step"] == {"convert": 1, "pad": 1}
    # outside the time loops: the entry's broadcasts (3), the 5-trip loop's counter x 5,
    # the final fusion
    assert s["launches_outside_loops"] == 3 + 5 + 1
    # the other loops: the 5-trip one and the layer loop nested in the forward time loop
    others = {lp["name"]: (lp["in"], lp["trips"]) for lp in s["other_loops"]}
    assert others == {"while.layers": ("main_fwd_body", 2), "while.plain": ("main", 5)}
    loops = _loops(hl.parse_module(HLO))
    in_loop = sum(
        model.seconds(lc) * lc.multiplicity for lp in loops.values() for lc in lp.launches
    )
    assert s["predicted_in_loop_ms"] == pytest.approx(in_loop * SEQ * 1e3)
    assert s["predicted_step_ms"] == pytest.approx(
        s["predicted_in_loop_ms"] + s["predicted_outside_ms"]
    )
    # each launch costs at least the launch overhead
    assert s["predicted_in_loop_ms"] >= 18 * SEQ * 1e-6 * 1e3


def test_cost_model_takes_the_max_of_compute_and_bandwidth():
    model = hl.CostModel(bf16_matmul_flops=1e12, hbm_bytes_per_s=1e9, launch_s=2e-6)
    compute_bound = hl.Launch(
        "a", "fusion", "triton_gemm", bytes=1000, flops=10**9, dtype="f32", input_dtype="bf16"
    )
    memory_bound = hl.Launch("b", "fusion", "kLoop", bytes=10**6, flops=0, dtype="f32")
    assert model.seconds(compute_bound) == pytest.approx(1e-3 + 2e-6)
    assert model.seconds(memory_bound) == pytest.approx(1e-3 + 2e-6)


def test_cost_model_rates_by_matmul_input_dtype_and_kind():
    model = hl.CostModel(
        bf16_matmul_flops=4.0, f32_matmul_flops=3.0, f32_pallas_flops=2.0, f32_simt_flops=1.0
    )

    def launch(kind, input_dtype):
        return hl.Launch("x", "custom-call", kind, 0, 1, "f32", input_dtype=input_dtype)

    assert model.rate(launch("__gpu$xla.gpu.triton", "bf16")) == 4.0  # f32 out, bf16 in
    assert model.rate(launch("__cublas$gemm", "f32")) == 3.0
    assert model.rate(launch("__gpu$xla.gpu.triton", "f32")) == 2.0
    assert model.rate(launch("kLoop", "f32")) == 1.0


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


# ----------------------------------------------------------------------------- kernel logs

THUNKS = """\
    023: kCustomKernel [prev=022 (1) | next=024 (1)] highway_forward grid: [4, 4, 1] threads: [128, 1, 1]  shared_memory: 65536 bytes
    051: kCustomKernel [prev=050 (1) | next=052 (1)] highway_forward__2 grid: [4, 32, 1] threads: [128, 1, 1]  shared_memory: 294912 bytes
    083: kCustomKernel [prev=082 (1) | next=084 (1)] loop_add_fusion grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
"""

PTXAS = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'highway_forward' for 'sm_90a'
ptxas info    : Function properties for highway_forward
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 124 registers, used 1 barriers
ptxas info    : Compiling entry function 'highway_forward__2' for 'sm_90a'
ptxas info    : Function properties for highway_forward__2
    152 bytes stack frame, 164 bytes spill stores, 144 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 16 bytes smem
"""

LOG = (
    "I1122 18:55:25.511677 9842 subprocess_compilation.cc:349] ptxas warning : Registers are "
    "spilled to local memory in function 'highway_forward__2', 164 bytes spill stores, 144 "
    "bytes spill loads\n"
)


def test_kernel_log_parsers():
    thunks = report.parse_thunk_kernels(THUNKS)
    assert thunks["highway_forward__2"] == {
        "grid": [4, 32, 1],
        "threads": [128, 1, 1],
        "shared_memory": 294912,
    }
    ptx = report.parse_ptxas_verbose(PTXAS)
    assert ptx["highway_forward"]["registers"] == 124
    assert ptx["highway_forward"]["spill_stores"] == 0
    assert ptx["highway_forward__2"] == {
        "stack": 152,
        "spill_stores": 164,
        "spill_loads": 144,
        "registers": 255,
        "static_smem": 16,
    }
    assert report.parse_spill_log(LOG) == {
        "highway_forward__2": {"spill_stores": 164, "spill_loads": 144}
    }


def test_kernel_stats_flag_spills_and_shared_memory_overflow(tmp_path):
    (tmp_path / "m.thunk_sequence.txt").write_text(THUNKS)
    hlo = (
        '%k = f32[4]{0} custom-call(%a), custom_call_target="__gpu$xla.gpu.triton", '
        'backend_config={name = "highway_forward", num_warps = 4 : i32}'
    )
    stats = {k["kernel"]: k for k in report.kernel_stats(str(tmp_path), hlo, LOG)}
    assert set(stats) == {"highway_forward", "highway_forward__2"}  # not XLA's own fusion
    assert stats["highway_forward__2"]["spills"] and stats["highway_forward__2"]["smem_overflow"]
    assert not stats["highway_forward"]["spills"]
    assert not stats["highway_forward"]["smem_overflow"]


# ----------------------------------------------------------------------------- command line


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--impls=scan,cuda"], "--impls"),
        (["--dtypes=float16"], "--dtypes"),
        (["--models=lstm"], "--models"),
        (["--ranks=-1"], "--ranks"),
        (["--ranks=a"], "--ranks"),
        (["--set=depth=3"], "--set"),
        (["--launch-us=0"], "--launch-us"),
        (["--out=/nonexistent/dir/x.json"], "--out"),
    ],
)
def test_bad_arguments_are_one_line_errors_before_any_compile(argv, message, capsys):
    assert report.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err


def test_quick_mode_and_cases():
    args = report.parse_args(["--quick"])
    todo, opts = report.resolve(args)
    assert {(c.model, c.impl, c.rank) for c in todo} == {
        ("hyperrhn", "fused", 0),
        ("hyperrhn", "pallas", 0),
    }
    assert {c.dtype for c in todo} == {"float32", "bfloat16"}
    full, _ = report.resolve(report.parse_args([]))
    # rhn: 3 impls x 2 dtypes; hyperrhn: 2 ranks x 3 impls x 2 dtypes
    assert len(full) == 6 + 12
    assert opts.cost.launch_s == pytest.approx(4e-6)


def test_table_has_one_row_per_config():
    rows = [
        {
            "model": "hyperrhn",
            "impl": "pallas",
            "dtype": "float32",
            "hyper_rank": 4,
            "status": "unsupported",
        },
    ]
    text = report.format_table(rows)
    assert text.splitlines()[-1].split()[:5] == [
        "hyperrhn",
        "r4",
        "pallas",
        "float32",
        "unsupported",
    ]


# ----------------------------------------------------------------------------- H100 compile

_PLUGIN, _WHY = report.cuda_plugin_available()
needs_cuda = pytest.mark.skipif(not _PLUGIN, reason=f"no JAX CUDA plugin here: {_WHY}")


@pytest.fixture(scope="module")
def kernel_report(tmp_path_factory):
    """The Pallas train step of a depth-3 HyperRHN at the paper widths (main n = 1000, hyper
    h = 128, batch 256: the kernels' shapes at the paper size; depth 3 has every kernel
    variant: the first micro-layer with the input projection, a middle one, the top one),
    2 time steps, compiled for an H100 in a fresh process (the deviceless environment must be
    set before JAX starts)."""
    out = tmp_path_factory.mktemp("gpu_report") / "kernels.json"
    cmd = [
        sys.executable,
        str(BENCH / "gpu_report.py"),
        "--models=hyperrhn",
        "--impls=pallas",
        "--ranks=0",
        "--dtypes=float32,bfloat16",
        "--set=model.depth=3",
        "--set=train.seq_len=2",
        f"--out={out}",
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=out.parent, env=dict(os.environ))
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(out.read_text())["rows"]


@pytest.mark.gpu_compile
@needs_cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_pallas_kernels_compile_for_h100_without_spills_or_smem_overflow(kernel_report, dtype):
    row = next(r for r in kernel_report if r["dtype"] == dtype)
    assert row["status"] == "ok", row.get("error", row)
    kernels = row["pallas_kernels"]
    names = {k["kernel"].split("__")[0] for k in kernels}
    # forward and backward kernels (hyper and main sizes) were found and measured
    assert any(n.startswith("highway_forward") for n in names), names
    assert any(n.startswith("highway_backward") for n in names), names
    assert all("registers" in k for k in kernels), "ptxas -v gave no register counts"
    spilled = [k for k in kernels if k["spills"]]
    assert not spilled, f"Pallas kernels spill registers at the default HighwayConfig: {spilled}"
    over = [k for k in kernels if k["smem_overflow"]]
    assert not over, f"Pallas kernels exceed the H100's 232448 B shared memory: {over}"


@pytest.mark.gpu_compile
@needs_cuda
def test_shared_memory_overflow_is_reported_as_a_compile_error(tmp_path):
    """The check can fail: a too-large block config must come back as a compile error.

    The kernels' own shared-memory check (`HighwayConfig.validate`) rejects the config before
    any compile, so the probe switches it off to reach XLA's compile; the probe exits non-zero
    if that method is gone or still rejects the config, and the error must come from the
    compile, not from the config check."""
    code = f"""
import sys, json
sys.path.insert(0, {str(BENCH)!r})
import gpu_report as g
g.set_deviceless_env()
import jax, jax.numpy as jnp
from rhhjax.kernels import highway as hw
mesh = g.h100_mesh()
rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
def sds(shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=rep)
config = hw.HighwayConfig(block_b=128, block_n=128, block_k=64, num_stages=4)
try:
    config.validate(jnp.float32)
    sys.exit("HighwayConfig.validate accepts the probe's config: no overflow to compile")
except hw.KernelConfigError:
    pass
geo = hw.Geometry.make(config, 256, 1000)  # n_pad = 1024
hw.HighwayConfig.validate = lambda self, dot_dtype=None: None  # reach the compile
def f(s, w3, z, bias2):
    return hw.forward_padded(s, w3, z, bias2, None, None, geo=geo, config=config)
try:
    args = sds((256, 1024)), sds((1024, 2, 1024)), sds((256, 1024)), sds((2, 1024))
    jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).compile()
    print(json.dumps({{"compiled": True}}))
except Exception as e:
    print(json.dumps({{"compiled": False, "type": type(e).__name__,
                      "error": " ".join(str(e).split())[:500]}}))
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    if run.returncode != 0 or not run.stdout.strip():
        pytest.fail(f"could not run the overflow probe: {run.stderr[-2000:]}")
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert not result["compiled"]
    assert result["type"] != "KernelConfigError", result
    assert "shared memory" in result["error"].lower(), result["error"]


def test_reanalyze_recomputes_hlo_figures_from_saved_hlo(tmp_path, capsys):
    case = report.Case("hyperrhn", "fused", "float32", 0)
    hlo_dir = tmp_path / "hlo"
    hlo_dir.mkdir()
    report.hlo_file(str(hlo_dir), case).write_text(HLO)
    row = {"model": "hyperrhn", "impl": "fused", "dtype": "float32", "hyper_rank": 0}
    row.update(status="ok", seq_len=SEQ, hidden=HIDDEN, launches_per_step=-1, memory={})
    skipped = {"model": "rhn", "impl": "pallas", "dtype": "float32", "status": "unsupported"}
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"meta": {}, "rows": [row, skipped]}))
    out = tmp_path / "new.json"
    argv = [f"--reanalyze={old}", f"--save-hlo={hlo_dir}", f"--out={out}", "--launch-us=7"]
    assert report.main(argv) == 0
    new = json.loads(out.read_text())
    assert new["rows"][0]["launches_per_step"] == 18
    assert new["rows"][0]["launches_split"]["main_forward"] == 11
    assert new["rows"][1] == skipped
    assert new["meta"]["cost_model_parameters"]["launch_s"] == pytest.approx(7e-6)
    assert "hyperrhn r0 fused float32" in capsys.readouterr().out
    # a missing HLO file is a one-line error
    report.hlo_file(str(hlo_dir), case).unlink()
    assert report.main(argv) == 2


THUNK_PASSES = """\
000: kCommandBuffer [source       | next=017 (1)]
    001: kCustomKernel [source       | next=002 (1)] loop_select_fusion_4 grid: [1, 1, 1] threads: [2, 1, 1]  shared_memory: 0 bytes
    012: kCopy         [prev=006 (6) | next=013 (1)] kCopy
017: kWhile         [prev=000 (1) | next=000 (1)]
condition:
    018: kCustomKernel [source | sink] loop_compare_fusion grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
  body:
    000: kCommandBuffer [source | sink]
        019: kCustomKernel [source       | next=023 (4)] loop_select_fusion grid: [256, 1, 1] threads: [128, 1, 1]  shared_memory: 0 bytes
        021: kCopy         [source       | next=023 (2)] kCopy
        023: kCustomKernel [prev=022 (1) | next=024 (1)] highway_forward grid: [4, 4, 1] threads: [128, 1, 1]  shared_memory: 65536 bytes
000: kCommandBuffer [prev=017 (1) | next=043 (1)]
    030: kCustomKernel [source       | next=031 (1) ] wrapped_transpose grid: [640, 1, 1] threads: [128, 1, 1]  shared_memory: 0 bytes
043: kWhile         [prev=000 (1) | next=000 (1)]
condition:
    044: kCustomKernel [source | sink] loop_compare_fusion grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
  body:
    045: kCustomKernel [source       | next=051 (6)] loop_pad_fusion_3 grid: [1024, 1, 1] threads: [128, 1, 1]  shared_memory: 0 bytes
    021: kDynamicSliceFusion [source       | next=000 (1)] params=1, results=1
        022: kCopy [source | sink] kCopy
    046: kGemm         [source       | next=051 (5)] gemm
"""


def test_thunk_loops_count_body_thunks_and_command_buffers():
    loops = report.parse_thunk_loops(THUNK_PASSES)
    assert loops == [
        {"body_thunks": 3, "condition_thunks": 1, "command_buffer": True},
        # the dynamic-slice fusion is one launch: the copy nested in it
        {"body_thunks": 3, "condition_thunks": 1, "command_buffer": False},
    ]


@pytest.mark.skipif(_PLUGIN, reason="the CUDA plugin is installed here")
def test_without_the_cuda_plugin_the_command_says_so_and_exits_2():
    run = subprocess.run(
        [sys.executable, str(BENCH / "gpu_report.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1].startswith("error: the JAX CUDA plugin")


def test_compare_table_pairs_configs_and_shows_before_and_after():
    def row(impl, launches, spill):
        return {
            "model": "hyperrhn", "hyper_rank": 0, "impl": impl, "dtype": "bfloat16",
            "status": "ok", "launches_per_step": launches,
            "launches_split": {"hyper_forward": 1, "hyper_backward": 2, "main_forward": 3,
                               "main_backward": 4},
            "weight_sized_ops_per_step": {"pad": 7, "convert": 2} if launches > 100 else {},
            "bytes_per_step": 5e6, "memory": {"peak_bytes": 7.5e9}, "predicted_step_ms": 40.0,
            "pallas_kernels": [{"registers": 90, "spill_stores": spill}],
        }  # fmt: skip

    table = compare_reports.compare(
        [row("pallas", 154, 8), row("fused", 129, 0)],
        [row("pallas", 56, 0), {"model": "rhn", "impl": "scan", "dtype": "f", "status": "ok"}],
    )
    lines = table.splitlines()
    assert len(lines) == 3  # header, separator, the one config in both reports
    assert "| hyperrhn r0 pallas bfloat16 | 154 -> 56 | 1 / 2 / 3 / 4 | 9 -> 0 |" in lines[2]
    assert "90 / 8 B -> 90 / 0 B" in lines[2]


def test_stacked_kernels_count_only_the_time_step_slice_of_whole_sequence_arrays():
    line = (
        "%pallas_call.1 = (f32[8,16]{1,0}, f32[4,3,8,3,16]{4,3,2,1,0}) custom-call("
        "s32[1]{0} %t, f32[8,16]{1,0} %s, bf16[16,2,16]{2,1,0} %w, bf16[16,2,16]{2,1,0} %w, "
        "f32[4,3,8,16]{3,2,1,0} %z, f32[4,3,8,3,16]{4,3,2,1,0} %packed), "
        'custom_call_target="__gpu$xla.gpu.triton", output_to_operand_aliasing={{1}: (5, {})}, '
        'backend_config={name = "highway_forward_stacked"}'
    )
    instr = hl.parse_instr(line)
    step = 4 * (1 + 8 * 16 + 8 * 16 + 8 * 3 * 16) + 2 * 16 * 2 * 16  # t, s, z, packed; w once
    assert hl.launch_bytes(instr, {}, {}) == step + 4 * (8 * 16 + 8 * 3 * 16)  # + results
    # The same call under another kernel name counts whole operands (and w twice).
    plain = hl.parse_instr(line.replace("highway_forward_stacked", "highway_forward"))
    assert hl.launch_bytes(plain, {}, {}) > 4 * 4 * 3 * 8 * 3 * 16


def test_backward_kernel_flops_contract_both_halves_of_the_transposed_weight():
    line = (
        "%pallas_call.2 = f32[8,16]{1,0} custom-call(f32[8,16]{1,0} %ds, "
        "bf16[2,16,16]{2,1,0} %w_t, f32[8,2,16]{2,1,0} %d), "
        'custom_call_target="__gpu$xla.gpu.triton"'
    )
    instr = hl.parse_instr(line)
    assert hl.triton_flops(instr, {}) == 2 * 8 * (2 * 16) * 16
