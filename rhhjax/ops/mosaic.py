"""`mosaic`: the RHN recurrence with Mosaic GPU kernels (Hopper: wgmma, TMA), one forward and
one backward kernel per micro-layer and step (an `rhhjax.ops.spec.Implementation`).

The forward kernel (`kernels.mosaic.forward`) saves `fused`'s rows; the backward kernel
(`kernels.mosaic.backward`) fuses the layer above's state-gradient GEMM with this layer's
gate backward. dz, bias and weight gradients are XLA ops after the loop. Batch padded to 64
rows, units to UNIT_MULTIPLE. No variational dropout or rank-d HyperRHNs.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from rhhjax.kernels.layout import Geometry
from rhhjax.kernels.mosaic import backward as mb
from rhhjax.kernels.mosaic import forward as mf
from rhhjax.ops import fused, loops

if TYPE_CHECKING:
    from rhhjax.ops.sequence_spec import SequenceSpec

Array = jax.Array

NAME = "mosaic"
INTERPRETABLE = True
KEEP_DTYPE = jnp.bool_
CONFIG = mf.MosaicForwardConfig()  # 64 rows x 8 units per program, K chunks of 64
BACKWARD_CONFIG = mb.MosaicBackwardConfig()  # 64 rows x 16 units per program
UNIT_MULTIPLE = math.lcm(CONFIG.units, CONFIG.tile_k, BACKWARD_CONFIG.units)
scales_operand = loops.padded_scales  # [T, L, Bp, Np]
LAST_LAYER_COTANGENT = False


def geometry(spec: SequenceSpec, batch: int, width: int) -> Geometry:
    del spec
    b_pad = -(-batch // CONFIG.tile_m) * CONFIG.tile_m
    n_pad = -(-width // UNIT_MULTIPLE) * UNIT_MULTIPLE
    return Geometry(batch, width, CONFIG.tile_m, CONFIG.units, CONFIG.tile_k, b_pad, n_pad)


def prepare_weights(spec, geo, kernel_s: Array, transposed: bool = False) -> tuple[Array, ...]:
    """W_l [L, n, 2n] -> L arrays in the matmul dtype: block-major [2 * Np, Np], or
    (``transposed``) W as is, [Np, 2 * Np]."""
    w = geo.pad_weight(kernel_s, jnp.float32).reshape(-1, geo.n_pad, 2 * geo.n_pad)
    if transposed:
        return loops.per_layer(w.astype(spec.dtype))
    return tuple(
        mf.block_weight(w[layer], spec.dtype, CONFIG.units, geo.n_pad)
        for layer in range(w.shape[0])
    )


def saved_rows(has_z: bool) -> loops.Fields:
    return fused.saved_rows(has_z)


def _layer_forward(spec, save, s, w_l, z_l, bias_l, xproj_t, keep_l, hidden_l):
    """One micro-layer as one kernel: s [Bp, Np] f32, w_l [2 * Np, Np], bias_l [Bp, 2, Np]
    -> (s_new [Bp, Np], saved rows or {})."""
    if hidden_l is not None:
        raise ValueError(f"impl {NAME!r} has no variational dropout")
    mask = loops.dropout_mask(spec.keep, keep_l, jnp.float32)
    args = (s.astype(spec.dtype), w_l, s, bias_l, z_l, xproj_t, mask)
    if spec.references:
        out = mf.highway_forward_reference(*args, save=save, units=CONFIG.units)
    else:
        interpret = loops.kernel_interpret(spec)
        out = mf.highway_forward(*args, save=save, config=CONFIG, interpret=interpret)
    if not save:
        return out, {}
    saved = dict(zip(("h", "t", "full"), out[1:], strict=False))
    return out[0], saved


def forward_loop(spec, geo, w, bias, s0, xproj, z, keep, hidden, save: bool):
    """Forward over all steps, one kernel per micro-layer (shapes as `fused.forward_loop`)."""
    rows = jnp.broadcast_to(bias[:, None], (bias.shape[0], geo.b_pad, *bias.shape[1:]))
    layer_forward = functools.partial(_layer_forward, spec, save)
    fields = saved_rows(z is not None)
    return loops.forward_scan(
        layer_forward, fields, w, loops.per_layer(rows), s0, xproj, z, keep, hidden, save
    )


def _layer_backward(spec, d_above, w_above, ds_carry, g_l, packed_l, z_l, keep_l):
    """One micro-layer backward as one kernel: d_above [Bp, 2 * Np], w_above [Np, 2 * Np],
    ds_carry, g_l [Bp, Np], packed_l [Bp, K, Np] -> (d_scaled, ds_carry, da [Bp, 2, Np])."""
    s_prev, saved = loops.unpack(packed_l, saved_rows(z_l is not None))
    mask = loops.dropout_mask(spec.keep, keep_l, jnp.float32)
    args = (d_above, w_above, ds_carry, g_l, s_prev, saved["h"], saved["t"], z_l, mask)
    if spec.references:
        d_scaled, ds_carry, da = mb.highway_backward_reference(*args)
    else:
        interpret = loops.kernel_interpret(spec)
        d_scaled, ds_carry, da = mb.highway_backward(
            *args, config=BACKWARD_CONFIG, interpret=interpret
        )
    return d_scaled.reshape(d_above.shape), ds_carry, da


def backward_loop(spec, geo, w, bias, s0, xproj, z, keep, hidden, saved, g_states):
    """Reverse loop, one kernel per micro-layer; returns as `fused.backward_loop`."""
    del geo, bias, hidden
    depth = len(w)

    def body(carry, xs):
        d_above, ds_carry = carry
        z_t, keep_t, packed_t, g_t = xs
        w_above, das = w[0], [None] * depth
        for layer in reversed(range(depth)):
            d_above, ds_carry, das[layer] = _layer_backward(
                spec, d_above, w_above, ds_carry, g_t[layer], packed_t[layer],
                None if z_t is None else z_t[layer],
                None if keep_t is None else keep_t[layer],
            )  # fmt: skip
            w_above = w[layer]
        return (d_above, ds_carry), jnp.stack(das)

    b_pad, n_pad = s0.shape
    init = (jnp.zeros((b_pad, 2 * n_pad), spec.dtype), jnp.zeros_like(s0))
    (d_above0, ds_carry0), da = jax.lax.scan(
        body, init, (z, keep, saved, g_states), reverse=True, length=xproj.shape[0]
    )
    # ds0 through W_0: one XLA matmul.
    ds0 = ds_carry0 + jnp.matmul(d_above0, w[0].T, preferred_element_type=jnp.float32)
    fields = saved_rows(z is not None)
    d_scaled, dz, dbias = loops.gradients_from_da(da, z, saved, fields)
    return (
        ds0,
        d_scaled,
        dz,
        dbias,
        loops.deferred_weight_gradient(spec.dtype, saved, d_scaled, fields),
    )
