"""Shared pieces of the op tests (tests/test_ops_*.py; not collected: no ``test_`` prefix):
the model they compare implementations on (``model_cases.tiny`` at these sizes), a loss whose
gradient reaches every parameter and the final carry, and random tokens and keys."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from model_cases import tiny

from rhhjax import models

# Per matmul dtype: f32 paths differ only in summation order; bf16 rounds the matmul inputs
# identically in all implementations but the backward of `scan` (autodiff) and of the custom
# VJP round different intermediates to bf16.
TOLERANCE = {"float32": 2e-5, "bfloat16": 3e-2}
# The sizes of the op tests: odd enough that no width is a multiple of a block.
SIZES = dict(vocab_size=13, embed_dim=6, hidden=20, hyper_hidden=7, keep=0.6)


def config(**overrides) -> models.ModelConfig:
    """``model_cases.tiny`` at ``SIZES`` with impl "scan" (the reference), with overrides."""
    return tiny(**{**SIZES, "impl": "scan", **overrides})


def loss_fn(model):
    """Mean next-character cross entropy of ``model`` on tokens [B, T+1], plus 0.01 x the
    final carry's sum (so its gradient path is checked too): ``loss(params, tokens, key)``."""

    def loss(p, tokens, key):
        logits, carry = model.apply(
            {"params": p}, tokens[:, :-1], train=True, rngs={"dropout": key}
        )
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
        return loss + 0.01 * sum(jnp.sum(c) for c in jax.tree_util.tree_leaves(carry))

    return loss


@functools.cache
def _value_and_grad_fn(config: models.ModelConfig):
    return jax.jit(jax.value_and_grad(loss_fn(models.build_model(config))))


def loss_and_grads(config: models.ModelConfig, params, tokens, key):
    """(loss, parameter gradients) of ``config``'s model (jitted once per config)."""
    return _value_and_grad_fn(config)(params, tokens, key)


def fresh_case(config: models.ModelConfig, seed: int, batch: int = 5, length: int = 9):
    """(params initialised from ``seed``, tokens [batch, length], a dropout key)."""
    rng = np.random.default_rng(seed)
    model = models.build_model(config)
    params = models.init_params(model, jax.random.key(seed))
    tokens = jnp.asarray(rng.integers(0, config.vocab_size, (batch, length)))
    return params, tokens, jax.random.key(seed + 1)
