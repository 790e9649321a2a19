"""`pallas`: the RHN recurrence's loops as Pallas Triton kernels (`rhhjax.kernels.triton`), one
forward kernel and one backward kernel per micro-layer and step (the interface of
`rhhjax.ops.fused`; run by `rhhjax.ops.recurrence.highway_sequence`).

Forward kernel: matmul, scale, bias, gates, dropout, combine. Backward kernel: the
state-gradient matmul of the layer above fused with the gate backward of the layer below.
When differentiated, the kernels read and write the whole-sequence arrays at the step index
(`*_stacked`), so the time loops hold nothing but the kernels. Compiled on a GPU, interpret
mode elsewhere (`spec.interpret`, from `model.pallas_mode`).

Layout: the kernels' `Geometry` (batch padded to block_b, units to lcm(block_n, block_k));
the weight L x [Np, 2, Np] (transposed for the backward: [2, Np, Np], w_t[h, k, j] =
w[j, h * n + k]); keep decisions int8. The forward saves the unscaled matmul "pre"
[Bp, 2, Np] per micro-layer.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from rhhjax.kernels import triton
from rhhjax.kernels.layout import Geometry
from rhhjax.ops import loops

if TYPE_CHECKING:
    from rhhjax.ops.sequence_spec import ModelFacts, SequenceSpec

Array = jax.Array

NAME = "pallas"
INTERPRETABLE = True  # interpret mode per model.pallas_mode (spec.interpret)
KEEP_DTYPE = jnp.int8


def unsupported(model: ModelFacts) -> str | None:
    """Why `pallas` cannot run `model`, or None (`loops.kernel_unsupported`)."""
    return loops.kernel_unsupported(NAME, model)


unavailable = loops.available_everywhere  # every platform, every model.pallas_mode


substitute = loops.runs_itself  # no other implementation runs a model in its place
scales_operand = loops.padded_scales  # z padded, [T, L, Bp, Np]
LAST_LAYER_COTANGENT = False  # its backward reads every layer's cotangent


def geometry(spec: SequenceSpec, batch: int, width: int) -> Geometry:
    """The kernels' layout for the spec's block sizes."""
    return Geometry.make(spec.kernel, batch, width)


def prepare_weights(spec, geo, kernel_s: Array, transposed: bool = False) -> tuple[Array, ...]:
    """W_l [L, n, 2n] -> L arrays [Np, 2, Np] (transposed: [2, Np, Np]) in the matmul dtype,
    padded and cast ONCE per call (the layouts of `kernels/layout.py`)."""
    w = geo.pad_weight(kernel_s, spec.dtype)  # [L, Np, 2, Np]
    return loops.per_layer(jnp.transpose(w, (0, 2, 3, 1)) if transposed else w)


def saved_rows(has_z: bool) -> loops.Fields:
    """The kernel's unscaled matmul "pre" [Bp, 2, Np], with or without z."""
    del has_z
    return (("pre", 2),)


def _kernel_args(spec, geo) -> dict:
    return dict(geo=geo, config=spec.kernel, interpret=spec.interpret)


def _layer_forward(spec, geo, s, w_l, z_l, bias_l, xproj_t, keep_l, hidden_l):
    """One micro-layer as one Pallas kernel; saved = {"pre": [Bp, 2, Np]} (s W_l)."""
    if hidden_l is not None:
        raise ValueError("impl 'pallas' has no variational dropout")
    s_new, pre = triton.forward_padded(
        s, w_l, z_l, bias_l, xproj_t, keep_l, keep=spec.keep, **_kernel_args(spec, geo)
    )
    return s_new, {"pre": pre}


def forward_loop(spec, geo, w, bias, s0, xproj, z, keep, hidden, save: bool):
    """Forward over all steps (shapes as in `rhhjax.ops.fused.forward_loop`).

    Without `save` (no backward): the generic scan of one kernel per micro-layer. With it:
    ONE kernel per micro-layer and step and nothing else: the kernels read z, keep and xproj
    at the step index straight from the whole-sequence arrays and write each micro-layer's
    (input state, pre) into `packed` [T, L, Bp, 3, Np] in place (`triton.forward_stacked`),
    so no per-step slice or store surrounds them.
    Returns (states [T, L, Bp, Np], packed or None).
    """
    bias = loops.per_layer(bias)  # Sliced here, not in every step (kernels take whole arrays).
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
    """The reverse loop: ONE kernel per micro-layer and step and nothing else.

    `triton.backward_fused_stacked` reads the layer above's d_scaled, the saved (s, pre),
    z, keep, xproj and g at the step index from the whole-sequence arrays and writes
    d_scaled and dz at (t, l) and the partial bias sums in place. A while loop counting t
    down is the only loop state besides the carried state gradient.
    Returns (ds0 [Bp, Np], d_scaled [T, L, Bp, 2, Np], dz [T, L, Bp, Np] or None,
    dbias [L, 2, Np], dW [L, Np, 2, Np]: `loops.deferred_weight_gradient`).
    """
    del hidden  # None: `forward_loop` refused it.
    length, depth = xproj.shape[0], len(w)
    b_pad, n_pad = s0.shape
    bias = loops.per_layer(bias)  # Sliced here, not in every step.
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
    # The state gradient of s0 through W_0 (no gate backward below it).
    ds0 = triton.state_grad_padded(d_scaled[0, 0], w[0], ds_carry, **kernel_args)
    dw = loops.deferred_weight_gradient(spec.dtype, saved, d_scaled, saved_rows(z is not None))
    return ds0, d_scaled, dz, da_acc.sum(1), dw  # The kernel always accumulates the bias sums.
