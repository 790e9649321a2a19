"""`ModelConfig`: the hashable model configuration, its allowed values and its validation."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from rhhjax.errors import UserError
from rhhjax.ops import cells, lowrank, persistent, spec
from rhhjax.ops.persistent_variant import PersistentVariant, VariantError, from_fields

MODEL_TYPES = ("hyperrhn", "rhn", "lstm")
DROPOUT_MODES = ("gate", "variational", "none")
INITS = ("orthogonal", "uniform")
HYPER_INPUTS = ("x", "x_and_state")
IMPLS = spec.CHOICES  # "auto" and every implementation (decided by `sequence_spec`)
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float64": jnp.float64}


class ConfigError(UserError):
    """An invalid configuration value; the message is one line."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hashable model configuration (the ``model`` block); the defaults are the paper's
    HyperRHN (Suarez 2017) and the only copy of them. ``impl``, ``pallas_mode`` and
    ``original_first_step``: docs/design.md."""

    type: str = "hyperrhn"  # hyperrhn | rhn | lstm
    vocab_size: int = 50  # output symbols; overwritten from the data at training time
    embed_dim: int = 27  # character embedding width (paper: 27)
    hidden: int = 1000  # main cell width n (LSTM: units per layer)
    hyper_hidden: int = 128  # hypernetwork width h (hyperrhn)
    depth: int = 7  # recurrence depth L: micro-layers per time step (rhn, hyperrhn)
    lstm_layers: int = 2  # stacked layers (lstm)
    dropout: str = "gate"  # gate (paper) | variational (Zilly / Gal) | none
    keep: float = 0.65  # keep probability of gate dropout (lstm: between layers)
    keep_input: float = 1.0  # variational: keep probability on the cell input
    keep_hidden: float = 1.0  # variational: keep probability on the state fed to W_l
    keep_output: float = 1.0  # variational: keep probability before the softmax
    t_bias_init: float = 0.0  # added to the transform-gate bias at init (Zilly: -2 / -4)
    init: str = "orthogonal"  # orthogonal (the paper code's) | uniform (PyTorch's Linear)
    hyper_input: str = "x"  # x (paper) | x_and_state (HyperLSTM: also the main state)
    impl: str = "auto"  # how the recurrence runs (IMPLS); changes speed, not results
    pallas_mode: str = "auto"  # auto | compiled (lowered for a GPU) | interpret
    persistent: PersistentVariant = PersistentVariant()  # impl=persistent: how it runs
    dtype: str = "float32"  # matmul inputs: float32 | bfloat16 (the carry stays float32)
    hyper_rank: int = 0  # 0: the paper's column scaling; d > 0: rank-d W o sum u_i v_i^T
    lowrank_op: str = "custom_vjp"  # hyper_rank > 0 with scan: custom_vjp | factored | materialized
    lowrank_remat: bool = True  # hyper_rank > 0 with scan: recompute u, v, X_u W in the backward
    original_first_step: bool = False  # True: the paper code's skipped b_0 on the first step

    def __post_init__(self):
        if not isinstance(self.persistent, PersistentVariant):  # a config section's fields
            object.__setattr__(self, "persistent", _variant_of_fields(self.persistent))

    @classmethod
    def from_config(cls, cfg: Any, **overrides: Any) -> ModelConfig:
        """Builds from a ConfigDict / mapping (unknown keys ignored), then validates."""
        items = dict(cfg.items()) if hasattr(cfg, "items") else dict(cfg)
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in items.items() if k in names}
        kwargs.update(overrides)
        config = cls(**kwargs)
        config.validate()
        return config

    def validate(self) -> None:
        """Raises ConfigError (one line) on the first invalid field."""
        _check_choices(self)
        _check_numbers(self)
        _check_rank(self)
        _check_combinations(self)
        for name in ("lowrank_remat", "original_first_step"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"model.{name}={getattr(self, name)!r} must be True or False")

    @property
    def compute_dtype(self) -> jnp.dtype:
        return DTYPES[self.dtype]

    @property
    def carry_dtype(self) -> jnp.dtype:
        return cells.accumulation_dtype(self.compute_dtype)


def _check_choices(c: ModelConfig) -> None:
    why_retired = spec.retired(c.impl)
    if why_retired is not None:
        raise ConfigError(why_retired)
    choices = {
        "type": MODEL_TYPES,
        "dropout": DROPOUT_MODES,
        "init": INITS,
        "hyper_input": HYPER_INPUTS,
        "impl": IMPLS,
        "pallas_mode": spec.PALLAS_MODES,
        "dtype": tuple(DTYPES),
        "lowrank_op": lowrank.OPS,
    }
    for name, allowed in choices.items():
        value = getattr(c, name)
        if value not in allowed:
            raise ConfigError(f"model.{name}={value!r} is not one of {', '.join(allowed)}")


def _check_numbers(c: ModelConfig) -> None:
    for name in ("vocab_size", "embed_dim", "hidden", "hyper_hidden", "depth", "lstm_layers"):
        value = getattr(c, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"model.{name}={value!r} must be a positive integer")
    for name in ("keep", "keep_input", "keep_hidden", "keep_output"):
        value = getattr(c, name)
        if not 0.0 < float(value) <= 1.0:
            raise ConfigError(f"model.{name}={value!r} must be in (0, 1]")


def model_facts(c: ModelConfig) -> spec.ModelFacts:
    """What `rhhjax.ops.spec` reads of a model to decide which implementation runs it."""
    return spec.ModelFacts(c.type, c.hyper_input, c.dropout, c.hyper_rank)


def _check_combinations(c: ModelConfig) -> None:
    """Whether `impl` can run the model (`rhhjax.ops.spec.check`; needs no device)."""
    try:
        spec.check(c.impl, model_facts(c))
    except spec.UnsupportedImpl as error:
        raise ConfigError(str(error)) from None


def sequence_spec(
    c: ModelConfig, platform: str | None = None, execute: bool = False
) -> spec.SequenceSpec:
    """The recurrence's implementation for a validated ``ModelConfig``, resolved once
    (``rhhjax.ops.spec.resolve``); ``execute``: it will run here, not only be lowered."""
    resolved = spec.resolve(
        c.impl,
        model_facts(c),
        dtype=c.compute_dtype,
        keep=c.keep,
        pallas_mode=c.pallas_mode,
        platform=platform,
    )
    if execute:
        spec.check_executable(resolved, c.pallas_mode, platform)
    if resolved.impl == persistent.NAME and c.persistent != PersistentVariant():
        resolved = dataclasses.replace(resolved, variant=c.persistent)
    return resolved


def _variant_of_fields(fields: Any) -> PersistentVariant:
    """``model.persistent`` as a mapping of its fields -> the variant, else ConfigError."""
    if not hasattr(fields, "items"):
        raise ConfigError(f"model.persistent={fields!r} must be a section of fields")
    try:
        return from_fields(dict(fields.items()))
    except VariantError as error:
        raise ConfigError(f"model.persistent: {error}") from None


def _check_rank(c: ModelConfig) -> None:
    rank = c.hyper_rank
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        raise ConfigError(f"model.hyper_rank={rank!r} must be a non-negative integer")
    if rank > 0 and c.type != "hyperrhn":
        raise ConfigError(f"model.hyper_rank={rank} needs model.type='hyperrhn' (got {c.type!r})")
