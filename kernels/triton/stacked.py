"""Stacked highway kernels: one micro-layer (t, layer) on whole-sequence ``[T, L, ...]`` arrays.

Inside a `lax.scan` over time, slicing the step's operands out of the stacked scan inputs and
storing the step's outputs into stacked scan outputs costs one XLA launch each (a custom call
needs materialized operands). These variants take the WHOLE stacked arrays plus the time
index `t` (a traced int32 scalar, passed to the kernel as a shape-(1,) array) and a static
`layer`, and read/write the (t, layer) slice inside the kernel. Stacked outputs are passed in
and aliased to the outputs (`input_output_aliases`): the caller carries them through the
scan, every call writes its slice in place, and nothing else of the buffer changes.
The BlockSpecs keep the leading (T, L) dims whole (Triton's power-of-two rule applies to the
loaded/stored tensors only, not to block shapes: jax/_src/pallas/triton/lowering.py,
`_check_tensor_size` on the indexer shape).

:func:`forward_stacked` is :func:`rhhjax.kernels.triton.forward.forward_padded` and
:func:`backward_fused_stacked` is :func:`rhhjax.kernels.triton.backward.backward_fused_padded`
on the (t, layer) slices (the same kernel bodies, seen through
:mod:`rhhjax.kernels.triton.stacked_views`); their references are the padded kernels on sliced
operands.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from rhhjax.kernels.triton.backward import backward_kernel, state_grad_in_kernel
from rhhjax.kernels.triton.common import (
    F32,
    MASK_DTYPES,
    SQUEEZED,
    OptionalOperands,
    check_operand,
    compiler_params,
    dot_precision,
    dropout_scale,
    pop_optional,
)
from rhhjax.kernels.triton.config import DEFAULT_CONFIG, Geometry, HighwayConfig
from rhhjax.kernels.triton.forward import forward_kernel
from rhhjax.kernels.triton.stacked_views import FREE, Value, View, check_time, lead_spec, time_spec


def _forward_stacked_kernel(t_ref, *refs, has: OptionalOperands, layer: int, **kernel_kw):
    """`forward_kernel` on the (t, layer) slices of the stacked operands.

    Refs: t_ref [1]; s_ref [block_b, n_pad]; w_h_ref, w_t_ref [n_pad, block_n]; bias_ref
    [2, block_n]; z_ref [T, L, block_b, block_n] if has.z; xproj_ref [T, block_b, 2, block_n]
    if has.xproj; mask_ref [T, L, block_b, block_n] if has.mask; packed_in (aliased, unused);
    outputs s_new_ref [block_b, block_n], packed_ref [T, L, block_b, 3, block_n].
    """
    t = t_ref[0]
    refs = list(refs)
    s_ref, w_h_ref, w_t_ref, bias_ref = refs[:4]
    del refs[:4]
    z_ref = pop_optional(refs, has.z)
    xproj_ref = pop_optional(refs, has.xproj)
    mask_ref = pop_optional(refs, has.mask)
    _, s_new_ref, packed_ref = refs
    tl4 = (t, layer, FREE, FREE)
    views = [s_ref, w_h_ref, w_t_ref, bias_ref]
    if has.z:
        views.append(View(z_ref, tl4))
    if has.xproj:
        views.append(View(xproj_ref, (t, FREE, FREE, FREE)))
    if has.mask:
        views.append(View(mask_ref, tl4))
    # The input state's block first: stored before the K loop, it holds no registers there.
    block_n = s_new_ref.shape[1]
    col = pl.ds(pl.multiple_of(pl.program_id(1) * block_n, block_n), block_n)
    packed_ref[t, layer, :, 0, :] = s_ref[:, col]
    pre = View(packed_ref, (t, layer, FREE, FREE, FREE), shift={1: 1})
    forward_kernel(*views, s_new_ref, pre, has=has, **kernel_kw)


def forward_stacked(
    t: jax.Array,
    s: jax.Array,
    w3: jax.Array,
    z_all: jax.Array | None,
    bias2: jax.Array,
    xproj_all: jax.Array | None,
    keep_all: jax.Array | None,
    packed_all: jax.Array,
    *,
    layer: int,
    keep: float = 1.0,
    geo: Geometry,
    config: HighwayConfig = DEFAULT_CONFIG,
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """:func:`forward_padded` of micro-layer (t, layer) on stacked operands: ONE launch, no
    slice or update-slice around it.

    Args:
      t: int32 scalar (traced: the scan's time index), 0 <= t < T (not checked in the kernel).
      s: [b_pad, n_pad] f32 input state (the carry).
      w3, bias2: this layer's, as in :func:`forward_padded`.
      z_all: [T, L, b_pad, n_pad] f32, or None; read at [t, layer].
      xproj_all: [T, b_pad, 2, n_pad] f32, or None (pass it at layer 0 only); read at [t].
      keep_all: [T, L, b_pad, n_pad] int8 keep decisions (0/1), or None; read at [t, layer].
      packed_all: [T, L, b_pad, 3, n_pad] f32, ALIASED to the second output (donate it: carry
        it through the scan and never use the input value again).
      layer: static layer index into the L axis.
    Returns:
      s_new [b_pad, n_pad] f32, and packed_all with ``[t, layer] = (s, pre_h, pre_t)`` (the
      input state and ``pre = s @ w`` of :func:`forward_padded`), every other entry unchanged.
    """
    config.validate(w3.dtype)
    bb, bn, n_pad, b_pad = geo.block_b, geo.block_n, geo.n_pad, geo.b_pad
    rows = (b_pad, n_pad)
    if packed_all.ndim != 5:
        raise ValueError(f"packed_all must be [T, L, b_pad, 3, n_pad], got {packed_all.shape}.")
    steps, depth = packed_all.shape[:2]
    if not 0 <= layer < depth:
        raise ValueError(f"layer must be in [0, {depth}), got {layer}.")
    check_operand("packed_all", packed_all, (steps, depth, b_pad, 3, n_pad), (F32,))
    check_operand("s", s, rows, (F32,))
    check_operand("w3", w3, (n_pad, 2, n_pad))
    check_operand("z_all", z_all, (steps, depth, *rows), (F32,))
    check_operand("bias2", bias2, (2, n_pad), (F32,))
    check_operand("xproj_all", xproj_all, (steps, b_pad, 2, n_pad), (F32,))
    check_operand("keep_all", keep_all, (steps, depth, *rows), MASK_DTYPES)
    has = OptionalOperands(
        z=z_all is not None, xproj=xproj_all is not None, mask=keep_all is not None
    )
    tl = (steps, depth)
    args = [check_time(t), s, w3, w3, bias2]
    in_specs = [
        time_spec(),
        pl.BlockSpec((bb, n_pad), lambda i, j: (i, 0)),
        pl.BlockSpec((n_pad, SQUEEZED, bn), lambda i, j: (0, 0, j)),
        pl.BlockSpec((n_pad, SQUEEZED, bn), lambda i, j: (0, 1, j)),
        pl.BlockSpec((2, bn), lambda i, j: (0, j)),
    ]
    rows_spec = lead_spec(tl, (bb, bn), lambda i, j: (i, j))
    for x, spec in (
        (z_all, rows_spec),
        (xproj_all, lead_spec((steps,), (bb, 2, bn), lambda i, j: (i, 0, j))),
        (keep_all, rows_spec),
    ):
        if x is not None:
            args.append(x)
            in_specs.append(spec)
    packed_spec = lead_spec(tl, (bb, 3, bn), lambda i, j: (i, 0, j))
    args.append(packed_all)
    in_specs.append(packed_spec)
    kernel = functools.partial(
        _forward_stacked_kernel,
        has=has,
        layer=layer,
        block_k=geo.block_k,
        precision=dot_precision(w3.dtype, config.allow_tf32),
        mask_scale=dropout_scale(keep_all, keep),
    )
    s_new, packed_all = pl.pallas_call(
        kernel,
        grid=geo.grid,
        in_specs=in_specs,
        out_specs=[pl.BlockSpec((bb, bn), lambda i, j: (i, j)), packed_spec],
        out_shape=[jax.ShapeDtypeStruct(rows, F32), jax.ShapeDtypeStruct(packed_all.shape, F32)],
        input_output_aliases={len(args) - 1: 1},
        compiler_params=compiler_params(config),
        interpret=interpret,
        name="highway_forward_stacked",
    )(*args)
    return s_new, packed_all


def _backward_stacked_kernel(
    t_ref, *refs, has: OptionalOperands, layer: int, steps: int, depth: int, **kernel_kw
):
    """`backward_kernel` (GEMM + elementwise) on the (t, layer) slices of stacked operands.

    The GEMM reads ``d_scaled`` of the layer above from the (aliased) stacked buffer at
    (t, layer + 1), or at (t + 1, 0) for the last layer (zero contribution when t + 1 == T).
    Refs: t_ref [1]; d_all_in [T, L, block_b, 2, n_pad]; wt_h_ref, wt_t_ref [n_pad, block_n];
    ds_carry_above_ref [block_b, block_n] if has.ds_carry_above; g_ref [T, L, block_b,
    block_n] if has.g; packed_ref [T, L, block_b, 3, block_n]; bias_ref [2, block_n]; z_ref,
    mask_ref [T, L, block_b, block_n], xproj_ref [T, block_b, 2, block_n] if present;
    dz_in [T, L, block_b, block_n] if has.z (aliased); dbias_in [L, 2, block_n] (aliased);
    outputs: d_all_out [T, L, block_b, 2, block_n], ds_carry_ref [block_b, block_n],
    dz_out if has.z, dbias_out [L, 2, block_n].
    """
    t = t_ref[0]
    refs = list(refs)
    d_all_in, wt_h_ref, wt_t_ref = refs[:3]
    del refs[:3]
    carry_ref = pop_optional(refs, has.ds_carry_above)
    g_ref = pop_optional(refs, has.g)
    packed_ref, bias_ref = refs[:2]
    del refs[:2]
    z_ref = pop_optional(refs, has.z)
    xproj_ref = pop_optional(refs, has.xproj)
    mask_ref = pop_optional(refs, has.mask)
    _ = pop_optional(refs, has.z)  # dz_in: aliased, never read
    dbias_in = refs.pop(0)
    d_all_out, ds_carry_ref = refs[:2]
    del refs[:2]
    dz_out = pop_optional(refs, has.z)
    (dbias_out,) = refs

    if layer + 1 < depth:
        t_above, l_above, valid = t, layer + 1, None
    else:
        t_above, l_above, valid = jnp.minimum(t + 1, steps - 1), 0, t + 1 < steps
    d_h = View(d_all_in, (t_above, l_above, FREE, 0, FREE))
    d_t = View(d_all_in, (t_above, l_above, FREE, 1, FREE))
    ds = state_grad_in_kernel(d_h, d_t, wt_h_ref, wt_t_ref, kernel_kw["block_k"],
                               kernel_kw["precision"])  # fmt: skip
    if valid is not None:
        ds = jnp.where(valid, ds, 0.0)
    if carry_ref is not None:
        ds = ds + carry_ref[...]
    tl4 = (t, layer, FREE, FREE)
    views = [Value(ds)]  # `backward_kernel` without the GEMM takes the state gradient as a "ref"
    if has.g:
        views.append(View(g_ref, tl4))
    views += [
        View(packed_ref, (t, layer, FREE, 0, FREE)),
        View(packed_ref, (t, layer, FREE, FREE, FREE), shift={1: 1}),
        bias_ref,
    ]
    if has.z:
        views.append(View(z_ref, tl4))
    if has.xproj:
        views.append(View(xproj_ref, (t, FREE, FREE, FREE)))
    if has.mask:
        views.append(View(mask_ref, tl4))
    views += [View(d_all_out, (t, layer, FREE, FREE, FREE)), ds_carry_ref]
    if has.z:
        views.append(View(dz_out, tl4))
    views.append(View(dbias_out, (layer, FREE, FREE), acc_from=dbias_in))
    backward_kernel(*views, has=has, gemm=False, elementwise=True, **kernel_kw)


def backward_fused_stacked(
    t: jax.Array,
    d_scaled_all: jax.Array,
    w_t_above: jax.Array,
    ds_carry_above: jax.Array | None,
    g_all: jax.Array | None,
    packed_all: jax.Array,
    z_all: jax.Array | None,
    bias2: jax.Array,
    xproj_all: jax.Array | None,
    keep_all: jax.Array | None,
    dz_all: jax.Array | None,
    dbias_acc: jax.Array,
    *,
    layer: int,
    keep: float = 1.0,
    geo: Geometry,
    config: HighwayConfig = DEFAULT_CONFIG,
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array, jax.Array | None, jax.Array]:
    """:func:`backward_fused_padded` of micro-layer (t, layer) on stacked operands: ONE launch.

    The layer above is (t, layer + 1), or (t + 1, 0) for the last layer; its ``d_scaled`` is
    read from ``d_scaled_all`` itself (so it is no separate operand), and for t + 1 == T the
    GEMM term is zero (the first call of the reverse loop; no read of uninitialized data is
    used).

    Args:
      t: int32 scalar (traced), 0 <= t < T (not checked in the kernel).
      d_scaled_all: [T, L, b_pad, 2, n_pad] f32, ALIASED to output 0; [t, layer] is written.
      w_t_above: [2, n_pad, n_pad] the layer above's ``w_t`` (``w_t[0]`` for the last layer).
      ds_carry_above: [b_pad, n_pad] f32 ``ds_carry`` of the layer above (the carry), or None.
      g_all: [T, L, b_pad, n_pad] f32 zero-padded cotangents, or None; read at [t, layer].
      packed_all: [T, L, b_pad, 3, n_pad] f32 from :func:`forward_stacked` (read only).
      z_all, bias2, xproj_all, keep_all, keep: as in :func:`forward_stacked`.
      dz_all: [T, L, b_pad, n_pad] f32, ALIASED to output 2; required iff ``z_all`` is given.
      dbias_acc: [L, b_pad // block_b, 2, n_pad] f32, ALIASED to output 3: this call ADDS its
        per-batch-block column sums of ``da`` to ``[layer]``.
      layer: static layer index.
    Returns:
      (d_scaled_all, ds_carry [b_pad, n_pad], dz_all | None, dbias_acc), the stacked ones
      updated at (t, layer) only.
    """
    depth = d_scaled_all.shape[1] if d_scaled_all.ndim == 5 else 0
    steps = d_scaled_all.shape[0]
    if d_scaled_all.ndim != 5 or not 0 <= layer < depth:
        raise ValueError(
            f"d_scaled_all must be [T, L, b_pad, 2, n_pad] with 0 <= layer < L, got "
            f"{d_scaled_all.shape} and layer {layer}."
        )
    if (z_all is None) != (dz_all is None):
        raise ValueError("dz_all must be given exactly when z_all is.")
    bb, bn, n_pad, b_pad = geo.block_b, geo.block_n, geo.n_pad, geo.b_pad
    rows, tl = (b_pad, n_pad), (steps, depth)
    config.validate(w_t_above.dtype)
    check_operand("d_scaled_all", d_scaled_all, (*tl, b_pad, 2, n_pad), (F32,))
    check_operand("w_t_above", w_t_above, (2, n_pad, n_pad))
    check_operand("ds_carry_above", ds_carry_above, rows, (F32,))
    check_operand("g_all", g_all, (*tl, *rows), (F32,))
    check_operand("packed_all", packed_all, (*tl, b_pad, 3, n_pad), (F32,))
    check_operand("z_all", z_all, (*tl, *rows), (F32,))
    check_operand("bias2", bias2, (2, n_pad), (F32,))
    check_operand("xproj_all", xproj_all, (steps, b_pad, 2, n_pad), (F32,))
    check_operand("keep_all", keep_all, (*tl, *rows), MASK_DTYPES)
    check_operand("dz_all", dz_all, (*tl, *rows), (F32,))
    check_operand("dbias_acc", dbias_acc, (depth, geo.grid[0], 2, n_pad), (F32,))
    has = OptionalOperands(
        z=z_all is not None,
        xproj=xproj_all is not None,
        mask=keep_all is not None,
        g=g_all is not None,
        ds_carry_above=ds_carry_above is not None,
    )
    block_rows = pl.BlockSpec((bb, bn), lambda i, j: (i, j))
    rows_spec = lead_spec(tl, (bb, bn), lambda i, j: (i, j))
    d_out_spec = lead_spec(tl, (bb, 2, bn), lambda i, j: (i, 0, j))
    dbias_spec = pl.BlockSpec((depth, SQUEEZED, 2, bn), lambda i, j: (0, i, 0, j))
    args = [check_time(t), d_scaled_all, w_t_above, w_t_above]
    in_specs = [
        time_spec(),
        lead_spec(tl, (bb, 2, n_pad), lambda i, j: (i, 0, 0)),
        pl.BlockSpec((SQUEEZED, n_pad, bn), lambda i, j: (0, 0, j)),
        pl.BlockSpec((SQUEEZED, n_pad, bn), lambda i, j: (1, 0, j)),
    ]
    optional = (
        (ds_carry_above, block_rows),
        (g_all, rows_spec),
        (packed_all, lead_spec(tl, (bb, 3, bn), lambda i, j: (i, 0, j))),
        (bias2, pl.BlockSpec((2, bn), lambda i, j: (0, j))),
        (z_all, rows_spec),
        (xproj_all, lead_spec((steps,), (bb, 2, bn), lambda i, j: (i, 0, j))),
        (keep_all, rows_spec),
        (dz_all, rows_spec),
        (dbias_acc, dbias_spec),
    )
    for x, spec in optional:
        if x is not None:
            args.append(x)
            in_specs.append(spec)
    out_specs = [d_out_spec, block_rows]
    out_shape = [jax.ShapeDtypeStruct(d_scaled_all.shape, F32), jax.ShapeDtypeStruct(rows, F32)]
    aliases = {1: 0}
    if dz_all is not None:
        out_specs.append(rows_spec)
        out_shape.append(jax.ShapeDtypeStruct(dz_all.shape, F32))
        aliases[len(args) - 2] = 2
    out_specs.append(dbias_spec)
    out_shape.append(jax.ShapeDtypeStruct(dbias_acc.shape, F32))
    aliases[len(args) - 1] = len(out_shape) - 1
    kernel = functools.partial(
        _backward_stacked_kernel,
        has=has,
        layer=layer,
        steps=steps,
        depth=depth,
        block_k=geo.block_k,
        precision=dot_precision(w_t_above.dtype, config.allow_tf32),
        mask_scale=dropout_scale(keep_all, keep),
    )
    outs = pl.pallas_call(
        kernel,
        grid=geo.grid,
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        input_output_aliases=aliases,
        compiler_params=compiler_params(config),
        interpret=interpret,
        name="highway_backward_fused_stacked",
    )(*args)
    dz = outs[2] if dz_all is not None else None
    return outs[0], outs[1], dz, outs[-1]
