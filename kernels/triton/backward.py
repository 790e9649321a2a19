"""Backward kernels of one highway micro-layer, padded layout: wrappers and references.

Given ``ds`` (the cotangent of ``s_new``, plus ``g`` from outside)::

    da       = d a                                    [B, 2n]
    d_scaled = da * [z, z]  (= da without z)          [B, 2n]  = d u = d pre = d xproj
    ds_carry = ds * (1 - t)                           [B, n]
    dz       = da[:, :n] * u[:, :n] + da[:, n:] * u[:, n:]     (u includes xproj)
    ds_in    = ds_carry + d_scaled @ w.T              [B, n]   the state gradient of the layer

One kernel body (:func:`backward_kernel`) serves three launches: the elementwise gate backward
(:func:`backward_padded`), the state-gradient GEMM of the layer above fused with it
(:func:`backward_fused_padded`, ONE launch per micro-layer), and the GEMM alone
(:func:`state_grad_padded`). ``dw = s.T @ d_scaled`` is left to the caller (one GEMM after the
time loop).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from rhhjax.kernels.triton.common import (
    F32,
    MASK_DTYPES,
    SQUEEZED,
    OptionalOperands,
    check_operand,
    compiler_params,
    dot_precision,
    dropout_scale,
    gates_in_kernel,
    k_loop,
    load_mask,
    pop_optional,
    reference_combine,
    reference_dot,
    reference_mask,
    reference_preactivation,
)
from rhhjax.kernels.triton.config import DEFAULT_CONFIG, Geometry, HighwayConfig


def state_grad_in_kernel(d_h_ref, d_t_ref, wt_h_ref, wt_t_ref, block_k: int, precision):
    """[block_b, block_n] f32: d_scaled_above @ W_above^T for this column block (K = 2 n_pad)."""
    dot_dtype = wt_h_ref.dtype
    block_b = d_h_ref.shape[0]
    block_n = wt_h_ref.shape[1]

    def k_step(k, acc):
        acc += jnp.dot(
            d_h_ref[:, k].astype(dot_dtype),
            wt_h_ref[k, :],
            precision=precision,
            preferred_element_type=F32,
        )
        acc += jnp.dot(
            d_t_ref[:, k].astype(dot_dtype),
            wt_t_ref[k, :],
            precision=precision,
            preferred_element_type=F32,
        )
        return acc

    init = jnp.zeros((block_b, block_n), F32)
    return k_loop(d_h_ref.shape[1] // block_k, block_k, k_step, init)


def backward_kernel(
    *refs,
    has: OptionalOperands,
    gemm: bool,
    elementwise: bool,
    block_k: int,
    precision,
    mask_scale: float,
):
    """One (batch block i, unit block j) program of the backward.

    Refs (block shapes), in this order:
      if gemm: d_h_ref, d_t_ref [block_b, n_pad] (h / t halves of d_scaled_above, whole
        rows), wt_h_ref, wt_t_ref [n_pad, block_n] (w_t_above[half, :, j block]);
        ds_carry_above_ref [block_b, block_n] if has.ds_carry_above;
      else: ds_ref [block_b, block_n] (the incoming state gradient);
      g_ref [block_b, block_n] if has.g;
      if elementwise: s_ref [block_b, block_n]; pre_ref [block_b, 2, block_n];
        bias_ref [2, block_n]; z_ref, xproj_ref, mask_ref as in the forward;
      outputs: if elementwise: d_out_ref [block_b, 2, block_n] (d_scaled), ds_carry_ref
        [block_b, block_n], dz_ref [block_b, block_n] if has.z,
        dbias_ref [2, block_n] (this program's column sums of da); else ds_ref_out.
    """
    refs = list(refs)
    if gemm:
        d_h_ref, d_t_ref, wt_h_ref, wt_t_ref = refs[:4]
        del refs[:4]
        ds = state_grad_in_kernel(d_h_ref, d_t_ref, wt_h_ref, wt_t_ref, block_k, precision)
        carry_ref = pop_optional(refs, has.ds_carry_above)
        if carry_ref is not None:
            ds = ds + carry_ref[...]
    else:
        ds = refs.pop(0)[...]
    g_ref = pop_optional(refs, has.g)
    if g_ref is not None:
        ds = ds + g_ref[...]
    if not elementwise:
        refs[0][...] = ds
        return

    s_ref, pre_ref, bias_ref = refs[:3]
    del refs[:3]
    z_ref = pop_optional(refs, has.z)
    xproj_ref = pop_optional(refs, has.xproj)
    mask_ref = pop_optional(refs, has.mask)
    d_out_ref, ds_carry_ref = refs[:2]
    del refs[:2]
    dz_ref = pop_optional(refs, has.z)
    (dbias_ref,) = refs

    z = z_ref[...] if has.z else None
    u_h, u_t, h, t = gates_in_kernel(pre_ref[:, 0, :], pre_ref[:, 1, :], z, bias_ref, xproj_ref)
    m = load_mask(mask_ref, mask_scale)
    tm, hm = (t, h) if m is None else (t * m, h * m)
    da_h = ds * tm * (1.0 - h * h)
    da_t = ds * (hm - s_ref[...]) * t * (1.0 - t)
    if has.z:
        d_out_ref[:, 0, :] = da_h * z
        d_out_ref[:, 1, :] = da_t * z
    else:
        d_out_ref[:, 0, :] = da_h
        d_out_ref[:, 1, :] = da_t
    ds_carry_ref[...] = ds * (1.0 - t)
    if dz_ref is not None:
        dz_ref[...] = da_h * u_h + da_t * u_t
    dbias_ref[0, :] = jnp.sum(da_h, axis=0)
    dbias_ref[1, :] = jnp.sum(da_t, axis=0)


def _backward_call(
    gemm_args,
    ds,
    g,
    elementwise_args,
    *,
    keep,
    geo,
    config,
    interpret,
    name,
):
    """Builds and runs one backward pallas_call (shared by the three backward entry points).

    gemm_args: (d_scaled_above, w_t_above, ds_carry_above | None) or None.
    ds: incoming state gradient [b_pad, n_pad] when gemm_args is None.
    elementwise_args: (s, pre, z, bias2, xproj, keep_mask) or None (GEMM only).
    """
    bb, bn, n_pad, b_pad = geo.block_b, geo.block_n, geo.n_pad, geo.b_pad
    rows, rows2 = (b_pad, n_pad), (b_pad, 2, n_pad)
    block_rows = pl.BlockSpec((bb, bn), lambda i, j: (i, j))
    block_rows2 = pl.BlockSpec((bb, 2, bn), lambda i, j: (i, 0, j))
    args, in_specs = [], []
    has = OptionalOperands(g=g is not None)
    dot_dtype = None
    if gemm_args is not None:
        d_above, w_t, ds_carry_above = gemm_args
        check_operand("d_scaled_above", d_above, rows2, (F32,))
        check_operand("w_t_above", w_t, (2, n_pad, n_pad))
        check_operand("ds_carry_above", ds_carry_above, rows, (F32,))
        dot_dtype = w_t.dtype
        args += [d_above, d_above, w_t, w_t]
        in_specs += [
            pl.BlockSpec((bb, SQUEEZED, n_pad), lambda i, j: (i, 0, 0)),
            pl.BlockSpec((bb, SQUEEZED, n_pad), lambda i, j: (i, 1, 0)),
            pl.BlockSpec((SQUEEZED, n_pad, bn), lambda i, j: (0, 0, j)),
            pl.BlockSpec((SQUEEZED, n_pad, bn), lambda i, j: (1, 0, j)),
        ]
        if ds_carry_above is not None:
            has = dataclasses.replace(has, ds_carry_above=True)
            args.append(ds_carry_above)
            in_specs.append(block_rows)
    else:
        check_operand("ds", ds, rows, (F32,))
        args.append(ds)
        in_specs.append(block_rows)
    config.validate(dot_dtype)
    check_operand("g", g, rows, (F32,))
    if g is not None:
        args.append(g)
        in_specs.append(block_rows)

    mask_scale = 1.0
    if elementwise_args is None:
        out_specs, out_shape = [block_rows], [jax.ShapeDtypeStruct(rows, F32)]
    else:
        s, pre, z, bias2, xproj, keep_mask = elementwise_args
        check_operand("s", s, rows, (F32,))
        check_operand("pre", pre, rows2, (F32,))
        check_operand("z", z, rows, (F32,))
        check_operand("bias2", bias2, (2, n_pad), (F32,))
        check_operand("xproj", xproj, rows2, (F32,))
        check_operand("keep_mask", keep_mask, rows, MASK_DTYPES)
        mask_scale = dropout_scale(keep_mask, keep)
        has = dataclasses.replace(
            has,
            z=z is not None,
            xproj=xproj is not None,
            mask=keep_mask is not None,
        )
        args += [s, pre, bias2]
        in_specs += [block_rows, block_rows2, pl.BlockSpec((2, bn), lambda i, j: (0, j))]
        for x, spec in (
            (z, block_rows),
            (xproj, block_rows2),
            (keep_mask, block_rows),
        ):
            if x is not None:
                args.append(x)
                in_specs.append(spec)
        out_specs = [block_rows2, block_rows]
        out_shape = [jax.ShapeDtypeStruct(rows2, F32), jax.ShapeDtypeStruct(rows, F32)]
        if z is not None:
            out_specs.append(block_rows)
            out_shape.append(jax.ShapeDtypeStruct(rows, F32))
        out_specs.append(pl.BlockSpec((SQUEEZED, 2, bn), lambda i, j: (i, 0, j)))
        out_shape.append(jax.ShapeDtypeStruct((geo.grid[0], 2, n_pad), F32))

    kernel = functools.partial(
        backward_kernel,
        has=has,
        gemm=gemm_args is not None,
        elementwise=elementwise_args is not None,
        block_k=geo.block_k,
        precision=None if dot_dtype is None else dot_precision(dot_dtype, config.allow_tf32),
        mask_scale=mask_scale,
    )
    return pl.pallas_call(
        kernel,
        grid=geo.grid,
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=compiler_params(config),
        interpret=interpret,
        name=name,
    )(*args)


def _split_backward_outputs(outs, has_z: bool):
    d_scaled, ds_carry = outs[0], outs[1]
    dz = outs[2] if has_z else None
    return d_scaled, ds_carry, dz, outs[-1]


def backward_padded(
    ds: jax.Array,
    s: jax.Array,
    pre: jax.Array,
    z: jax.Array | None,
    bias2: jax.Array,
    xproj: jax.Array | None,
    keep_mask: jax.Array | None,
    *,
    g: jax.Array | None = None,
    keep: float = 1.0,
    geo: Geometry,
    config: HighwayConfig = DEFAULT_CONFIG,
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array, jax.Array | None, jax.Array]:
    """Elementwise gate backward of one micro-layer, padded layout: ONE kernel launch.

    Args:
      ds: [b_pad, n_pad] f32 cotangent of this layer's ``s_new``.
      s, pre, z, bias2, xproj, keep_mask, keep: as given to :func:`forward_padded`
        (``pre`` is its output).
      g: [b_pad, n_pad] f32 added to ``ds`` (cotangent from outside), or None.
    Returns:
      d_scaled [b_pad, 2, n_pad] f32: ``da * [z, z]`` (``da`` without z): the input of the
        state-gradient GEMM and of the deferred dW; also ``d xproj``.
      ds_carry [b_pad, n_pad] f32: ``(ds + g) * (1 - t)``.
      dz [b_pad, n_pad] f32 | None: ``sum over halves of da * (pre + xproj)``; None without z.
      dbias_partial [b_pad // block_b, 2, n_pad] f32: per-batch-block column sums of ``da``
        (sum over axis 0, after the time loop, for d bias2).
    """
    outs = _backward_call(
        None,
        ds,
        g,
        (s, pre, z, bias2, xproj, keep_mask),
        keep=keep,
        geo=geo,
        config=config,
        interpret=interpret,
        name="highway_backward",
    )
    return _split_backward_outputs(outs, z is not None)


def backward_fused_padded(
    d_scaled_above: jax.Array,
    w_t_above: jax.Array,
    ds_carry_above: jax.Array | None,
    g: jax.Array | None,
    s: jax.Array,
    pre: jax.Array,
    z: jax.Array | None,
    bias2: jax.Array,
    xproj: jax.Array | None,
    keep_mask: jax.Array | None,
    *,
    keep: float = 1.0,
    geo: Geometry,
    config: HighwayConfig = DEFAULT_CONFIG,
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array, jax.Array | None, jax.Array]:
    """State-gradient GEMM of the layer above + gate backward of this layer: ONE launch.

    Per column block: ``ds = ds_carry_above + d_scaled_above @ W_above^T (+ g)``, with the
    GEMM's K loop over both halves of ``w_t_above``, then :func:`backward_padded` with that
    ``ds``. "Above" is the layer that consumed this layer's output: (t, l + 1), or (t + 1, 0)
    for the last micro-layer.

    Args:
      d_scaled_above: [b_pad, 2, n_pad] f32, the layer above's ``d_scaled``.
      w_t_above: [2, n_pad, n_pad] the layer above's weight in the dot dtype
        (``geo.pad_weight_t(w, dtype)``); ``d_scaled_above`` is cast to it for the dot.
      ds_carry_above: [b_pad, n_pad] f32, the layer above's ``ds_carry``, or None (zero).
      g, s, pre, z, bias2, xproj, keep_mask, keep: as in :func:`backward_padded`.
    Returns:
      (d_scaled, ds_carry, dz, dbias_partial) as in :func:`backward_padded`.
    """
    outs = _backward_call(
        (d_scaled_above, w_t_above, ds_carry_above),
        None,
        g,
        (s, pre, z, bias2, xproj, keep_mask),
        keep=keep,
        geo=geo,
        config=config,
        interpret=interpret,
        name="highway_backward_fused",
    )
    return _split_backward_outputs(outs, z is not None)


def state_grad_padded(
    d_scaled: jax.Array,
    w_t: jax.Array,
    ds_carry: jax.Array | None,
    g: jax.Array | None = None,
    *,
    geo: Geometry,
    config: HighwayConfig = DEFAULT_CONFIG,
    interpret: bool = False,
) -> jax.Array:
    """``ds_carry + d_scaled @ W^T (+ g)`` [b_pad, n_pad] f32, one kernel (the GEMM part of
    :func:`backward_fused_padded` alone, e.g. for the gradient of the initial state)."""
    (ds,) = _backward_call(
        (d_scaled, w_t, ds_carry),
        None,
        g,
        None,
        keep=1.0,
        geo=geo,
        config=config,
        interpret=interpret,
        name="highway_state_grad",
    )
    return ds


# --- references (pure jnp, same padded layout) ----------------------------------------------------


def backward_padded_reference(ds, s, pre, z, bias2, xproj, keep_mask, *, g=None, keep=1.0):
    """Pure-jnp :func:`backward_padded`, derived by autodiff of the forward combine.

    ``dbias_partial`` is returned with a single row (the column sums over all rows): compare
    it with the kernel's partial sums summed over axis 0.
    """
    m = reference_mask(keep_mask, keep)
    u = pre if xproj is None else pre + xproj
    zeros = jnp.zeros_like(pre)

    def f(a_add, s_, u_, z_):
        return reference_combine(reference_preactivation(u_, z_, bias2) + a_add, s_, m)

    z_arg = jnp.ones_like(s) if z is None else z
    _, vjp = jax.vjp(f, zeros, s, u, z_arg)
    cot = ds if g is None else ds + g
    da, ds_carry, du, dz = vjp(cot)
    return du, ds_carry, (None if z is None else dz), jnp.sum(da, axis=0)[None]


def state_grad_reference(d_scaled, w_t, ds_carry, g=None):
    """Pure-jnp :func:`state_grad_padded`: ``ds_carry + d_scaled @ W^T (+ g)``."""
    ds = reference_dot(d_scaled, w_t, "bhk,hkj->bj")
    if ds_carry is not None:
        ds = ds + ds_carry
    return ds if g is None else ds + g


def backward_fused_reference(
    d_scaled_above, w_t_above, ds_carry_above, g, s, pre, z, bias2, xproj, keep_mask, *,
    keep=1.0,
):  # fmt: skip
    """Pure-jnp :func:`backward_fused_padded`: the GEMM, then the elementwise backward."""
    ds = state_grad_reference(d_scaled_above, w_t_above, ds_carry_above, g)
    return backward_padded_reference(ds, s, pre, z, bias2, xproj, keep_mask, keep=keep)
