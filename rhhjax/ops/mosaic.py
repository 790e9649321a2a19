"""`mosaic`: the RHN recurrence with Mosaic GPU kernels (Hopper: wgmma, TMA pipelines), one
forward and one backward kernel per micro-layer and step (the interface of
`rhhjax.ops.fused`; run by `rhhjax.ops.recurrence.highway_sequence`).

Forward (`rhhjax.kernels.mosaic.forward`): the matmul, input projection, hyper scale, bias,
gates, gate dropout and combine; it saves `fused`'s rows ("h", "t" and, with z, "full").
Backward (`rhhjax.kernels.mosaic.backward`; one kernel per micro-layer): the state-gradient
GEMM of the layer above fused with this layer's gate backward, writing d_scaled (the next
GEMM's operand), the carried state gradient and da; dz, the bias and the weight
gradients (`loops.deferred_weight_gradient`) are large XLA reductions and GEMMs after the
loop; the state gradient of s0 is one XLA matmul.

Where it runs: compiled on a GPU; with `model.pallas_mode="interpret"` (`spec.interpret`)
the same kernels executed in GPU interpret mode on the host, race detector on
(`rhhjax.kernels.mosaic.interpret`, jax >= 0.11.2; slow, for checking); with
`model.pallas_mode="compiled"` lowered for a GPU without one (the deviceless H100 compile
report). `unavailable` refuses anything else in one line. `spec.references`, which `resolve`
never sets, runs the kernels' pure-JAX references in their place: the tests' way of checking
everything around the kernels under any jax. f32 models run their matmuls as TF32 on a GPU
(wgmma takes f32 operands as TF32); the interpreter multiplies in f32.

Not supported (`unsupported`): variational dropout and rank-d HyperRHNs (the kernels scale
output columns only). Not in `impl="auto"` until measured on a GPU.

Layout: `Geometry` with the batch padded to the kernels' row tile (64) and the units to a
multiple of 64 (the K tile; the state is the forward's K operand as it is); the forward
weight L x [2 * Np, Np] in the kernel's block-major order (`mosaic_forward.block_weight`),
the backward's L x [Np, 2 * Np] (W as it is: its rows are the backward GEMM's N, K minor);
keep decisions bool (turned into the f32 mask 0 or 1/keep per micro-layer).
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
    from rhhjax.ops.sequence_spec import ModelFacts, SequenceSpec

Array = jax.Array

NAME = "mosaic"
INTERPRETABLE = True  # model.pallas_mode="interpret": GPU interpret mode (jax >= 0.11.2).
KEEP_DTYPE = jnp.bool_  # As `fused`, whose backward loop reads them.
CONFIG = mf.MosaicForwardConfig()  # 64 rows x 8 units per program, K in 64-wide chunks.
BACKWARD_CONFIG = mb.MosaicBackwardConfig()  # 64 rows x 16 units per program.
UNIT_MULTIPLE = math.lcm(CONFIG.units, CONFIG.tile_k, BACKWARD_CONFIG.units)


def unsupported(model: ModelFacts) -> str | None:
    """Why `mosaic` cannot run `model`, or None (`loops.kernel_unsupported`)."""
    return loops.kernel_unsupported(NAME, model)


def unavailable(pallas_mode: str, platform: str | None) -> str | None:
    """Why `mosaic` cannot run here, or None (`loops.hopper_unavailable`)."""
    return loops.hopper_unavailable(NAME, pallas_mode, platform)


substitute = loops.runs_itself  # no other implementation runs a model in its place
scales_operand = loops.padded_scales  # z padded, [T, L, Bp, Np]
LAST_LAYER_COTANGENT = False  # its backward reads every layer's cotangent


def geometry(spec: SequenceSpec, batch: int, width: int) -> Geometry:
    """Batch padded to the kernel's row tile, units to UNIT_MULTIPLE (K = the padded units)."""
    del spec
    b_pad = -(-batch // CONFIG.tile_m) * CONFIG.tile_m
    n_pad = -(-width // UNIT_MULTIPLE) * UNIT_MULTIPLE
    return Geometry(batch, width, CONFIG.tile_m, CONFIG.units, CONFIG.tile_k, b_pad, n_pad)


def prepare_weights(spec, geo, kernel_s: Array, transposed: bool = False) -> tuple[Array, ...]:
    """W_l [L, n, 2n] -> L arrays in the matmul dtype, padded and cast ONCE per call: the
    forward kernel's block-major [2 * Np, Np] (`mf.block_weight`), or (`transposed`, for the
    backward) W as it is [Np, 2 * Np], whose rows the backward GEMM contracts against."""
    w = geo.pad_weight(kernel_s, jnp.float32).reshape(-1, geo.n_pad, 2 * geo.n_pad)
    if transposed:
        return loops.per_layer(w.astype(spec.dtype))
    return tuple(
        mf.block_weight(w[layer], spec.dtype, CONFIG.units, geo.n_pad)
        for layer in range(w.shape[0])
    )


def saved_rows(has_z: bool) -> loops.Fields:
    """`fused`'s rows: the gates "h", "t" [Bp, Np] and, with z, "full" [Bp, 2, Np]."""
    return fused.saved_rows(has_z)


def _layer_forward(spec, save, s, w_l, z_l, bias_l, xproj_t, keep_l, hidden_l):
    """One micro-layer as one Mosaic GPU kernel (its reference when `spec.references`).

    s [Bp, Np] f32; w_l [2 * Np, Np] block-major; bias_l [Bp, 2, Np] (broadcast over rows).
    Returns (s_new [Bp, Np], saved: {} or "h", "t" [Bp, Np] and, with z, "full")."""
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
    """Forward over all steps (`loops.forward_scan` of one kernel per micro-layer; shapes as
    in `rhhjax.ops.fused.forward_loop`). The bias is broadcast over the rows once per call
    (the kernel's epilogue reads tiles only)."""
    rows = jnp.broadcast_to(bias[:, None], (bias.shape[0], geo.b_pad, *bias.shape[1:]))
    layer_forward = functools.partial(_layer_forward, spec, save)
    fields = saved_rows(z is not None)
    return loops.forward_scan(
        layer_forward, fields, w, loops.per_layer(rows), s0, xproj, z, keep, hidden, save
    )


def _layer_backward(spec, d_above, w_above, ds_carry, g_l, packed_l, z_l, keep_l):
    """One micro-layer backward as one Mosaic GPU kernel (its reference when
    `spec.references`): d_above [Bp, 2 * Np] (matmul dtype) and w_above [Np, 2 * Np] of the
    layer above, ds_carry, g_l [Bp, Np], packed_l [Bp, K, Np] this layer's saved rows.
    Returns (d_scaled [Bp, 2 * Np] matmul dtype, ds_carry [Bp, Np], da [Bp, 2, Np])."""
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
    """Reverse loop over all steps: every micro-layer is ONE kernel, the state-gradient GEMM
    of the layer above fused with its own gate backward (`_layer_backward`).

    w: L arrays W_l [Np, 2 * Np] (`prepare_weights(..., transposed=True)`); saved: the
    forward's saved rows; g_states [T, L, Bp, Np] the padded cotangents of the states.
    Returns (ds0 [Bp, Np], d_scaled [T, L, Bp, 2, Np] = da * [z, z], dz [T, L, Bp, Np] or
    None, dbias [L, 2, Np], dW [L, Np, 2, Np]: `loops.deferred_weight_gradient`).
    """
    del geo, bias, hidden  # hidden: None (`forward_loop` refused it).
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
    # The state gradient of s0 through W_0 (no gate backward below it): one XLA matmul.
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
