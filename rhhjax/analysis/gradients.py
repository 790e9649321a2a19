"""Gradient flow (Suarez 2017, Figs. 4-6): the norm of d loss_{T-1} / d x_t for every step t."""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from rhhjax import models
from rhhjax.analysis.subjects import Subject, heldout_windows

Array = jax.Array


def _forward_from_embeddings(module: models.CharLM, x: Array) -> Array:
    """Logits [B, T, V] of embedded inputs x [B, T, E], zero initial state, no dropout."""
    carry = module.initial_carry(x.shape[0])
    outputs, _ = module.core(x, carry, None)
    return module.head(outputs)


def _embed(module: models.CharLM, tokens: Array) -> Array:
    return module.embed(tokens)


def final_step_loss(model_config: models.ModelConfig) -> Callable:
    model = models.build_model(model_config)

    def loss(params, x, targets):
        logits = model.apply({"params": params}, x, method=_forward_from_embeddings)
        logp = jax.nn.log_softmax(logits[:, -1].astype(x.dtype), axis=-1)
        return -jnp.take_along_axis(logp, targets[:, -1:], axis=-1)[:, 0]

    return loss


def embed_fn(model_config: models.ModelConfig) -> Callable:
    model = models.build_model(model_config)
    return lambda params, tokens: model.apply({"params": params}, tokens, method=_embed)


def scaled_norm(g: Array) -> Array:
    """L2 norm over the last axis, scaled first: squares below ~1e-19 underflow in float32."""
    scale = jnp.max(jnp.abs(g), axis=-1, keepdims=True)
    safe = jnp.where(scale > 0, scale, 1.0)
    return scale[..., 0] * jnp.sqrt(jnp.sum(jnp.square(g / safe), axis=-1))


@functools.lru_cache(maxsize=16)
def make_input_gradient_norms(model_config: models.ModelConfig) -> Callable:
    """Jitted ``(params, inputs [B, T], targets [B, T]) -> (norms [B, T], loss [B])``,
    ``norms[b, t] = || d loss_{b, T-1} / d x_{b, t} ||_2`` (one backward of the batch sum)."""
    loss = final_step_loss(model_config)
    embed = embed_fn(model_config)

    def fn(params, inputs, targets):
        x = embed(params, inputs)
        losses, vjp = jax.vjp(lambda x: loss(params, x, targets), x)
        (grad,) = vjp(jnp.ones_like(losses))
        return scaled_norm(grad), losses

    return jax.jit(fn)


def input_gradients(subject: Subject, sequences: int, seq_len: int, batch_size: int) -> dict:
    """Mean (over held-out windows) L2 norm of d loss_{T-1} / d x_t for every t."""
    inputs, targets, starts = heldout_windows(subject.tokens, sequences, seq_len)
    fn = make_input_gradient_norms(subject.config)
    norms, losses = [], []
    for i in range(0, len(inputs), batch_size):
        n, lo = fn(subject.params, inputs[i : i + batch_size], targets[i : i + batch_size])
        norms.append(np.asarray(n, np.float64))
        losses.append(np.asarray(lo, np.float64))
    norms = np.concatenate(norms)
    return {
        "t": list(range(seq_len)),
        "mean_norm": norms.mean(axis=0).tolist(),
        "std_norm": norms.std(axis=0).tolist(),
        "zero_fraction": (norms == 0).mean(axis=0).tolist(),
        "final_step_loss_nats": float(np.concatenate(losses).mean()),
        "sequences": int(len(inputs)),
        "seq_len": int(seq_len),
        "window_starts": starts.tolist(),
    }
