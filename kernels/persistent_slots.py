"""The persistent kernels' GEMM-operand buffers in LAYER-MAJOR order.

The forward's A buffer ``s_mm`` (the input state of every phase in the matmul dtype) and the
backward's ``d_mm`` (every phase's ``d_scaled``) hold phase ``p = t * L + l``'s row block
(``b_pad`` rows) at SLOT::

    slot(p) = l * (T + 1) + t          0 <= p <= P = T * L

``L * (T + 1)`` slots: layer l's are ``l * (T + 1) ..`` (its T phases, then one spare), so
the weight gradient ``dW_l = s_mm[layer l]^T @ d_mm[layer l]`` is one batched GEMM over
``[L, (T + 1) * b_pad, K]`` views of the WHOLE buffers, with no transpose and no slice copy
(a phase-major order interleaves the layers and makes XLA transpose both, 2.2 GB a paper
bf16 step). Phase P (the state after the last phase; the backward's zero block above the
last phase) is slot T, layer 0's spare. The spares of layers 1.. are written by the kernels'
prologues: finite values in ``s_mm`` (s0), zeros in ``d_mm``, so they add exactly zero to
the gradient. Slot 0 is phase 0 in both orders.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def count(steps: int, depth: int) -> int:
    """Row blocks of a buffer: ``L * (T + 1)``."""
    return depth * (steps + 1)


def slot(p, steps: int, depth: int):
    """The row block of phase ``p`` (a Python int or a traced int32 scalar, 0 <= p <= P)."""
    if isinstance(p, int):
        return (p % depth) * (steps + 1) + p // depth
    return jax.lax.rem(p, depth) * (steps + 1) + jax.lax.div(p, depth)


def spares(steps: int, depth: int) -> list[int]:
    """The slots no phase below P uses: each layer's last (layer 0's is phase P's)."""
    return [layer * (steps + 1) + steps for layer in range(depth)]


def to_slots(blocks: Array, steps: int, depth: int, filler: Array) -> Array:
    """blocks [P + 1, ...] in phase order -> [L * (T + 1), ...] in slot order, the spares of
    layers 1.. set to ``filler`` (one block)."""
    phases = steps * depth
    body = blocks[:phases].reshape(steps, depth, *blocks.shape[1:])
    spare = jnp.broadcast_to(filler, (depth, 1, *blocks.shape[1:])).astype(blocks.dtype)
    spare = spare.at[0, 0].set(blocks[phases])
    return jnp.concatenate([jnp.swapaxes(body, 0, 1), spare], axis=1).reshape(
        count(steps, depth), *blocks.shape[1:]
    )


def from_slots(blocks: Array, steps: int, depth: int) -> Array:
    """blocks [L * (T + 1), ...] in slot order -> the [P + 1, ...] phase blocks in order."""
    phases = steps * depth
    by_layer = blocks.reshape(depth, steps + 1, *blocks.shape[1:])
    body = jnp.swapaxes(by_layer[:, :steps], 0, 1).reshape(phases, *blocks.shape[1:])
    return jnp.concatenate([body, by_layer[0, steps:]], axis=0)
