"""The one training step: what ``train.py`` trains, the benchmarks time and the ablation sizes.

``make_train_step(model_config, optimizer_config, seed)`` is jitted
``(params, opt_state, carry, inputs [B, T], targets [B, T], reset, step, retry)
-> (params, opt_state, carry, loss, grad_norm)``; ``step_inputs`` builds the arguments of one
call (real arrays or shapes only), ``timed_call`` times one call, ``compiled_memory`` compiles
it without running it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rhhjax import models, parallel
from rhhjax.train.optim import OptimizerConfig, l1_norm, make_optimizer


def dropout_key(seed: int, step, retry) -> jax.Array:
    """``fold_in(key(seed), step)``, folded once more with ``retry`` when it is > 0."""
    key = jax.random.fold_in(jax.random.key(seed), step)
    retried = jax.random.fold_in(key, retry)
    data = jnp.where(retry > 0, jax.random.key_data(retried), jax.random.key_data(key))
    return jax.random.wrap_key_data(data)


def init_key(seed: int) -> jax.Array:
    """The parameter-initialisation key (distinct from every dropout key)."""
    return jax.random.fold_in(jax.random.key(seed), 0xFFFFFFFF)


@functools.lru_cache(maxsize=16)
def make_init(mc: models.ModelConfig) -> Callable:
    """``key -> params``, eagerly: a jitted CPU computation holding several LAPACK calls (the
    orthogonal inits' QRs) can deadlock on few cores on jax 0.10.x."""
    model = models.build_model(mc)
    return lambda key: models.init_params(model, key)


@functools.lru_cache(maxsize=16)
def make_train_step(
    mc: models.ModelConfig,
    oc: OptimizerConfig,
    seed: int,
    mesh: jax.sharding.Mesh | None = None,
    fsdp: bool = False,
) -> Callable:
    """The jitted step (signature: the module docstring). ``reset`` zeroes the carry; no
    gradient flows into the incoming carry; ``grad_norm`` is before clipping; ``step`` seeds
    dropout. With ``mesh`` the outputs keep the data-parallel layout (``rhhjax.parallel``).
    """
    model = models.build_model(mc)
    tx = make_optimizer(oc)

    def loss_fn(params, carry, inputs, targets, key):
        logits, carry = model.apply(
            {"params": params}, inputs, carry, train=True, rngs={"dropout": key}
        )
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
        return jnp.mean(nll), carry

    def step_fn(params, opt_state, carry, inputs, targets, reset, step, retry):
        carry = jax.tree.map(
            lambda c: jax.lax.stop_gradient(jnp.where(reset, jnp.zeros_like(c), c)), carry
        )
        key = dropout_key(seed, step, retry)
        (loss, carry), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            params, carry, inputs, targets, key
        )
        grad_norm = l1_norm(grads) if oc.clip_type == "l1" else optax.tree.norm(grads)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        if mesh is not None:
            params = parallel.constrain_state(params, mesh, fsdp)
            opt_state = parallel.constrain_state(opt_state, mesh, fsdp)
            carry = parallel.constrain_batch(carry, mesh)
            loss, grad_norm = parallel.constrain_replicated((loss, grad_norm), mesh)
        return params, opt_state, carry, loss, grad_norm

    return jax.jit(step_fn, donate_argnums=(0, 1, 2))


def step_inputs(
    mc: models.ModelConfig,
    oc: OptimizerConfig,
    batch: int,
    length: int,
    seed: int = 0,
    abstract: bool = False,
) -> tuple:
    """Arguments of one ``make_train_step`` call (random tokens ``[batch, length]``);
    ``abstract=True``: ``jax.ShapeDtypeStruct`` s only."""

    def build():
        params = make_init(mc)(init_key(seed))
        opt_state = make_optimizer(oc).init(params)
        model = models.build_model(mc)
        carry = model.apply({"params": params}, batch, method=models.CharLM.initial_carry)
        return params, opt_state, carry

    state = jax.eval_shape(build) if abstract else build()
    tokens_shape = (batch, length)
    if abstract:
        tokens = jax.ShapeDtypeStruct(tokens_shape, jnp.int32)
        inputs, targets = tokens, tokens
        flags = (
            jax.ShapeDtypeStruct((), jnp.bool_),
            jax.ShapeDtypeStruct((), jnp.int32),
            jax.ShapeDtypeStruct((), jnp.int32),
        )
    else:
        rng = np.random.default_rng(seed)
        chars = rng.integers(0, mc.vocab_size, (batch, length + 1))
        inputs = jnp.asarray(chars[:, :-1], jnp.int32)
        targets = jnp.asarray(chars[:, 1:], jnp.int32)
        flags = (jnp.asarray(True), jnp.asarray(0, jnp.int32), jnp.asarray(0, jnp.int32))
    return (*state, inputs, targets, *flags)


def timed_call(compiled: Callable, args: list) -> tuple[float, tuple]:
    """(seconds, outputs) of one call of a compiled step on ``args`` (a `step_inputs` list),
    the donated params, opt_state and carry threaded on into ``args``."""
    start = time.perf_counter()
    outs = jax.block_until_ready(compiled(*args))
    args[:3] = outs[:3]
    return time.perf_counter() - start, outs


def compiled_memory(mc: models.ModelConfig, oc: OptimizerConfig, batch: int, length: int):
    """(memory_analysis, compile seconds) of the training step, compiled but never run."""
    args = step_inputs(mc, oc, batch, length, abstract=True)
    start = time.perf_counter()
    compiled = make_train_step(mc, oc, 0).lower(*args).compile()
    return compiled.memory_analysis(), time.perf_counter() - start


def peak_bytes(analysis) -> int:
    """Peak device bytes of a compiled step: arguments + outputs + temporaries - donated."""
    return (
        analysis.argument_size_in_bytes
        + analysis.output_size_in_bytes
        + analysis.temp_size_in_bytes
        - analysis.alias_size_in_bytes
    )
