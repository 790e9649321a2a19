"""The character language model `CharLM` and its helpers."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from absl import logging

from rhhjax.models.cells import Linear
from rhhjax.models.config import ModelConfig, sequence_spec
from rhhjax.models.cores import CORES, DropoutKeys
from rhhjax.ops import cells
from rhhjax.ops.spec import SequenceSpec

Array = jax.Array


class CharLM(nn.Module):
    """Embedding -> core -> Dense: tokens [B, T] -> (logits [B, T, V] f32, carry)."""

    config: ModelConfig
    spec: SequenceSpec

    def setup(self):
        c = self.config
        embed_init = (
            nn.initializers.orthogonal() if c.init == "orthogonal" else nn.initializers.normal(1.0)
        )
        self.embed = nn.Embed(c.vocab_size, c.embed_dim, embedding_init=embed_init)
        self.core = CORES[c.type](c, self.spec)
        self.head = Linear(c.hidden, c.vocab_size, init=c.init, dtype=c.dtype)

    def initial_carry(self, batch: int):
        return self.core.initial_carry(batch)

    def __call__(self, tokens: Array, carry=None, train: bool = False):
        c = self.config
        if carry is None:
            carry = self.core.initial_carry(tokens.shape[0])
        key = self.make_rng("dropout") if train and uses_dropout(c) else None
        x = self.embed(tokens)
        if key is not None and c.dropout == "variational" and c.keep_input < 1.0:
            mkey = DropoutKeys.get(key, DropoutKeys.INPUT)
            x = x * cells.sequence_masks(mkey, (x.shape[0], 1, x.shape[2]), c.keep_input)
        outputs, carry = self.core(x, carry, key)
        if key is not None and c.dropout == "variational" and c.keep_output < 1.0:
            mkey = DropoutKeys.get(key, DropoutKeys.OUTPUT)
            shape = (outputs.shape[0], 1, outputs.shape[2])
            outputs = outputs * cells.sequence_masks(mkey, shape, c.keep_output)
        return self.head(outputs), carry


def uses_dropout(c: ModelConfig) -> bool:
    """Whether training with `c` draws any dropout mask (and so needs a 'dropout' RNG)."""
    if c.dropout == "gate" or c.type == "lstm":
        return c.dropout != "none" and c.keep < 1.0
    if c.dropout == "variational":
        return min(c.keep_input, c.keep_hidden, c.keep_output) < 1.0
    return False


def build_model(config: ModelConfig, platform: str | None = None) -> CharLM:
    """The language model for a validated `ModelConfig`, its implementation resolved and logged."""
    config.validate()
    spec = sequence_spec(config, platform)
    _log_choice(config.impl, spec.impl, spec.reason)
    return CharLM(config, spec)


def implementation_line(requested: str, impl: str, reason: str) -> str:
    return f"model.impl={requested} runs {impl}: {reason}"


@functools.cache
def _log_choice(requested: str, impl: str, reason: str) -> None:
    logging.info("%s", implementation_line(requested, impl, reason))


def init_params(model: CharLM, rng: Array, batch: int = 1, length: int = 1):
    tokens = jnp.zeros((batch, length), jnp.int32)
    return model.init({"params": rng}, tokens)["params"]


def count_params(params) -> int:
    return sum(int(x.size) for x in jax.tree_util.tree_leaves(params))
