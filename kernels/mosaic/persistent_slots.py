"""The persistent kernels' GEMM buffers in layer-major order: phase p = t * L + l's row
block is at slot l * T + t, so dW_l is one batched GEMM over views of the whole buffers
(no transpose). z and dz are layer-major too, [L, T, b_pad, z_width]."""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def slot(p, steps: int, depth: int):
    """The row block of phase ``p`` (int or traced int32)."""
    if isinstance(p, int):
        return (p % depth) * steps + p // depth
    return jax.lax.rem(p, depth) * steps + jax.lax.div(p, depth)


def to_slots(blocks: Array, steps: int, depth: int) -> Array:
    """[P, ...] phase order -> slot order."""
    body = blocks.reshape(steps, depth, *blocks.shape[1:])
    return jnp.swapaxes(body, 0, 1).reshape(blocks.shape)


def from_slots(blocks: Array, steps: int, depth: int) -> Array:
    """[P, ...] slot order -> phase order."""
    body = blocks.reshape(depth, steps, *blocks.shape[1:])
    return jnp.swapaxes(body, 0, 1).reshape(blocks.shape)


def _units(x: Array, width: int) -> Array:
    x = x[..., :width]
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, width - x.shape[-1])])


def inputs_to_a_buffer(inputs: Array, steps: int, depth: int, k_pad: int) -> Array:
    """Input states [P, b_pad, n] -> the A buffer [P * b_pad, k_pad]."""
    return to_slots(_units(inputs, k_pad), steps, depth).reshape(-1, k_pad)


def a_buffer_to_inputs(s_mm: Array, steps: int, depth: int, n_pad: int) -> Array:
    """The A buffer [P * b_pad, k_pad] -> input states [P, b_pad, n_pad], zero past k_pad."""
    blocks = s_mm.reshape(steps * depth, -1, s_mm.shape[-1])
    return _units(from_slots(blocks, steps, depth), n_pad)


def scales_to_layer_major(z_pm: Array, steps: int, depth: int, z_width: int) -> Array:
    """z [P, b_pad, >= z_width] -> [L, T, b_pad, z_width]."""
    body = z_pm[..., :z_width].reshape(steps, depth, *z_pm.shape[1:-1], z_width)
    return jnp.swapaxes(body, 0, 1)


def scales_to_phase_major(z_lt: Array, n_pad: int) -> Array:
    """z [L, T, b_pad, z_width] -> [P, b_pad, n_pad], zero past z_width."""
    depth, steps = z_lt.shape[:2]
    z_pm = jnp.swapaxes(z_lt, 0, 1).reshape(steps * depth, *z_lt.shape[2:])
    return jnp.pad(z_pm, [(0, 0), (0, 0), (0, n_pad - z_lt.shape[-1])])
