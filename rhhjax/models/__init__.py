"""Flax (linen) models: RHN cell, HyperRHN cell, stacked LSTM and the character LM.

The language model is Embedding(V, E) -> recurrent core -> Dense(V) (Suarez 2017).
The time recurrence of the RHN cores is selected by `ModelConfig.impl`:
`scan` is the textbook Flax `nn.scan` over the cell with plain autodiff (the reference);
`fused` and `pallas` run the whole recurrence as one op (see `rhhjax.recurrence`).
All implementations read the same parameter tree, so a checkpoint runs on any of them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from rhhjax.errors import UserError
from rhhjax.kernels import highway
from rhhjax.ops import cells, lowrank, recurrence

Array = jax.Array

MODEL_TYPES = ("hyperrhn", "rhn", "lstm")
DROPOUT_MODES = ("gate", "variational", "none")
INITS = ("orthogonal", "uniform")
HYPER_INPUTS = ("x", "x_and_state")
IMPLS = ("scan", *recurrence.IMPLS)
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
    impl: str = "scan"
    pallas_mode: str = "auto"
    kernel: highway.HighwayConfig = highway.HighwayConfig()
    dtype: str = "float32"
    hyper_rank: int = 0
    lowrank_op: str = "custom_vjp"
    lowrank_remat: bool = True

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
            kernel = dict(kernel.items()) if hasattr(kernel, "items") else dict(kernel)
            known = {f.name for f in dataclasses.fields(highway.HighwayConfig)}
            unknown = sorted(set(kernel) - known)
            if unknown:
                raise ConfigError(
                    f"model.kernel has no field {unknown[0]!r}; one of {sorted(known)}"
                )
            kwargs["kernel"] = highway.HighwayConfig(**kernel)
        config = cls(**kwargs)
        config.validate()
        return config

    def validate(self) -> None:
        """Raises ConfigError (one line) on the first invalid field."""
        choices = {
            "type": MODEL_TYPES,
            "dropout": DROPOUT_MODES,
            "init": INITS,
            "hyper_input": HYPER_INPUTS,
            "impl": IMPLS,
            "pallas_mode": recurrence.PALLAS_MODES,
            "dtype": tuple(DTYPES),
            "lowrank_op": lowrank.OPS,
        }
        for name, allowed in choices.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ConfigError(f"model.{name}={value!r} is not one of {', '.join(allowed)}")
        for name in ("vocab_size", "embed_dim", "hidden", "hyper_hidden", "depth", "lstm_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"model.{name}={value!r} must be a positive integer")
        for name in ("keep", "keep_input", "keep_hidden", "keep_output"):
            value = getattr(self, name)
            if not 0.0 < float(value) <= 1.0:
                raise ConfigError(f"model.{name}={value!r} must be in (0, 1]")
        if self.impl != "scan" and self.hyper_input != "x" and self.type == "hyperrhn":
            raise ConfigError(
                f"model.impl={self.impl!r} needs model.hyper_input='x' (x_and_state reads the "
                "main state, so the hyper recurrence cannot run first); use impl='scan'"
            )
        if self.impl == "pallas" and self.dropout == "variational":
            raise ConfigError(
                "model.impl='pallas' supports dropout='gate' or 'none'; use impl='fused' "
                "for variational dropout"
            )
        if self.type == "lstm" and self.impl != "scan":
            raise ConfigError(
                f"model.impl={self.impl!r} is only for RHN models; use 'scan' for lstm"
            )
        try:
            highway.validate_config(self.kernel, self.compute_dtype)
        except ValueError as error:
            raise ConfigError(f"model.kernel: {error}") from None
        if not isinstance(self.lowrank_remat, bool):
            raise ConfigError(f"model.lowrank_remat={self.lowrank_remat!r} must be True or False")
        rank = self.hyper_rank
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
            raise ConfigError(f"model.hyper_rank={rank!r} must be a non-negative integer")
        if rank > 0 and self.type != "hyperrhn":
            raise ConfigError(
                f"model.hyper_rank={rank} needs model.type='hyperrhn' (got {self.type!r})"
            )
        if rank > 0 and self.impl == "pallas":
            raise ConfigError(
                f"model.hyper_rank={rank} is not supported by model.impl='pallas' (its kernels "
                "scale output columns only); use impl='fused' or 'scan'"
            )

    @property
    def compute_dtype(self) -> jnp.dtype:
        return DTYPES[self.dtype]

    @property
    def carry_dtype(self) -> jnp.dtype:
        """float32 whatever the compute dtype (float64 in float64 mode)."""
        return cells.accumulation_dtype(self.compute_dtype)


# ----------------------------------------------------------------------------- initializers


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


# ----------------------------------------------------------------------------- cells


class RHNCell(nn.RNNCellBase):
    """Recurrent Highway Network cell with coupled gates and recurrence depth L.

    Parameters: kernel_x [E, 2n], bias_x [2n], kernel_s [L, n, 2n], bias_s [L, 2n].
    `__call__(carry [B, n], x [B, E]) -> (carry, y)` follows `nn.RNNCellBase`, so the cell
    works with `nn.RNN` (pass `split_rngs={"params": False, "dropout": True}` for
    gate dropout). Language models use `input_projection` + `step` instead, which hoist
    `x U` out of the time loop.
    """

    features: int
    input_features: int
    depth: int
    init: str = "orthogonal"
    t_bias_init: float = 0.0
    keep: float = 1.0
    deterministic: bool = True
    dtype: str = "float32"

    def setup(self):
        n, e, depth = self.features, self.input_features, self.depth
        self.kernel_x = self.param("kernel_x", matrix_init(self.init, e), (e, 2 * n))
        self.bias_x = self.param("bias_x", uniform_init(e), (2 * n,))
        self.kernel_s = self.param(
            "kernel_s", stacked(matrix_init(self.init, n)), (depth, n, 2 * n)
        )
        self.bias_s = self.param("bias_s", rhn_bias_init(n, n, self.t_bias_init), (depth, 2 * n))

    def weights(self) -> cells.HighwayWeights:
        """The parameter arrays as a `HighwayWeights` tuple."""
        return cells.HighwayWeights(self.kernel_x, self.bias_x, self.kernel_s, self.bias_s)

    def input_projection(self, x: Array) -> Array:
        """[..., E] -> [..., 2n]: `x U` without bias, float32."""
        return cells.matmul(x, self.kernel_x, DTYPES[self.dtype])

    def step(self, s, xproj, z=None, gate_masks=None, hidden_masks=None):
        """One time step; see `cells.highway_step` for shapes."""
        return cells.highway_step(
            self.weights(), s, xproj, z, gate_masks, hidden_masks, DTYPES[self.dtype]
        )

    def __call__(self, carry: Array, x: Array) -> tuple[Array, Array]:
        """carry [B, n], x [B, E] -> (carry, output), both [B, n]."""
        masks = None
        if not self.deterministic and self.keep < 1.0:
            shape = (self.depth, *carry.shape)
            masks = cells.gate_masks(self.make_rng("dropout"), 0, shape, self.keep)
        s, _ = self.step(carry, self.input_projection(x), None, masks)
        return s, s

    @nn.nowrap
    def initialize_carry(self, rng, input_shape) -> Array:
        """Zero state [*batch, n] for inputs of `input_shape` [*batch, E]."""
        del rng
        carry_dtype = cells.accumulation_dtype(DTYPES[self.dtype])
        return jnp.zeros((*input_shape[:-1], self.features), carry_dtype)

    @property
    def num_feature_axes(self) -> int:
        return 1


class HyperRHNCell(nn.Module):
    """Recurrent Highway Hypernetwork cell (Suarez 2017).

    A small RHN (`hyper`, width h) reads the input (and, with `hyper_input="x_and_state"`,
    the previous main state); after each hyper micro-layer l, `z_l = s_hyper,l P_l + p_l`
    scales every output column of the main cell's matmuls at layer l ([z_l, z_l] over
    both gate halves; at l = 0 the input matmul too). Biases are not scaled.

    Parameters: hyper/* (an RHNCell), main/* (an RHNCell), proj_kernel [L, h, n],
    proj_bias [L, n].

    With `hyper_rank = d > 0` (Suarez section 4) the main matmuls are instead scaled by a
    per-example rank-d matrix, W~_l = W_l o sum_i u_l,i [v_l,i, v_l,i]^T (and U~ at l = 0);
    proj_* are replaced by u_kernel, u_bias, v_kernel, v_bias, u_x_kernel, u_x_bias and
    the main input is not pre-projected. See `rhhjax.lowrank`.
    """

    features: int
    hyper_features: int
    input_features: int
    depth: int
    hyper_input: str = "x"
    init: str = "orthogonal"
    t_bias_init: float = 0.0
    dtype: str = "float32"
    hyper_rank: int = 0
    lowrank_op: str = "custom_vjp"
    lowrank_remat: bool = True

    def setup(self):
        n, h, depth = self.features, self.hyper_features, self.depth
        hyper_in = self.input_features + (n if self.hyper_input == "x_and_state" else 0)
        common = dict(depth=depth, init=self.init, t_bias_init=self.t_bias_init, dtype=self.dtype)
        self.hyper = RHNCell(features=h, input_features=hyper_in, **common)
        self.main = RHNCell(features=n, input_features=self.input_features, **common)
        if self.hyper_rank > 0:
            self.lowrank_scales = lowrank.declare_params(
                self, depth, h, n, self.input_features, self.hyper_rank,
                matrix_init(self.init, h), uniform_init(h),
            )  # fmt: skip
            return
        self.proj_kernel = self.param(
            "proj_kernel", stacked(matrix_init(self.init, h)), (depth, h, n)
        )
        self.proj_bias = self.param("proj_bias", uniform_init(h), (depth, n))

    def input_projections(self, x: Array) -> tuple[Array, Array]:
        """x [..., E] -> (hyper xproj [..., 2h], main xproj [..., 2n]), no biases.

        With `hyper_input="x_and_state"` only the x part of the hyper input is projected;
        the state part is added inside the time loop.
        """
        e = self.input_features
        hyper_xproj = cells.matmul(x, self.hyper.kernel_x[:e], DTYPES[self.dtype])
        if self.hyper_rank > 0:  # x U~ depends on the step's u^x: the main cell gets x.
            return hyper_xproj, x
        return hyper_xproj, self.main.input_projection(x)

    def scales(self, hyper_layer_states: Array) -> Array:
        """[..., L, B, h] hyper layer states -> [..., L, B, n] scales z."""
        return cells.hyper_scales(
            self.proj_kernel, self.proj_bias, hyper_layer_states, DTYPES[self.dtype]
        )

    def step(self, carry, xprojs, masks):
        """One time step: all hyper layers, then all main layers.

        Args:
          carry: (s_hyper [B, h], s_main [B, n]).
          xprojs: (hyper xproj [B, 2h], main xproj [B, 2n]) for this step.
          masks: dict with optional "hyper_gate", "main_gate" ([L, B, *]) and
            "hyper_hidden", "main_hidden" ([L, B, *]) arrays (missing = no dropout).
        Returns:
          (new carry, s_main [B, n]).
        """
        s_hyper, s_main = carry
        hyper_xproj, main_xproj = xprojs
        if self.hyper_input == "x_and_state":
            state_part = self.hyper.kernel_x[self.input_features :]
            hyper_xproj = hyper_xproj + cells.matmul(s_main, state_part, DTYPES[self.dtype])
        s_hyper, hyper_layers = self.hyper.step(
            s_hyper, hyper_xproj, None, masks.get("hyper_gate"), masks.get("hyper_hidden")
        )
        if self.hyper_rank > 0:
            s_main, _ = lowrank.highway_step(
                self.main.weights(), self.lowrank_scales, s_main, main_xproj, hyper_layers,
                masks.get("main_gate"), masks.get("main_hidden"), DTYPES[self.dtype],
                op=self.lowrank_op, remat=self.lowrank_remat,
            )  # fmt: skip
            return (s_hyper, s_main), s_main
        z = self.scales(hyper_layers)
        s_main, _ = self.main.step(
            s_main, main_xproj, z, masks.get("main_gate"), masks.get("main_hidden")
        )
        return (s_hyper, s_main), s_main

    def __call__(self, carry, x):
        """Deterministic single step, for use outside a language model: x [B, E]."""
        return self.step(carry, self.input_projections(x), {})


class LSTMCell(nn.Module):
    """LSTM layer parameters (gate order i, f, g, o; one bias).

    kernel_x [E, 4H], kernel_h [H, 4H], bias [4H].
    """

    features: int
    input_features: int
    init: str = "orthogonal"
    dtype: str = "float32"

    def setup(self):
        e, hdim = self.input_features, self.features
        self.kernel_x = self.param("kernel_x", matrix_init(self.init, e), (e, 4 * hdim))
        self.kernel_h = self.param("kernel_h", matrix_init(self.init, hdim), (hdim, 4 * hdim))
        self.bias = self.param("bias", uniform_init(hdim), (4 * hdim,))

    def input_projection(self, x: Array) -> Array:
        """[..., E] -> [..., 4H] including the bias."""
        return cells.matmul(x, self.kernel_x, DTYPES[self.dtype]) + self.bias

    def step(self, carry, xproj):
        """carry (c, h) each [B, H]; xproj [B, 4H] -> (carry, h)."""
        c, h = carry
        gates = xproj + cells.matmul(h, self.kernel_h, DTYPES[self.dtype])
        i, f, g, o = jnp.split(gates, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (c, h), h


class Linear(nn.Module):
    """Dense layer with float32 accumulation: kernel [in, out], bias [out]."""

    in_features: int
    out_features: int
    init: str = "orthogonal"
    dtype: str = "float32"

    def setup(self):
        shape = (self.in_features, self.out_features)
        self.kernel = self.param("kernel", matrix_init(self.init, self.in_features), shape)
        self.bias = self.param("bias", uniform_init(self.in_features), (self.out_features,))

    def __call__(self, x: Array) -> Array:
        """[..., in] -> [..., out] float32."""
        return cells.matmul(x, self.kernel, DTYPES[self.dtype]) + self.bias


# ----------------------------------------------------------------------------- time loops


def _scan_over_time(body: Callable, module: nn.Module, carry, xs, *broadcast):
    """`nn.scan` of `body(module, carry, xs_t, *broadcast)` over the leading (time) axis."""
    scanned = nn.scan(
        body,
        variable_broadcast="params",
        split_rngs={"params": False},
        in_axes=(0,) + (nn.broadcast,) * len(broadcast),
        out_axes=0,
    )
    return scanned(module, carry, xs, *broadcast)


def _rhn_body(cell: RHNCell, s, xs, gate_key, hidden_masks):
    step, xproj = xs
    gate = None
    if gate_key is not None:
        gate = cells.gate_masks(gate_key, step, (cell.depth, *s.shape), cell.keep)
    s, _ = cell.step(s, xproj, None, gate, hidden_masks)
    return s, s


def _hyper_body(cell: HyperRHNCell, carry, xs, keep, keys, hidden_masks):
    step, xprojs = xs
    masks = dict(hidden_masks)
    if keys is not None:
        s_hyper, s_main = carry
        masks["hyper_gate"] = cells.gate_masks(keys[0], step, (cell.depth, *s_hyper.shape), keep)
        masks["main_gate"] = cells.gate_masks(keys[1], step, (cell.depth, *s_main.shape), keep)
    return cell.step(carry, xprojs, masks)


def _lstm_body(cell: LSTMCell, carry, xproj):
    return cell.step(carry, xproj)


class DropoutKeys:
    """Named sub-keys of one dropout key, identical for every implementation."""

    HYPER_GATE, MAIN_GATE, INPUT, HYPER_HIDDEN, MAIN_HIDDEN, OUTPUT = range(6)

    @staticmethod
    def get(key: Array, which: int) -> Array:
        return jax.random.fold_in(key, which)


def _gate_key(c: ModelConfig, key: Array | None, which: int) -> Array | None:
    """The gate-dropout key of one cell, or None when gate dropout is off."""
    if key is None or c.dropout != "gate" or c.keep >= 1.0:
        return None
    return DropoutKeys.get(key, which)


def _hidden_masks(c: ModelConfig, key: Array | None, which: int, batch: int, width: int):
    """Variational masks [L, B, width] on the state fed to W_l, or None when off."""
    if key is None or c.dropout != "variational" or c.keep_hidden >= 1.0:
        return None
    mkey = DropoutKeys.get(key, which)
    return cells.sequence_masks(mkey, (c.depth, batch, width), c.keep_hidden)


class RHNCore(nn.Module):
    """Plain RHN over a sequence. x [B, T, E] -> (outputs [B, T, n], carry [B, n])."""

    config: ModelConfig

    def setup(self):
        c = self.config
        self.cell = RHNCell(
            features=c.hidden,
            input_features=c.embed_dim,
            depth=c.depth,
            init=c.init,
            t_bias_init=c.t_bias_init,
            keep=c.keep,
            dtype=c.dtype,
        )

    def initial_carry(self, batch: int) -> Array:
        return jnp.zeros((batch, self.config.hidden), self.config.carry_dtype)

    def __call__(self, x: Array, carry: Array, key: Array | None):
        c = self.config
        gate_key = _gate_key(c, key, DropoutKeys.MAIN_GATE)
        hidden_masks = _hidden_masks(c, key, DropoutKeys.MAIN_HIDDEN, x.shape[0], c.hidden)
        xproj = jnp.swapaxes(self.cell.input_projection(x), 0, 1)  # [T, B, 2n]
        steps = jnp.arange(x.shape[1])
        if c.impl == "scan":
            carry, ys = _scan_over_time(
                _rhn_body, self.cell, carry, (steps, xproj), gate_key, hidden_masks
            )
        else:
            spec = recurrence.resolve_spec(c, gate_key is not None)
            states = recurrence.highway_sequence(
                spec, self.cell.weights(), carry, xproj, None, gate_key, hidden_masks
            )
            carry, ys = states[-1, -1], states[:, -1]
        return jnp.swapaxes(ys, 0, 1), carry


class HyperRHNCore(nn.Module):
    """HyperRHN over a sequence. x [B, T, E] -> (outputs [B, T, n], (s_hyper, s_main))."""

    config: ModelConfig

    def setup(self):
        c = self.config
        self.cell = HyperRHNCell(
            features=c.hidden,
            hyper_features=c.hyper_hidden,
            input_features=c.embed_dim,
            depth=c.depth,
            hyper_input=c.hyper_input,
            init=c.init,
            t_bias_init=c.t_bias_init,
            dtype=c.dtype,
            hyper_rank=c.hyper_rank,
            lowrank_op=c.lowrank_op,
            lowrank_remat=c.lowrank_remat,
        )

    def initial_carry(self, batch: int):
        c = self.config
        return (
            jnp.zeros((batch, c.hyper_hidden), c.carry_dtype),
            jnp.zeros((batch, c.hidden), c.carry_dtype),
        )

    def __call__(self, x: Array, carry, key: Array | None):
        c = self.config
        batch = x.shape[0]
        hyper_key = _gate_key(c, key, DropoutKeys.HYPER_GATE)
        keys = None if hyper_key is None else (hyper_key, _gate_key(c, key, DropoutKeys.MAIN_GATE))
        masks = {
            "hyper_hidden": _hidden_masks(c, key, DropoutKeys.HYPER_HIDDEN, batch, c.hyper_hidden),
            "main_hidden": _hidden_masks(c, key, DropoutKeys.MAIN_HIDDEN, batch, c.hidden),
        }
        hidden_masks = {name: m for name, m in masks.items() if m is not None}
        hyper_xproj, main_xproj = self.cell.input_projections(x)
        xprojs = (jnp.swapaxes(hyper_xproj, 0, 1), jnp.swapaxes(main_xproj, 0, 1))
        steps = jnp.arange(x.shape[1])
        if c.impl == "scan":
            carry, ys = _scan_over_time(
                _hyper_body, self.cell, carry, (steps, xprojs), c.keep, keys, hidden_masks
            )
        else:
            carry, ys = self._whole_sequence(carry, xprojs, keys, hidden_masks)
        return jnp.swapaxes(ys, 0, 1), carry

    def _whole_sequence(self, carry, xprojs, keys, hidden_masks):
        """`fused` / `pallas` (hyper_input="x"): the hyper recurrence over the whole sequence,
        every z at once (one batched matmul), then the main recurrence.

        carry: (s_hyper [B, h], s_main [B, n]); xprojs: ([T, B, 2h], [T, B, 2n] or, with
        hyper_rank > 0, the raw input [T, B, E]). Returns (carry, outputs [T, B, n]).
        """
        c, cell = self.config, self.cell
        s_hyper, s_main = carry
        hyper_xproj, main_xproj = xprojs
        hyper_key, main_key = (None, None) if keys is None else keys
        spec = recurrence.resolve_spec(c, keys is not None)
        hyper_states = recurrence.highway_sequence(
            spec, cell.hyper.weights(), s_hyper, hyper_xproj, None, hyper_key,
            hidden_masks.get("hyper_hidden"),
        )  # fmt: skip
        main_hidden = hidden_masks.get("main_hidden")
        if c.hyper_rank > 0:  # Suarez section 4: main_xproj holds the raw input x here.
            main_states = lowrank.lowrank_sequence(
                spec, cell.main.weights(), cell.lowrank_scales, s_main, main_xproj,
                hyper_states, main_key, main_hidden,
            )  # fmt: skip
        else:
            main_states = recurrence.highway_sequence(
                spec, cell.main.weights(), s_main, main_xproj, cell.scales(hyper_states),
                main_key, main_hidden,
            )  # fmt: skip
        return (hyper_states[-1, -1], main_states[-1, -1]), main_states[:, -1]


class LSTMCore(nn.Module):
    """Stacked LSTM (the paper's baseline: 2 x 1125). x [B, T, E] -> (outputs, carry).

    Dropout (`dropout != "none"`, keep probability `keep`) is applied to the output of
    every layer but the last (the LM applies its own output dropout), Zaremba-style.
    """

    config: ModelConfig

    def setup(self):
        c = self.config
        self.layers = [
            LSTMCell(
                features=c.hidden,
                input_features=c.embed_dim if i == 0 else c.hidden,
                init=c.init,
                dtype=c.dtype,
            )
            for i in range(c.lstm_layers)
        ]

    def initial_carry(self, batch: int):
        zeros = jnp.zeros((batch, self.config.hidden), self.config.carry_dtype)
        return tuple((zeros, zeros) for _ in range(self.config.lstm_layers))

    def __call__(self, x: Array, carry, key: Array | None):
        c = self.config
        new_carry = []
        h = x
        for i, layer in enumerate(self.layers):
            xproj = jnp.swapaxes(layer.input_projection(h), 0, 1)
            layer_carry, ys = _scan_over_time(_lstm_body, layer, carry[i], xproj)
            new_carry.append(layer_carry)
            h = jnp.swapaxes(ys, 0, 1)
            last = i == len(self.layers) - 1
            if key is not None and not last and c.dropout != "none" and c.keep < 1.0:
                mask_key = jax.random.fold_in(DropoutKeys.get(key, DropoutKeys.OUTPUT), i + 1)
                h = h * jax.random.bernoulli(mask_key, c.keep, h.shape) / c.keep
        return h, tuple(new_carry)


CORES = {"rhn": RHNCore, "hyperrhn": HyperRHNCore, "lstm": LSTMCore}


class CharLM(nn.Module):
    """Embedding(V, E) -> core -> Dense(V).

    `__call__(tokens [B, T] int, carry=None, train=False) -> (logits [B, T, V] f32, carry)`.
    With `train=True` and dropout configured, a 'dropout' RNG is required.
    """

    config: ModelConfig

    def setup(self):
        c = self.config
        embed_init = (
            nn.initializers.orthogonal() if c.init == "orthogonal" else nn.initializers.normal(1.0)
        )
        self.embed = nn.Embed(c.vocab_size, c.embed_dim, embedding_init=embed_init)
        self.core = CORES[c.type](c)
        self.head = Linear(c.hidden, c.vocab_size, init=c.init, dtype=c.dtype)

    def initial_carry(self, batch: int):
        """The zero recurrent state for `batch` sequences."""
        return self.core.initial_carry(batch)

    def __call__(self, tokens: Array, carry=None, train: bool = False):
        c = self.config
        if carry is None:
            carry = self.core.initial_carry(tokens.shape[0])
        key = self.make_rng("dropout") if train and _uses_dropout(c) else None
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


def _uses_dropout(c: ModelConfig) -> bool:
    if c.dropout == "gate" or c.type == "lstm":
        return c.dropout != "none" and c.keep < 1.0
    if c.dropout == "variational":
        return min(c.keep_input, c.keep_hidden, c.keep_output) < 1.0
    return False


def build_model(config: ModelConfig) -> CharLM:
    """The language model for a validated `ModelConfig`."""
    config.validate()
    return CharLM(config)


def init_params(model: CharLM, rng: Array, batch: int = 1, length: int = 1):
    """Initial parameters (a nested dict) from `rng`."""
    tokens = jnp.zeros((batch, length), jnp.int32)
    return model.init({"params": rng}, tokens)["params"]


def count_params(params) -> int:
    """Total number of scalar parameters."""
    return sum(int(x.size) for x in jax.tree_util.tree_leaves(params))
