"""The persistent kernels' GEMM-operand buffers in LAYER-MAJOR order.

The forward's A buffer ``s_mm`` (the input state of every phase in the matmul dtype) and the
backward's ``d_mm`` (every phase's ``d_scaled``) have ``P + 1`` row blocks of ``b_pad`` rows,
P = T * L phases (phase ``p = t * L + l``). They hold phase p's block at SLOT::

    slot(p) = l * T + t   for p < P        slot(P) = P

so that the ``T * b_pad`` rows of layer l are contiguous (rows ``l * T * b_pad ..``): the
weight gradient ``dW_l = s_mm[layer l]^T @ d_mm[layer l]`` is then one batched GEMM over
``[L, T * b_pad, K]`` views of the two buffers, with no transpose copy of either (a
phase-major order interleaves the layers and makes XLA transpose both, 2.2 GB a paper bf16
step). Slot 0 is phase 0 (the input s0, the gradient of s0's GEMM) in both orders.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def slot(p, steps: int, depth: int):
    """The row block of phase ``p`` (a Python int or a traced int32 scalar, 0 <= p <= P)."""
    phases = steps * depth
    if isinstance(p, int):
        return phases if p >= phases else (p % depth) * steps + p // depth
    inner = jax.lax.rem(p, depth) * steps + jax.lax.div(p, depth)
    return jnp.where(p >= phases, phases, inner)


def to_slots(blocks: Array, steps: int, depth: int) -> Array:
    """blocks [P + 1, ...] in phase order -> the same blocks in slot order."""
    phases = steps * depth
    body = blocks[:phases].reshape(steps, depth, *blocks.shape[1:])
    body = jnp.swapaxes(body, 0, 1).reshape(phases, *blocks.shape[1:])
    return jnp.concatenate([body, blocks[phases:]], axis=0)


def from_slots(blocks: Array, steps: int, depth: int) -> Array:
    """blocks [P + 1, ...] in slot order -> the same blocks in phase order."""
    phases = steps * depth
    body = blocks[:phases].reshape(depth, steps, *blocks.shape[1:])
    body = jnp.swapaxes(body, 0, 1).reshape(phases, *blocks.shape[1:])
    return jnp.concatenate([body, blocks[phases:]], axis=0)
