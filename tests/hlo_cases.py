# ruff: noqa: E501  (the HLO fixture below is real-length HLO lines)
"""A hand-written optimised-HLO module for the compile report's tests (benchmarks/hlo/)."""

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
