"""`ModelConfig`: the hashable model configuration, its allowed values and its validation."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from rhhjax.errors import UserError
from rhhjax.kernels import highway
from rhhjax.ops import cells, lowrank, spec

MODEL_TYPES = ("hyperrhn", "rhn", "lstm")
DROPOUT_MODES = ("gate", "variational", "none")
INITS = ("orthogonal", "uniform")
HYPER_INPUTS = ("x", "x_and_state")
IMPLS = spec.CHOICES  # "auto" and every implementation (decided by `sequence_spec`)
# float64 exists for gradient checks (needs jax_enable_x64); carry and accumulation follow it.
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float64": jnp.float64}


class ConfigError(UserError):
    """An invalid configuration value; the message is one line."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hashable model configuration (built from the `model` block of a config file).

    Fields mirror `configs/ptb.py`; see there for a comment on each.
    """

    type: str = "hyperrhn"
    vocab_size: int = 50
    embed_dim: int = 27
    hidden: int = 1000
    hyper_hidden: int = 128
    depth: int = 7
    lstm_layers: int = 2
    dropout: str = "gate"
    keep: float = 0.65
    keep_input: float = 1.0
    keep_hidden: float = 1.0
    keep_output: float = 1.0
    t_bias_init: float = 0.0
    init: str = "orthogonal"
    hyper_input: str = "x"
    impl: str = "auto"
    pallas_mode: str = "auto"
    kernel: highway.HighwayConfig = highway.HighwayConfig()
    dtype: str = "float32"
    hyper_rank: int = 0
    lowrank_op: str = "custom_vjp"
    lowrank_remat: bool = True
    original_first_step: bool = False

    @classmethod
    def from_config(cls, cfg: Any, **overrides: Any) -> ModelConfig:
        """Builds from a ConfigDict / mapping, ignoring unknown keys, then validates.

        The nested `kernel` block becomes a `highway.HighwayConfig`.
        """
        items = dict(cfg.items()) if hasattr(cfg, "items") else dict(cfg)
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in items.items() if k in names}
        kwargs.update(overrides)
        kernel = kwargs.get("kernel")
        if kernel is not None and not isinstance(kernel, highway.HighwayConfig):
            kwargs["kernel"] = _kernel_config(kernel)
        config = cls(**kwargs)
        config.validate()
        return config

    def validate(self) -> None:
        """Raises ConfigError (one line) on the first invalid field."""
        _check_choices(self)
        _check_numbers(self)
        _check_rank(self)
        _check_combinations(self)
        try:
            highway.validate_config(self.kernel, self.compute_dtype)
        except ValueError as error:
            raise ConfigError(f"model.kernel: {error}") from None
        for name in ("lowrank_remat", "original_first_step"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"model.{name}={getattr(self, name)!r} must be True or False")

    @property
    def compute_dtype(self) -> jnp.dtype:
        return DTYPES[self.dtype]

    @property
    def carry_dtype(self) -> jnp.dtype:
        """float32 whatever the compute dtype (float64 in float64 mode)."""
        return cells.accumulation_dtype(self.compute_dtype)


def _kernel_config(kernel: Any) -> highway.HighwayConfig:
    """A mapping (or ConfigDict) of kernel fields -> `highway.HighwayConfig`."""
    kernel = dict(kernel.items()) if hasattr(kernel, "items") else dict(kernel)
    known = {f.name for f in dataclasses.fields(highway.HighwayConfig)}
    unknown = sorted(set(kernel) - known)
    if unknown:
        raise ConfigError(f"model.kernel has no field {unknown[0]!r}; one of {sorted(known)}")
    return highway.HighwayConfig(**kernel)


def _check_choices(c: ModelConfig) -> None:
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


def _model_facts(c: ModelConfig) -> spec.ModelFacts:
    """The plain values an implementation's support depends on."""
    return spec.ModelFacts(c.type, c.hyper_input, c.dropout, c.hyper_rank)


def _check_combinations(c: ModelConfig) -> None:
    """Whether `impl` can run the model (`rhhjax.ops.spec.check`; needs no device)."""
    try:
        spec.check(c.impl, _model_facts(c))
    except spec.UnsupportedImpl as error:
        raise ConfigError(str(error)) from None


def sequence_spec(c: ModelConfig, platform: str | None = None) -> spec.SequenceSpec:
    """The recurrence's implementation for a validated `ModelConfig`: the ONE resolution
    (`rhhjax.ops.spec.resolve`), done once when the model is built. `platform` defaults to
    `jax.default_backend()` (read only for impl "auto" or pallas_mode "auto")."""
    return spec.resolve(
        c.impl,
        _model_facts(c),
        dtype=c.compute_dtype,
        keep=c.keep,
        pallas_mode=c.pallas_mode,
        kernel=c.kernel,
        platform=platform,
    )


def _check_rank(c: ModelConfig) -> None:
    rank = c.hyper_rank
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        raise ConfigError(f"model.hyper_rank={rank!r} must be a non-negative integer")
    if rank > 0 and c.type != "hyperrhn":
        raise ConfigError(f"model.hyper_rank={rank} needs model.type='hyperrhn' (got {c.type!r})")
