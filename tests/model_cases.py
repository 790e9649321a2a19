"""Tiny model configurations shared by the model tests (not collected: no test_ prefix)."""

import jax

from rhhjax import models


def tiny(**overrides) -> models.ModelConfig:
    """A small HyperRHN (vocab 11, embedding 5, width 12, hyper 6, depth 3), with overrides."""
    base = dict(type="hyperrhn", vocab_size=11, embed_dim=5, hidden=12, hyper_hidden=6, depth=3)
    base.update(overrides)
    return models.ModelConfig(**base)


def init(config: models.ModelConfig, seed: int):
    """(model, params) of ``config`` initialised from ``seed``."""
    model = models.build_model(config)
    return model, models.init_params(model, jax.random.key(seed))
