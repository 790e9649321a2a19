"""Backward kernels of one highway micro-layer, padded layout: the kernel body, the
state-gradient launch and the references.

    d_scaled = da * [z, z];  ds_carry = ds * (1 - t);  dz = sum over halves of da * u
    ds_in = ds_carry + d_scaled @ w^T        (dW = s^T @ d_scaled is left to the caller)

`backward_kernel` serves the state-gradient GEMM alone (`state_grad_padded`) and fused with
the gate backward (`stacked.backward_fused_stacked`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from rhhjax.kernels.layout import Geometry
from rhhjax.kernels.triton.common import (
    F32,
    SQUEEZED,
    Operand,
    OptionalOperands,
    check_operand,
    gates_in_kernel,
    k_loop,
    kernel_params,
    launch,
    load_mask,
    pop_optional,
    reference_combine,
    reference_dot,
    reference_mask,
    reference_preactivation,
    rows_spec,
    weight_t_specs,
)
from rhhjax.kernels.triton.config import DEFAULT_CONFIG, HighwayConfig


def state_grad_in_kernel(d_h_ref, d_t_ref, wt_h_ref, wt_t_ref, block_k: int, precision):
    """d_scaled_above @ W_above^T for this column block: [block_b, block_n] f32."""
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
    """One (batch block i, unit block j) program of the backward: with ``gemm`` the state
    gradient from the layer above, with ``elementwise`` the gate backward, writing
    d_scaled [block_b, 2, block_n], ds_carry, dz and the column sums of da."""
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


def gemm_operands(
    geo: Geometry, d_scaled_above: jax.Array, w_t_above: jax.Array, ds_carry_above: jax.Array | None
) -> list[Operand]:
    """The GEMM operands for `launch`: d_scaled_above's halves, w_t_above per half,
    ds_carry_above where present."""
    whole = (geo.block_b, SQUEEZED, geo.n_pad)
    wt_h, wt_t = weight_t_specs(geo)
    return [
        (d_scaled_above, pl.BlockSpec(whole, lambda i, j: (i, 0, 0))),
        (d_scaled_above, pl.BlockSpec(whole, lambda i, j: (i, 1, 0))),
        (w_t_above, wt_h),
        (w_t_above, wt_t),
        (ds_carry_above, rows_spec(geo)),
    ]


def check_gemm_operands(
    geo: Geometry, d_scaled_above: jax.Array, w_t_above: jax.Array, ds_carry_above: jax.Array | None
) -> None:
    rows, rows2 = (geo.b_pad, geo.n_pad), (geo.b_pad, 2, geo.n_pad)
    check_operand("d_scaled_above", d_scaled_above, rows2, (F32,))
    check_operand("w_t_above", w_t_above, (2, geo.n_pad, geo.n_pad))
    check_operand("ds_carry_above", ds_carry_above, rows, (F32,))


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
    """ds_carry + d_scaled @ W^T (+ g) [b_pad, n_pad] f32 in one kernel: d_scaled
    [b_pad, 2, n_pad], w_t [2, n_pad, n_pad], ds_carry and g [b_pad, n_pad] or None."""
    check_gemm_operands(geo, d_scaled, w_t, ds_carry)
    config.validate(w_t.dtype)
    check_operand("g", g, (geo.b_pad, geo.n_pad), (F32,))
    has = OptionalOperands(g=g is not None, ds_carry_above=ds_carry is not None)
    kernel = functools.partial(
        backward_kernel, has=has, gemm=True, elementwise=False,
        **kernel_params(geo, config, w_t.dtype, None, 1.0),
    )  # fmt: skip
    operands = [*gemm_operands(geo, d_scaled, w_t, ds_carry), (g, rows_spec(geo))]
    outputs = [(jax.ShapeDtypeStruct((geo.b_pad, geo.n_pad), F32), rows_spec(geo))]
    (ds,) = launch(
        kernel, operands, outputs, geo=geo, config=config, interpret=interpret,
        name="highway_state_grad",
    )  # fmt: skip
    return ds


def backward_padded_reference(ds, s, pre, z, bias2, xproj, keep_mask, *, g=None, keep=1.0):
    """Pure-jnp `backward_padded` by autodiff of the forward combine; ``dbias_partial`` has
    one row (sum the kernel's over axis 0 to compare)."""
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
