"""`fused`: the RHN recurrence's loops in XLA, each micro-layer one matmul plus one
elementwise fusion, forward and backward (run by `rhhjax.ops.recurrence.highway_sequence`).

The interface every implementation module provides (`rhhjax.ops.spec.Implementation`):

    NAME                    the `model.impl` value
    INTERPRETABLE           whether it runs Pallas kernels (interpreted per model.pallas_mode)
    unsupported(model)      None, or the one-line reason it cannot run `model` (ModelFacts)
    unavailable(mode, platform)  None, or why it cannot run on `platform` in that mode
    substitute(model)       None, or (the implementation that runs `model` instead, why)
    geometry(spec, B, n)    the padded layout (`rhhjax.kernels.layout.Geometry`)
    KEEP_DTYPE              dtype of the gate-dropout keep decisions in the loops
    prepare_weights(...)    W_l [L, n, 2n] -> L per-layer padded, cast (transposed) arrays
    saved_rows(has_z)       what the forward saves per micro-layer besides its input state
    forward_loop(...)       states [T, L, Bp, Np] and what the backward reads (here: the
                            packed saved rows)
    backward_loop(...)      (ds0, d_scaled, dz, dbias, dW) in the padded layout

Layout here: units padded to a multiple of FUSED_UNIT_MULTIPLE, the batch unpadded; the
weight L x [Np, 2 * Np] (the backward reads L transposed copies [2 * Np, Np]). The forward
saves the gates "h", "t" [Bp, Np] (the backward recomputes no transcendental) and, with z,
"full" [Bp, 2, Np], the unscaled sum (s W_l [+ x U at l = 0]) that z multiplies.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from rhhjax.kernels.layout import Geometry
from rhhjax.ops import cells, loops

if TYPE_CHECKING:
    from rhhjax.ops.sequence_spec import ModelFacts, SequenceSpec

Array = jax.Array

NAME = "fused"
INTERPRETABLE = False  # XLA only: model.pallas_mode does not apply
KEEP_DTYPE = jnp.bool_
# XLA's GPU matmuls pad a contraction dimension that is not a multiple of this (1000 -> 1024
# for its Triton GEMMs, found in the H100 compile report); the fused path pads once per call
# instead of once per time step.
FUSED_UNIT_MULTIPLE = 64


def unsupported(model: ModelFacts) -> str | None:
    """Why `fused` cannot run `model`, or None (it runs RHN and HyperRHN with hyper_input='x',
    every dropout and rank)."""
    return loops.whole_sequence_unsupported(NAME, model)


unavailable = loops.available_everywhere  # every platform, every model.pallas_mode


substitute = loops.runs_itself  # no other implementation runs a model in its place
scales_operand = loops.padded_scales  # z padded, [T, L, Bp, Np]
LAST_LAYER_COTANGENT = False  # its backward reads every layer's cotangent


def geometry(spec: SequenceSpec, batch: int, width: int) -> Geometry:
    """Units padded to FUSED_UNIT_MULTIPLE, no batch padding."""
    del spec
    return Geometry.for_units(batch, width, FUSED_UNIT_MULTIPLE)


def prepare_weights(spec, geo, kernel_s: Array, transposed: bool = False) -> tuple[Array, ...]:
    """W_l [L, n, 2n] -> L arrays [Np, 2 * Np] (transposed: [2 * Np, Np]) in the matmul
    dtype, padded and cast ONCE per call."""
    w = geo.pad_weight(kernel_s, spec.dtype).reshape(-1, geo.n_pad, 2 * geo.n_pad)
    return loops.per_layer(jnp.swapaxes(w, 1, 2) if transposed else w)


def saved_rows(has_z: bool) -> loops.Fields:
    """The gates "h", "t" [Bp, Np] and, with z, "full" [Bp, 2, Np] (see `_layer_forward`)."""
    return (("h", 1), ("t", 1), ("full", 2)) if has_z else (("h", 1), ("t", 1))


def _layer_forward(spec, s, w_l, z_l, bias_l, xproj_t, keep_l, hidden_l):
    """One micro-layer in XLA: one matmul and one elementwise fusion.

    s [Bp, Np]; w_l [Np, 2 * Np] in the matmul dtype. Returns (s_new [Bp, Np], saved) with
    the gates "h", "t" [Bp, Np] and, with z, "full" [Bp, 2, Np].
    """
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
    """Forward over all steps (`loops.forward_scan` of `_layer_forward`).

    w: L arrays from `prepare_weights`; bias [L, 2, Np]; s0 [Bp, Np]; xproj [T, Bp, 2, Np];
    z, keep [T, L, Bp, Np] or None; hidden [L, Bp, Np] or None.
    Returns (states [T, L, Bp, Np], packed [T, L, Bp, K, Np] or None).
    """
    del geo
    layer_forward = functools.partial(_layer_forward, spec)
    fields = saved_rows(z is not None)
    return loops.forward_scan(
        layer_forward, fields, w, loops.per_layer(bias), s0, xproj, z, keep, hidden, save
    )


def _state_gradient(spec, above) -> Array:
    """ds_carry + (d_scaled @ W^T) [* hidden mask] of the layer above: [Bp, Np].

    above: (d_scaled [Bp, 2 * Np] and W^T [2 * Np, Np], both in the matmul dtype,
    hidden mask [Bp, Np] | None, ds_carry [Bp, Np]).
    """
    d_scaled, w_t, hidden, ds_carry = above
    ds_in = cells.matmul(d_scaled, w_t, spec.dtype)
    return ds_carry + (ds_in if hidden is None else ds_in * hidden)


def _layer_backward(spec, above, ds_out, s_prev, saved_l, z_l, keep_l):
    """Incoming state gradient of a micro-layer from the layer above, then its gate backward.

    ds_out: [Bp, Np] cotangent of this layer's output from outside the recurrence.
    Returns (d_scaled [Bp, 2 * Np] in the matmul dtype (the next matmul's operand),
    ds_carry [Bp, Np], da [Bp, 2, Np]). The bias gradient, d_scaled = da * [z, z] for dW and
    dz are formed from the stacked da after the loop, with no per-step reduction.
    """
    ds = _state_gradient(spec, above) + ds_out
    mask = loops.dropout_mask(spec.keep, keep_l, ds.dtype)
    da, ds_carry = cells.gate_backward(ds, s_prev, saved_l["h"], saved_l["t"], mask)
    da = da.reshape(da.shape[0], 2, -1)
    d_scaled = da if z_l is None else da * z_l[:, None]
    d_scaled = d_scaled.reshape(da.shape[0], -1).astype(spec.dtype)
    return d_scaled, ds_carry, da


def backward_loop(spec, geo, w, bias, s0, xproj, z, keep, hidden, saved, g_states):
    """Reverse loop over all steps; every micro-layer is the state-gradient matmul of the
    layer above plus its own gate backward.

    w: L transposed weights (`prepare_weights(..., transposed=True)`); saved: the forward's
    saved rows; g_states [T, L, Bp, Np] the padded cotangents of the states.
    Returns (ds0 [Bp, Np], d_scaled [T, L, Bp, 2, Np] = da * [z, z], dz [T, L, Bp, Np] or
    None, dbias [L, 2, Np], dW [L, Np, 2, Np]: `loops.deferred_weight_gradient`).
    """
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
    # The state gradient of s0 through W_0 (no gate backward below it).
    ds0 = _state_gradient(spec, (d_scaled0, w[0], hidden_of(0), ds_carry0))
    d_scaled, dz, dbias = loops.gradients_from_da(da, z, saved, fields)
    dw = loops.deferred_weight_gradient(spec.dtype, saved, d_scaled, fields, hidden)
    return ds0, d_scaled, dz, dbias, dw
