"""`mosaic`: the RHN recurrence with each micro-layer forward one Mosaic GPU kernel
(`rhhjax.kernels.mosaic_forward`: wgmma, TMA pipeline, input projection, hyper scale, bias,
gates, gate dropout and combine in the epilogue); Hopper GPUs only (the interface of
`rhhjax.ops.fused`; run by `rhhjax.ops.recurrence.highway_sequence`).

BACKWARD: NOT a Mosaic GPU kernel yet (issue 20 item 1, option (b)): the reverse loop is
`rhhjax.ops.fused.backward_loop` (one XLA state-gradient matmul plus the gate backward per
micro-layer), reading the rows the Mosaic forward saves, which are exactly `fused`'s
("h", "t" and, with z, "full"). A Mosaic backward kernel (the state-gradient GEMM of the
layer above fused with the gate backward) is the next step.

Where it runs: compiled on a GPU (`unavailable` refuses it elsewhere, in one line, unless
`model.pallas_mode="compiled"` asks for the lowering only, as the deviceless H100 compile
report does); there is no interpret mode (JAX 0.10.2's Mosaic GPU interpreter cannot run the
kernel). `spec.interpret`, which `resolve` never sets for this module, runs the kernel's
pure-JAX reference (`highway_forward_reference`) in its place: the tests' way of checking
everything around the kernel on a CPU.

Not supported (`unsupported`): variational dropout and rank-d HyperRHNs (the kernel scales
output columns only). Not in `impl="auto"` until measured on a GPU.

Layout: `Geometry` with the batch padded to the kernel's row tile (64) and the units to a
multiple of lcm(units per program, K tile) = 64, so that the state is the matmul's K operand
as it is; the forward weight L x [2 * Np, Np] in the kernel's block-major order
(`mosaic_forward.block_weight`), the backward's L x [2 * Np, Np] transposed (`fused`'s);
keep decisions bool (turned into the f32 mask 0 or 1/keep per micro-layer).
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from rhhjax.kernels import highway
from rhhjax.kernels import mosaic_forward as mf
from rhhjax.ops import fused, loops

if TYPE_CHECKING:
    from rhhjax.ops.spec import ModelFacts, SequenceSpec

Array = jax.Array

NAME = "mosaic"
INTERPRETABLE = False  # No interpret mode: the kernel runs on a Hopper GPU only.
KEEP_DTYPE = jnp.bool_  # As `fused`, whose backward loop reads them.
CONFIG = mf.MosaicForwardConfig()  # 64 rows x 8 units per program, K in 64-wide chunks.
UNIT_MULTIPLE = math.lcm(CONFIG.units, CONFIG.tile_k)


def unsupported(model: ModelFacts) -> str | None:
    """Why `mosaic` cannot run `model`, or None: what no whole-sequence op runs, variational
    dropout and rank-d HyperRHNs."""
    reason = fused.whole_sequence_unsupported(NAME, model)
    if reason is None and model.dropout == "variational":
        reason = (
            f"model.impl={NAME!r} supports dropout='gate' or 'none'; use impl='fused' "
            "for variational dropout"
        )
    if reason is None and model.hyper_rank > 0:
        reason = (
            f"model.hyper_rank={model.hyper_rank} is not supported by model.impl={NAME!r} "
            "(its kernel scales output columns only); use impl='fused' or 'scan'"
        )
    return reason


def unavailable(pallas_mode: str, platform: str | None) -> str | None:
    """Why `mosaic` cannot run here, or None: on a GPU, or anywhere when `pallas_mode` is
    "compiled" (lowering for a GPU without one, e.g. the deviceless compile report)."""
    if pallas_mode == "compiled":
        return None
    platform = platform or jax.default_backend()
    if pallas_mode == "auto" and platform == "gpu":
        return None
    where = "model.pallas_mode='interpret'" if pallas_mode == "interpret" else platform
    return (
        f"model.impl={NAME!r} runs Mosaic GPU kernels on a Hopper GPU only and cannot be "
        f"interpreted ({where}); use impl='fused' or 'pallas', or model.pallas_mode='compiled' "
        "to lower and compile for a GPU without one"
    )


def geometry(spec: SequenceSpec, batch: int, width: int) -> highway.Geometry:
    """Batch padded to the kernel's row tile, units to UNIT_MULTIPLE (K = the padded units)."""
    del spec
    b_pad = -(-batch // CONFIG.tile_m) * CONFIG.tile_m
    n_pad = -(-width // UNIT_MULTIPLE) * UNIT_MULTIPLE
    return highway.Geometry(batch, width, CONFIG.tile_m, CONFIG.units, CONFIG.tile_k, b_pad, n_pad)


def prepare_weights(spec, geo, kernel_s: Array, transposed: bool = False) -> tuple[Array, ...]:
    """W_l [L, n, 2n] -> L arrays in the matmul dtype, padded and cast ONCE per call: the
    kernel's block-major [2 * Np, Np] (`mf.block_weight`), or transposed `fused`'s W^T
    [2 * Np, Np] for its backward loop."""
    if transposed:
        return fused.prepare_weights(spec, geo, kernel_s, transposed=True)
    w = geo.pad_weight(kernel_s, jnp.float32).reshape(-1, geo.n_pad, 2 * geo.n_pad)
    return tuple(
        mf.block_weight(w[layer], spec.dtype, CONFIG.units, geo.n_pad)
        for layer in range(w.shape[0])
    )


def saved_rows(has_z: bool) -> loops.Fields:
    """`fused`'s rows: the gates "h", "t" [Bp, Np] and, with z, "full" [Bp, 2, Np]."""
    return fused.saved_rows(has_z)


def _layer_forward(spec, save, s, w_l, z_l, bias_l, xproj_t, keep_l, hidden_l):
    """One micro-layer as one Mosaic GPU kernel (its reference when `spec.interpret`).

    s [Bp, Np] f32; w_l [2 * Np, Np] block-major; bias_l [Bp, 2, Np] (broadcast over rows).
    Returns (s_new [Bp, Np], saved: {} or "h", "t" [Bp, Np] and, with z, "full")."""
    if hidden_l is not None:
        raise ValueError(f"impl {NAME!r} has no variational dropout")
    mask = fused._mask(spec, keep_l, jnp.float32)
    args = (s.astype(spec.dtype), w_l, s, bias_l, z_l, xproj_t, mask)
    if spec.interpret:
        out = mf.highway_forward_reference(*args, save=save, units=CONFIG.units)
    else:
        out = mf.highway_forward(*args, save=save, config=CONFIG)
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


def backward_loop(spec, geo, w_t, bias, s0, xproj, z, keep, hidden, packed, g_states):
    """`rhhjax.ops.fused.backward_loop` on the Mosaic forward's saved rows (the same rows):
    one XLA matmul plus the gate backward per micro-layer (no Mosaic backward kernel yet).
    Returns (ds0 [Bp, Np], d_scaled [T, L, Bp, 2, Np], dz [T, L, Bp, Np] or None,
    dbias [L, 2, Np])."""
    return fused.backward_loop(spec, geo, w_t, bias, s0, xproj, z, keep, hidden, packed, g_states)
