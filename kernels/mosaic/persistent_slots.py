"""The persistent kernels' GEMM-operand buffers in LAYER-MAJOR order.

The forward's A buffer ``s_mm`` (the input state of every phase in the matmul dtype) and the
backward's ``d_mm`` (every phase's ``d_scaled``) hold phase ``p = t * L + l``'s row block
(``b_pad`` rows) at SLOT::

    slot(p) = l * T + t          0 <= p < P = T * L

P slots: layer l's are ``l * T ..``, so the weight gradient ``dW_l = s_mm[layer l]^T @
d_mm[layer l]`` is one batched GEMM over ``[L, T * b_pad, K]`` views of the WHOLE buffers,
with no transpose and no slice copy (a phase-major order interleaves the layers and makes
XLA transpose both: 2.2 GB a paper bf16 step). Nothing else is stored in them: the forward
does not write the state after the last phase there (no phase reads it), and the backward's
last phase, which has no layer above, skips its GEMM instead of reading a zero block. Slot 0
is phase 0 (s0; the d_scaled whose product with W_0 is the gradient of s0).

The hyper scales z and the dz the backward writes are layer-major too, ``[L, T, b_pad,
plan.z_width]`` (the order of the hyper projection's GEMM, which writes z and reads dz, so
neither is transposed or padded on its way: `scales_to_layer_major`, `scales_to_phase_major`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def slot(p, steps: int, depth: int):
    """The row block of phase ``p`` (a Python int or a traced int32 scalar, 0 <= p < P)."""
    if isinstance(p, int):
        return (p % depth) * steps + p // depth
    return jax.lax.rem(p, depth) * steps + jax.lax.div(p, depth)


def to_slots(blocks: Array, steps: int, depth: int) -> Array:
    """blocks [P, ...] in phase order -> the same blocks in slot order."""
    body = blocks.reshape(steps, depth, *blocks.shape[1:])
    return jnp.swapaxes(body, 0, 1).reshape(blocks.shape)


def from_slots(blocks: Array, steps: int, depth: int) -> Array:
    """blocks [P, ...] in slot order -> the same blocks in phase order."""
    body = blocks.reshape(depth, steps, *blocks.shape[1:])
    return jnp.swapaxes(body, 0, 1).reshape(blocks.shape)


def _units(x: Array, width: int) -> Array:
    """x [..., any] -> [..., width]: the last axis cut or zero-padded to ``width``."""
    x = x[..., :width]
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, width - x.shape[-1])])


def inputs_to_a_buffer(inputs: Array, steps: int, depth: int, k_pad: int) -> Array:
    """Every phase's input state [P, b_pad, n] phase-major (zero past the width) -> the A
    buffer's layout [P * b_pad, k_pad] (slot order, the K columns; in f32 it is ``s_mm``)."""
    return to_slots(_units(inputs, k_pad), steps, depth).reshape(-1, k_pad)


def a_buffer_to_inputs(s_mm: Array, steps: int, depth: int, n_pad: int) -> Array:
    """The A buffer [P * b_pad, k_pad] -> every phase's input state [P, b_pad, n_pad]
    phase-major, zero past k_pad (where the state is zero), as the kernels' TMA loads read it."""
    blocks = s_mm.reshape(steps * depth, -1, s_mm.shape[-1])
    return _units(from_slots(blocks, steps, depth), n_pad)


def scales_to_layer_major(z_pm: Array, steps: int, depth: int, z_width: int) -> Array:
    """z [P, b_pad, >= z_width] phase-major (padded units are zero) -> the kernels' z [L, T,
    b_pad, z_width]."""
    body = z_pm[..., :z_width].reshape(steps, depth, *z_pm.shape[1:-1], z_width)
    return jnp.swapaxes(body, 0, 1)


def scales_to_phase_major(z_lt: Array, n_pad: int) -> Array:
    """The kernels' z [L, T, b_pad, z_width] -> [P, b_pad, n_pad] phase-major, the units past
    z_width zero (as the kernels' TMA loads read them)."""
    depth, steps = z_lt.shape[:2]
    z_pm = jnp.swapaxes(z_lt, 0, 1).reshape(steps * depth, *z_lt.shape[2:])
    return jnp.pad(z_pm, [(0, 0), (0, 0), (0, n_pad - z_lt.shape[-1])])
