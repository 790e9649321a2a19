"""Generate text from a trained model (``python -m rhhjax.tools.sample``): the prompt runs in
one call, then ``length`` characters are drawn one at a time in one jitted ``lax.scan``;
``temperature=0`` is greedy and the reserved unknown symbol is never drawn."""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from rhhjax import data as data_lib
from rhhjax import models


@functools.lru_cache(maxsize=16)
def make_generate(
    model_config: models.ModelConfig, length: int, greedy: bool, unk_id: int | None
) -> Callable:
    """Jitted ``(params, prompt [1, P] int32, key, temperature) -> tokens [length] int32``."""
    model = models.build_model(model_config)

    def pick(logits, key, temperature):
        logits = logits.astype(jnp.float32)
        if unk_id is not None:
            logits = logits.at[..., unk_id].set(-jnp.inf)
        if greedy:
            return jnp.argmax(logits, axis=-1).astype(jnp.int32)
        return jax.random.categorical(key, logits / temperature, axis=-1).astype(jnp.int32)

    def generate(params, prompt, key, temperature):
        logits, carry = model.apply({"params": params}, prompt, None, train=False)

        def body(state, step_key):
            carry, last_logits = state
            token = pick(last_logits, step_key, temperature)
            logits, carry = model.apply({"params": params}, token[:, None], carry, train=False)
            return (carry, logits[:, -1]), token[0]

        keys = jax.random.split(key, length)
        _, tokens = jax.lax.scan(body, (carry, logits[:, -1]), keys)
        return tokens

    return jax.jit(generate)


def generate(
    model_config: models.ModelConfig,
    params,
    vocab: data_lib.Vocab,
    prompt: str,
    length: int,
    temperature: float = 1.0,
    seed: int = 0,
) -> str | bytes:
    """``length`` characters (``str``; ``bytes`` for a byte vocabulary) continuing ``prompt``."""
    if length < 1:
        raise data_lib.DataError(f"length must be >= 1, got {length}")
    if not temperature >= 0:
        raise data_lib.DataError(f"temperature must be >= 0, got {temperature}")
    if not prompt:
        raise data_lib.DataError("the prompt must not be empty")
    text = prompt if vocab.kind == "char" else prompt.encode("utf-8")
    try:
        ids = vocab.encode(text, split="prompt").astype(np.int32)[None, :]
    except data_lib.DataError:
        known = set(vocab.symbols)
        bad = next(c for c in text if c not in known)
        raise data_lib.DataError(
            f"the prompt's {bad!r} is not in the model's vocabulary ({len(vocab.symbols)} symbols)"
        ) from None
    fn = make_generate(model_config, int(length), temperature == 0, vocab.unk_id)
    key = jax.random.key(seed)
    tokens = fn(params, ids, key, jnp.float32(max(temperature, 1e-6)))
    return vocab.decode(np.asarray(tokens))
