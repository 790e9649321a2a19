"""`pallas`: the RHN recurrence's loops as Pallas Triton kernels (`rhhjax.kernels.triton`),
one forward and one backward kernel per micro-layer and step (an `Implementation`).

When differentiated, the kernels read and write the whole-sequence arrays at the step index
(`*_stacked`), so the time loops hold nothing but the kernels. Weights L x [Np, 2, Np]
(backward: [2, Np, Np]); keep decisions int8; the forward saves "pre" [Bp, 2, Np].
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from rhhjax.kernels import triton
from rhhjax.kernels.layout import Geometry
from rhhjax.kernels.triton import HighwayConfig, validate_config  # noqa: F401  (ModelConfig.kernel)
from rhhjax.ops import loops

if TYPE_CHECKING:
    from rhhjax.ops.sequence_spec import SequenceSpec

Array = jax.Array

NAME = "pallas"
INTERPRETABLE = True
KEEP_DTYPE = jnp.int8
scales_operand = loops.padded_scales  # [T, L, Bp, Np]
LAST_LAYER_COTANGENT = False


def geometry(spec: SequenceSpec, batch: int, width: int) -> Geometry:
    return Geometry.make(spec.kernel, batch, width)


def prepare_weights(spec, geo, kernel_s: Array, transposed: bool = False) -> tuple[Array, ...]:
    """W_l [L, n, 2n] -> L arrays [Np, 2, Np] (``transposed``: [2, Np, Np]), matmul dtype."""
    w = geo.pad_weight(kernel_s, spec.dtype)
    return loops.per_layer(jnp.transpose(w, (0, 2, 3, 1)) if transposed else w)


def saved_rows(has_z: bool) -> loops.Fields:
    """The unscaled matmul "pre" [Bp, 2, Np]."""
    del has_z
    return (("pre", 2),)


def _kernel_args(spec, geo) -> dict:
    return dict(geo=geo, config=spec.kernel, interpret=spec.interpret)


def _layer_forward(spec, geo, s, w_l, z_l, bias_l, xproj_t, keep_l, hidden_l):
    """One micro-layer as one kernel: (s_new [Bp, Np], {"pre": [Bp, 2, Np]})."""
    if hidden_l is not None:
        raise ValueError("impl 'pallas' has no variational dropout")
    s_new, pre = triton.forward_padded(
        s, w_l, z_l, bias_l, xproj_t, keep_l, keep=spec.keep, **_kernel_args(spec, geo)
    )
    return s_new, {"pre": pre}


def forward_loop(spec, geo, w, bias, s0, xproj, z, keep, hidden, save: bool):
    """Forward over all steps: (states [T, L, Bp, Np], packed [T, L, Bp, 3, Np] or None).
    With ``save``, one `triton.forward_stacked` kernel per micro-layer and step."""
    bias = loops.per_layer(bias)
    if not save:
        layer_forward = functools.partial(_layer_forward, spec, geo)
        fields = saved_rows(z is not None)
        return loops.forward_scan(layer_forward, fields, w, bias, s0, xproj, z, keep, hidden, save)
    if hidden is not None:
        raise ValueError("impl 'pallas' has no variational dropout")
    length, depth = xproj.shape[0], len(w)
    packed = jnp.zeros((length, depth, *s0.shape[:1], 3, s0.shape[1]), s0.dtype)

    def body(carry, _):
        (s, packed), t = carry
        for layer in range(depth):
            s, packed = triton.forward_stacked(
                t, s, w[layer], z, bias[layer], xproj if layer == 0 else None, keep, packed,
                layer=layer, keep=spec.keep, **_kernel_args(spec, geo),
            )  # fmt: skip
        return ((s, packed), t + 1), None

    ((s_last, packed), _), _ = jax.lax.scan(body, ((s0, packed), jnp.int32(0)), None, length=length)
    return loops.states_from_inputs(packed[..., 0, :], s_last), packed


def backward_loop(spec, geo, w, bias, s0, xproj, z, keep, hidden, saved, g_states):
    """Reverse loop, one `triton.backward_fused_stacked` kernel per micro-layer and step,
    in a while loop over t; returns as `fused.backward_loop`."""
    del hidden
    length, depth = xproj.shape[0], len(w)
    b_pad, n_pad = s0.shape
    bias = loops.per_layer(bias)
    kernel_args = _kernel_args(spec, geo)
    init = (
        jnp.zeros_like(s0),
        jnp.zeros((length, depth, b_pad, 2, n_pad), s0.dtype),
        None if z is None else jnp.zeros((length, depth, b_pad, n_pad), s0.dtype),
        jnp.zeros((depth, geo.grid[0], 2, n_pad), s0.dtype),
    )

    def body(carry):
        (ds_carry, d_scaled, dz, da_acc), t = carry
        for layer in reversed(range(depth)):
            d_scaled, ds_carry, dz, da_acc = triton.backward_fused_stacked(
                t, d_scaled, w[(layer + 1) % depth], ds_carry, g_states, saved, z,
                bias[layer], xproj if layer == 0 else None, keep, dz, da_acc, layer=layer,
                keep=spec.keep, **kernel_args,
            )  # fmt: skip
        return (ds_carry, d_scaled, dz, da_acc), t - 1

    (ds_carry, d_scaled, dz, da_acc), _ = jax.lax.while_loop(
        lambda carry: carry[1] >= 0, body, (init, jnp.int32(length - 1))
    )
    # ds0 through W_0.
    ds0 = triton.state_grad_padded(d_scaled[0, 0], w[0], ds_carry, **kernel_args)
    dw = loops.deferred_weight_gradient(spec.dtype, saved, d_scaled, saved_rows(z is not None))
    return ds0, d_scaled, dz, da_acc.sum(1), dw
