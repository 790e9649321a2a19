"""`fused`: the RHN recurrence's loops in XLA, each micro-layer one matmul plus one
elementwise fusion, forward and backward (an `rhhjax.ops.spec.Implementation`).

Units padded to FUSED_UNIT_MULTIPLE, batch unpadded; W as L arrays [Np, 2 * Np]. The forward
saves the gates "h", "t" [Bp, Np] and, with z, "full" [Bp, 2, Np] (the unscaled sum z
multiplies), so the backward recomputes no transcendental.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from rhhjax.kernels.layout import Geometry
from rhhjax.ops import cells, loops

if TYPE_CHECKING:
    from rhhjax.ops.sequence_spec import SequenceSpec

Array = jax.Array

NAME = "fused"
INTERPRETABLE = False
KEEP_DTYPE = jnp.bool_
# XLA's GPU GEMMs pad a contraction not a multiple of this; pad once per call instead.
FUSED_UNIT_MULTIPLE = 64
scales_operand = loops.padded_scales  # [T, L, Bp, Np]
LAST_LAYER_COTANGENT = False


def geometry(spec: SequenceSpec, batch: int, width: int) -> Geometry:
    del spec
    return Geometry.for_units(batch, width, FUSED_UNIT_MULTIPLE)


def prepare_weights(spec, geo, kernel_s: Array, transposed: bool = False) -> tuple[Array, ...]:
    """W_l [L, n, 2n] -> L arrays [Np, 2 * Np] (``transposed``: [2 * Np, Np]), matmul dtype."""
    w = geo.pad_weight(kernel_s, spec.dtype).reshape(-1, geo.n_pad, 2 * geo.n_pad)
    return loops.per_layer(jnp.swapaxes(w, 1, 2) if transposed else w)


def saved_rows(has_z: bool) -> loops.Fields:
    """The gates "h", "t" [Bp, Np] and, with z, "full" [Bp, 2, Np]."""
    return (("h", 1), ("t", 1), ("full", 2)) if has_z else (("h", 1), ("t", 1))


def _layer_forward(spec, s, w_l, z_l, bias_l, xproj_t, keep_l, hidden_l):
    """One micro-layer: s [Bp, Np], w_l [Np, 2 * Np] -> (s_new [Bp, Np], saved rows)."""
    s_in = s if hidden_l is None else s * hidden_l
    n_pad = s.shape[-1]
    pre = cells.matmul(s_in, w_l, spec.dtype).reshape(-1, 2, n_pad)
    full = pre if xproj_t is None else pre + xproj_t
    a = (full if z_l is None else full * z_l[:, None]) + bias_l
    h, t = jnp.tanh(a[:, 0]), jax.nn.sigmoid(a[:, 1])
    mask = loops.dropout_mask(spec.keep, keep_l, s.dtype)
    s_new = h * (t if mask is None else t * mask) + s * (1.0 - t)
    saved = {"h": h, "t": t} if z_l is None else {"h": h, "t": t, "full": full}
    return s_new, saved


def forward_loop(spec, geo, w, bias, s0, xproj, z, keep, hidden, save: bool):
    """Forward over all steps: (states [T, L, Bp, Np], packed [T, L, Bp, K, Np] or None)."""
    del geo
    layer_forward = functools.partial(_layer_forward, spec)
    fields = saved_rows(z is not None)
    return loops.forward_scan(
        layer_forward, fields, w, loops.per_layer(bias), s0, xproj, z, keep, hidden, save
    )


def _state_gradient(spec, above) -> Array:
    """ds_carry + (d_scaled @ W^T) [* hidden] of the layer above: [Bp, Np]."""
    d_scaled, w_t, hidden, ds_carry = above
    ds_in = cells.matmul(d_scaled, w_t, spec.dtype)
    return ds_carry + (ds_in if hidden is None else ds_in * hidden)


def _layer_backward(spec, above, ds_out, s_prev, saved_l, z_l, keep_l):
    """The state gradient from the layer above, then the gate backward: (d_scaled, ds_carry,
    da [Bp, 2, Np])."""
    ds = _state_gradient(spec, above) + ds_out
    mask = loops.dropout_mask(spec.keep, keep_l, ds.dtype)
    da, ds_carry = cells.gate_backward(ds, s_prev, saved_l["h"], saved_l["t"], mask)
    da = da.reshape(da.shape[0], 2, -1)
    d_scaled = da if z_l is None else da * z_l[:, None]
    d_scaled = d_scaled.reshape(da.shape[0], -1).astype(spec.dtype)
    return d_scaled, ds_carry, da


def backward_loop(spec, geo, w, bias, s0, xproj, z, keep, hidden, saved, g_states):
    """Reverse loop over all steps: (ds0 [Bp, Np], d_scaled [T, L, Bp, 2, Np], dz or None,
    dbias [L, 2, Np], dW [L, Np, 2, Np]); g_states [T, L, Bp, Np]."""
    del geo, bias
    depth = len(w)
    fields = saved_rows(z is not None)

    def hidden_of(layer):
        return None if hidden is None else hidden[layer]

    def body(carry, xs):
        d_scaled_above, ds_carry_above = carry
        z_t, keep_t, packed_t, g_t = xs
        above = (d_scaled_above, w[0], hidden_of(0), ds_carry_above)
        das = [None] * depth
        for layer in reversed(range(depth)):
            s_prev, saved_l = loops.unpack(packed_t[layer], fields)
            d_scaled, ds_carry, das[layer] = _layer_backward(
                spec, above, g_t[layer], s_prev, saved_l,
                None if z_t is None else z_t[layer],
                None if keep_t is None else keep_t[layer],
            )  # fmt: skip
            above = (d_scaled, w[layer], hidden_of(layer), ds_carry)
        return (above[0], above[3]), jnp.stack(das)

    b_pad, n_pad = s0.shape
    init = (jnp.zeros((b_pad, 2 * n_pad), spec.dtype), jnp.zeros_like(s0))
    (d_scaled0, ds_carry0), da = jax.lax.scan(
        body, init, (z, keep, saved, g_states), reverse=True, length=xproj.shape[0]
    )
    ds0 = _state_gradient(spec, (d_scaled0, w[0], hidden_of(0), ds_carry0))
    d_scaled, dz, dbias = loops.gradients_from_da(da, z, saved, fields)
    dw = loops.deferred_weight_gradient(spec.dtype, saved, d_scaled, fields, hidden)
    return ds0, d_scaled, dz, dbias, dw
