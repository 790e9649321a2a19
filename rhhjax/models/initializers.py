"""Parameter initialisers ``init(key, shape, dtype)``: orthogonal matrices, uniform biases."""

from __future__ import annotations

import math
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array


def uniform_init(fan_in: int, shift: float = 0.0) -> Callable[..., Array]:
    """PyTorch's default Linear init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (+ shift)."""
    bound = 1.0 / math.sqrt(fan_in)

    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound) + shift

    return init


def matrix_init(kind: str, fan_in: int) -> Callable[..., Array]:
    """Weight init for a [fan_in, fan_out] matrix: orthogonal (paper code) or uniform."""
    if kind == "orthogonal":
        return float32_init(nn.initializers.orthogonal())
    return uniform_init(fan_in)


def float32_init(init: Callable[..., Array]) -> Callable[..., Array]:
    """`init` with a float32 default dtype (Flax's default follows jax_enable_x64)."""

    def wrapped(key, shape, dtype=jnp.float32):
        return init(key, shape, dtype)

    return wrapped


def stacked(init: Callable[..., Array]) -> Callable[..., Array]:
    """Applies a matrix init independently to each [i] of a [L, ...] array."""

    def stacked_init(key, shape, dtype=jnp.float32):
        keys = jax.random.split(key, shape[0])
        return jax.vmap(lambda k: init(k, shape[1:], dtype))(keys)

    return stacked_init


def rhn_bias_init(fan_in: int, width: int, t_bias: float) -> Callable[..., Array]:
    """[L, 2n] biases: uniform, with `t_bias` added to the transform-gate half."""

    def init(key, shape, dtype=jnp.float32):
        bias = uniform_init(fan_in)(key, shape, dtype)
        return bias.at[..., width:].add(t_bias)

    return init
