"""Pure-JAX math of the highway recurrence, shared by every implementation.

Everything here is a plain function of arrays, so that the textbook `scan` model, the
whole-sequence `fused` op and the Pallas path all compute the same thing from the same
parameters and the same dropout masks.

Shapes: B = batch, T = time, n = cell width, L = recurrence depth (micro-layers),
E = input width.

One micro-layer l (Zilly et al. 2017 eq. 6-9, Suarez 2017 eq. 3-7):

    a   = (s W_l) * [z_l, z_l] + b_l  (+ (x U) * [z_0, z_0] + b_U  at l = 0)
    h   = tanh(a[:, :n]);  t = sigmoid(a[:, n:]);  c = 1 - t     (c from the undropped t)
    s   = h * dropout(t) + s * c

With no hypernetwork, z = 1. The carry `s` is always float32; matmul inputs are cast to the
compute dtype and accumulated in float32.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array


class HighwayWeights(NamedTuple):
    """Parameters of one RHN cell (names match the Flax parameter tree).

    kernel_x: [E, 2n]    input projection U (h-half then t-half).
    bias_x:   [2n]       input bias b_U (layer 0 has two biases, as in the paper's code).
    kernel_s: [L, n, 2n] recurrent matrices W_l.
    bias_s:   [L, 2n]    recurrent biases b_l.
    """

    kernel_x: Array
    bias_x: Array
    kernel_s: Array
    bias_s: Array


def accumulation_dtype(dtype: jnp.dtype) -> jnp.dtype:
    """float32 for float32/bfloat16 inputs; float64 only for float64 (gradient checks)."""
    return jnp.float64 if jnp.dtype(dtype) == jnp.float64 else jnp.float32


def matmul(x: Array, w: Array, dtype: jnp.dtype) -> Array:
    """`x @ w` with inputs cast to `dtype` and float32 accumulation -> float32."""
    acc = accumulation_dtype(dtype)
    return jnp.matmul(x.astype(dtype), w.astype(dtype), preferred_element_type=acc)


def double(z: Array) -> Array:
    """[..., n] -> [..., 2n]: the same scale for the h-half and the t-half."""
    return jnp.concatenate([z, z], axis=-1)


def transform_gate(a: Array) -> Array:
    """t = sigmoid(a_t): [B, 2n] pre-activation (h-half then t-half) -> [B, n], undropped."""
    return jax.nn.sigmoid(a[..., a.shape[-1] // 2 :])


def highway_gate(a: Array, s: Array, mask: Array | None) -> Array:
    """Gate non-linearities and the coupled highway combine.

    Args:
      a: [B, 2n] pre-activation (h-half then t-half), float32.
      s: [B, n] previous state, float32.
      mask: [B, n] inverted-dropout mask on t (0 or 1/keep), or None.
    Returns:
      [B, n] new state.
    """
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
    """One time step of an RHN cell: L micro-layers.

    Args:
      weights: the cell's parameters.
      s: [B, n] state from the previous time step (float32).
      xproj: [B, 2n] input projection `x U` for this step, WITHOUT bias and unscaled.
      z: [L, B, n] hyper scales, or None (plain RHN).
      gate_masks: [L, B, n] dropout masks on the transform gate, or None.
      hidden_masks: [L, B, n] variational masks on the state fed to W_l, or None.
      dtype: matmul input dtype.
      bias0_scale: [B, 1] factor on the layer-0 recurrent bias b_0, or None (= 1). The
        paper's code skips layer 0's recurrent Linear (matmul and b_0) on a sequence's first
        step: `first_step_bias0_scale` gives 0 for those rows (see `ModelConfig`).
    Returns:
      (s_new [B, n], layer_states [L, B, n], gates [L, B, n]) where layer_states[l] is the
      state after micro-layer l (the hypernetwork reads these) and gates[l] its transform
      gate t before dropout (for analysis; an unused output costs nothing under jit).
    """
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
    """The biases added to micro-layer `layer`'s pre-activation: b_l, plus b_U at layer 0.

    Returns [2n], or [B, 2n] when `bias0_scale` [B, 1] scales b_0 (layer 0 only)."""
    if layer > 0:
        return weights.bias_s[layer]
    bias_s = weights.bias_s[0] if bias0_scale is None else weights.bias_s[0] * bias0_scale
    return bias_s + weights.bias_x


def first_step_bias0_scale(s0: Array) -> Array:
    """[B, n] state entering a sequence's first step -> [B, 1]: 0.0 where the row's state is
    exactly zero (the paper's code: the state is the integer 0 and layer 0's recurrent
    Linear, b_0 included, is skipped), 1.0 elsewhere (e.g. a state carried from the
    previous chunk of a stream)."""
    return jnp.any(s0 != 0, axis=-1, keepdims=True).astype(jnp.float32)


def gate_masks(key: Array, step: Array | int, shape: tuple[int, ...], keep: float) -> Array:
    """Fresh inverted-dropout masks for one time step, identical in every implementation.

    Args:
      key: the sequence's dropout key (one per cell).
      step: time index t.
      shape: [L, B, n].
      keep: keep probability.
    Returns:
      float32 array of `shape` with values 0 or 1/keep.
    """
    bits = jax.random.bernoulli(jax.random.fold_in(key, step), keep, shape)
    return bits.astype(jnp.float32) / keep


def gate_keeps(
    key: Array, length: int, shape: tuple[int, ...], keep: float, first_step: int = 0
) -> Array:
    """Gate-dropout keep decisions of a whole sequence, bool [T, *shape].

    Entry i holds exactly the decisions of `gate_masks(key, first_step + i, shape, keep)`
    (the same per-step keys), generated for all steps at once, outside any time loop.
    """
    steps = jnp.arange(first_step, first_step + length)
    return jax.vmap(lambda t: gate_masks(key, t, shape, keep) > 0)(steps)


def gate_backward(
    ds: Array, s: Array, h: Array, t: Array, mask: Array | None
) -> tuple[Array, Array]:
    """Backward of `highway_gate` from its gates h = tanh(a_h), t = sigmoid(a_t).

    Args:
      ds: [B, n] cotangent of the new state; s: [B, n] previous state.
      h, t: [B, n] the gates; mask: [B, n] inverted-dropout mask on t, or None.
    Returns:
      (da [B, 2n] cotangent of the pre-activation, ds_carry [B, n] = ds * (1 - t)).
    """
    t_used = t if mask is None else t * mask
    h_used = h if mask is None else h * mask
    da_h = ds * t_used * (1.0 - h * h)
    da_t = ds * (h_used - s) * t * (1.0 - t)
    return jnp.concatenate([da_h, da_t], axis=-1), ds * (1.0 - t)


def sequence_masks(key: Array, shape: tuple[int, ...], keep: float) -> Array:
    """Variational (per-sequence) inverted-dropout masks of `shape`, 0 or 1/keep."""
    return jax.random.bernoulli(key, keep, shape).astype(jnp.float32) / keep


def hyper_scales(proj_kernel: Array, proj_bias: Array, hyper_states: Array, dtype) -> Array:
    """z_l = s_hyper,l P_l + p_l for every layer.

    Args:
      proj_kernel: [L, h, n]; proj_bias: [L, n].
      hyper_states: [..., L, B, h] hyper layer states (any leading axes, e.g. time).
    Returns:
      [..., L, B, n] float32 scales.
    """
    # As one batched matmul [L, (...)*B, h] x [L, h, n] with the layer axis leading (XLA:CPU
    # has no bf16 x bf16 -> f32 dot for other batch layouts).
    *lead, depth, batch, width = hyper_states.shape
    states = jnp.moveaxis(hyper_states, -3, 0).reshape(depth, -1, width)
    z = jnp.matmul(
        states.astype(dtype),
        proj_kernel.astype(dtype),
        preferred_element_type=accumulation_dtype(dtype),
    )
    z = z + proj_bias[:, None, :]
    return jnp.moveaxis(z.reshape(depth, *lead, batch, -1), 0, -3)
