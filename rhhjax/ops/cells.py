"""Pure-JAX math of the highway recurrence, shared by every implementation.

One micro-layer l (Zilly et al. 2017 eq. 6-9, Suarez 2017 eq. 3-7), s [B, n], x [B, E]:

    a = (s W_l) * [z_l, z_l] + b_l  (+ (x U) * [z_0, z_0] + b_U  at l = 0)
    h = tanh(a[:, :n]);  t = sigmoid(a[:, n:]);  s = h * dropout(t) + s * (1 - t)

z = 1 without a hypernetwork. The carry is float32; matmuls accumulate in float32.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array


class HighwayWeights(NamedTuple):
    """One RHN cell's parameters (Flax names): kernel_x U [E, 2n], bias_x b_U [2n],
    kernel_s W_l [L, n, 2n], bias_s b_l [L, 2n]; gate halves h then t."""

    kernel_x: Array
    bias_x: Array
    kernel_s: Array
    bias_s: Array


def accumulation_dtype(dtype: jnp.dtype) -> jnp.dtype:
    """float32, or float64 for float64 inputs (gradient checks)."""
    return jnp.float64 if jnp.dtype(dtype) == jnp.float64 else jnp.float32


def matmul(x: Array, w: Array, dtype: jnp.dtype) -> Array:
    """x @ w, inputs cast to ``dtype``, accumulated in float32."""
    acc = accumulation_dtype(dtype)
    return jnp.matmul(x.astype(dtype), w.astype(dtype), preferred_element_type=acc)


def double(z: Array) -> Array:
    """[..., n] -> [..., 2n]."""
    return jnp.concatenate([z, z], axis=-1)


def transform_gate(a: Array) -> Array:
    """t = sigmoid(a_t): [B, 2n] -> [B, n], undropped."""
    return jax.nn.sigmoid(a[..., a.shape[-1] // 2 :])


def highway_gate(a: Array, s: Array, mask: Array | None) -> Array:
    """a [B, 2n], s [B, n], mask [B, n] or None -> new state [B, n]."""
    n = s.shape[-1]
    h = jnp.tanh(a[..., :n])
    t = transform_gate(a)
    carry_gate = 1.0 - t
    if mask is not None:
        t = t * mask
    return h * t + s * carry_gate


def highway_step(
    weights: HighwayWeights,
    s: Array,
    xproj: Array,
    z: Array | None,
    gate_masks: Array | None,
    hidden_masks: Array | None,
    dtype: jnp.dtype = jnp.float32,
    bias0_scale: Array | None = None,
) -> tuple[Array, Array, Array]:
    """One time step of an RHN cell (L micro-layers): s [B, n], xproj [B, 2n], z and masks
    [L, B, n] or None -> (s_new [B, n], layer_states [L, B, n], gates [L, B, n])."""
    depth = weights.kernel_s.shape[0]
    layer_states, gates = [], []
    for layer in range(depth):
        s_in = s if hidden_masks is None else s * hidden_masks[layer]
        a = matmul(s_in, weights.kernel_s[layer], dtype)
        if layer == 0:
            a = a + xproj
        if z is not None:
            a = a * double(z[layer])
        a = a + layer_bias(weights, layer, bias0_scale)
        gates.append(transform_gate(a))
        s = highway_gate(a, s, None if gate_masks is None else gate_masks[layer])
        layer_states.append(s)
    return s, jnp.stack(layer_states), jnp.stack(gates)


def layer_bias(weights: HighwayWeights, layer: int, bias0_scale: Array | None) -> Array:
    """b_l, plus b_U at layer 0: [2n], or [B, 2n] with ``bias0_scale`` [B, 1]."""
    if layer > 0:
        return weights.bias_s[layer]
    bias_s = weights.bias_s[0] if bias0_scale is None else weights.bias_s[0] * bias0_scale
    return bias_s + weights.bias_x


def first_step_bias0_scale(s0: Array) -> Array:
    """s0 [B, n] -> [B, 1]: 0 where the state is exactly zero (skip b_0), else 1."""
    return jnp.any(s0 != 0, axis=-1, keepdims=True).astype(jnp.float32)


def gate_masks(key: Array, step: Array | int, shape: tuple[int, ...], keep: float) -> Array:
    """Inverted-dropout masks of one step, ``shape`` [L, B, n], 0 or 1/keep."""
    bits = jax.random.bernoulli(jax.random.fold_in(key, step), keep, shape)
    return bits.astype(jnp.float32) / keep


def gate_keeps(
    key: Array, length: int, shape: tuple[int, ...], keep: float, first_step: int = 0
) -> Array:
    """Keep decisions of a sequence, bool [T, *shape], as `gate_masks` per step."""
    steps = jnp.arange(first_step, first_step + length)
    return jax.vmap(lambda t: gate_masks(key, t, shape, keep) > 0)(steps)


def gate_backward(
    ds: Array, s: Array, h: Array, t: Array, mask: Array | None
) -> tuple[Array, Array]:
    """`highway_gate`'s backward from h, t [B, n]: (da [B, 2n], ds_carry [B, n])."""
    t_used = t if mask is None else t * mask
    h_used = h if mask is None else h * mask
    da_h = ds * t_used * (1.0 - h * h)
    da_t = ds * (h_used - s) * t * (1.0 - t)
    return jnp.concatenate([da_h, da_t], axis=-1), ds * (1.0 - t)


def sequence_masks(key: Array, shape: tuple[int, ...], keep: float) -> Array:
    """Variational (per-sequence) inverted-dropout masks of `shape`, 0 or 1/keep."""
    return jax.random.bernoulli(key, keep, shape).astype(jnp.float32) / keep


def hyper_scales(proj_kernel: Array, proj_bias: Array, hyper_states: Array, dtype) -> Array:
    """z_l = s_hyper,l P_l + p_l: [..., L, B, h] -> [..., L, B, n] f32."""
    # Layer axis leading: XLA:CPU has no bf16 x bf16 -> f32 dot for other batch layouts.
    *lead, depth, batch, width = hyper_states.shape
    states = jnp.moveaxis(hyper_states, -3, 0).reshape(depth, -1, width)
    z = jnp.matmul(
        states.astype(dtype),
        proj_kernel.astype(dtype),
        preferred_element_type=accumulation_dtype(dtype),
    )
    z = z + proj_bias[:, None, :]
    return jnp.moveaxis(z.reshape(depth, *lead, batch, -1), 0, -3)
