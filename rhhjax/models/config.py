"""`ModelConfig`: the hashable model configuration, its allowed values and its validation."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from rhhjax.errors import UserError
from rhhjax.ops import cells, lowrank, pallas, spec

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

    The defaults are the paper's HyperRHN (Suarez 2017) and the one place for the ``model``
    block's defaults (``rhhjax.train.config.default_config`` copies them into every config).

    Attributes:
      type: hyperrhn | rhn | lstm.
      vocab_size: output symbols; overwritten from the data's vocabulary at training time.
      embed_dim: character embedding width (paper: 27).
      hidden: main cell width n (LSTM: units per layer).
      hyper_hidden: hypernetwork width h (hyperrhn only).
      depth: recurrence depth L, micro-layers per time step (rhn, hyperrhn).
      lstm_layers: stacked layers (lstm only).
      dropout: gate (paper) | variational (Zilly / Gal) | none.
      keep: keep probability of gate dropout (lstm: between layers).
      keep_input: variational: keep probability on the cell input.
      keep_hidden: variational: keep probability on the state fed to W_l.
      keep_output: variational: keep probability on the output before the softmax.
      t_bias_init: added to the transform-gate bias at init (Zilly: -2 / -4).
      init: orthogonal (the paper code's) | uniform (PyTorch's default Linear).
      hyper_input: x (paper) | x_and_state (Ha's HyperLSTM: also the main state).
      impl: how the recurrence runs (``IMPLS``): auto (the fastest measured one for the
        platform, `rhhjax.ops.spec`), scan (the reference ``nn.scan``), fused (custom VJP),
        pallas (Pallas Triton kernels), mosaic (Mosaic GPU kernels, Hopper only) or
        persistent (one persistent Mosaic GPU kernel per direction, Hopper only); it
        changes speed, not what is computed.
      pallas_mode: the kernels of pallas, mosaic and persistent: auto (compiled on a GPU;
        pallas interpreted elsewhere) | compiled (lowered for a GPU, e.g. to compile a GPU
        step on a CPU host; the trainer refuses it off a GPU) | interpret (pallas: Pallas
        interpret mode; mosaic, persistent: GPU interpret mode, jax >= 0.11.2, slow).
      kernel: block sizes of the Pallas kernels (``kernels/config.py`` ``HighwayConfig``,
        whose defaults compile without spills for an H100).
      dtype: matmul input dtype, float32 | bfloat16 (the carry stays float32).
      hyper_rank: 0 = the paper's column scaling; d > 0: rank-d ``W o sum u_i v_i^T``
        (paper section 4).
      lowrank_op: hyper_rank > 0 with scan: custom_vjp | factored | materialized.
      lowrank_remat: hyper_rank > 0 with scan: recompute u, v, X_u W in the backward.
      original_first_step: rhn, hyperrhn: True reproduces the paper's code exactly (on a
        sequence's first step a row whose state is exactly zero skips layer 0's recurrent
        bias b_0); False: b_0 applies at every step (a documented deviation: at init the
        paper model's logits differ by <= 3.1e-4 at t = 0).
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
    kernel: pallas.HighwayConfig = pallas.HighwayConfig()
    dtype: str = "float32"
    hyper_rank: int = 0
    lowrank_op: str = "custom_vjp"
    lowrank_remat: bool = True
    original_first_step: bool = False

    @classmethod
    def from_config(cls, cfg: Any, **overrides: Any) -> ModelConfig:
        """Builds from a ConfigDict / mapping, ignoring unknown keys, then validates.

        The nested `kernel` block becomes a `pallas.HighwayConfig`.
        """
        items = dict(cfg.items()) if hasattr(cfg, "items") else dict(cfg)
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in items.items() if k in names}
        kwargs.update(overrides)
        kernel = kwargs.get("kernel")
        if kernel is not None and not isinstance(kernel, pallas.HighwayConfig):
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
            pallas.validate_config(self.kernel, self.compute_dtype)
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


def _kernel_config(kernel: Any) -> pallas.HighwayConfig:
    """A mapping (or ConfigDict) of kernel fields -> `pallas.HighwayConfig`."""
    kernel = dict(kernel.items()) if hasattr(kernel, "items") else dict(kernel)
    known = {f.name for f in dataclasses.fields(pallas.HighwayConfig)}
    unknown = sorted(set(kernel) - known)
    if unknown:
        raise ConfigError(f"model.kernel has no field {unknown[0]!r}; one of {sorted(known)}")
    return pallas.HighwayConfig(**kernel)


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


def sequence_spec(
    c: ModelConfig, platform: str | None = None, execute: bool = False
) -> spec.SequenceSpec:
    """The recurrence's implementation for a validated `ModelConfig`: the ONE resolution
    (`rhhjax.ops.spec.resolve`), done once when the model is built. `platform` defaults to
    `jax.default_backend()` (read only for impl "auto" or pallas_mode "auto", and with
    `execute`). `execute`: the model is to run here, not only be lowered for a GPU
    (`spec.check_executable`: the trainer's check before it writes anything)."""
    resolved = spec.resolve(
        c.impl,
        _model_facts(c),
        dtype=c.compute_dtype,
        keep=c.keep,
        pallas_mode=c.pallas_mode,
        kernel=c.kernel,
        platform=platform,
    )
    if execute:
        spec.check_executable(resolved, c.pallas_mode, platform)
    return resolved


def _check_rank(c: ModelConfig) -> None:
    rank = c.hyper_rank
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        raise ConfigError(f"model.hyper_rank={rank!r} must be a non-negative integer")
    if rank > 0 and c.type != "hyperrhn":
        raise ConfigError(f"model.hyper_rank={rank} needs model.type='hyperrhn' (got {c.type!r})")
