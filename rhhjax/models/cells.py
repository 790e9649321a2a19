"""Flax cells `RHNCell`, `HyperRHNCell`, `LSTMCell` and the output `Linear`: the parameters
(their names are the checkpoint format); the step math is in `rhhjax.ops.cells`. `RHNCell.step`
sows its gates into ``GATES_COLLECTION`` (only under `scan`)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from rhhjax.models.config import DTYPES
from rhhjax.models.initializers import matrix_init, rhn_bias_init, stacked, uniform_init
from rhhjax.ops import cells, lowrank

Array = jax.Array

GATES_COLLECTION = "intermediates"
GATES_NAME = "transform_gates"


class RHNCell(nn.RNNCellBase):
    """RHN cell, coupled gates, depth L: kernel_x [E, 2n], bias_x, kernel_s [L, n, 2n], bias_s."""

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
        return cells.HighwayWeights(self.kernel_x, self.bias_x, self.kernel_s, self.bias_s)

    def input_projection(self, x: Array) -> Array:
        """[..., E] -> [..., 2n]: `x U` without bias, float32."""
        return cells.matmul(x, self.kernel_x, DTYPES[self.dtype])

    def step(self, s, xproj, z=None, gate_masks=None, hidden_masks=None, bias0_scale=None):
        """One time step; see `cells.highway_step` for shapes. Records the gates [L, B, n]."""
        s, layer_states, gates = cells.highway_step(
            self.weights(), s, xproj, z, gate_masks, hidden_masks, DTYPES[self.dtype], bias0_scale
        )
        self.record_gates(gates)
        return s, layer_states

    def record_gates(self, gates: Array) -> None:
        self.sow(GATES_COLLECTION, GATES_NAME, gates)

    def __call__(self, carry: Array, x: Array) -> tuple[Array, Array]:
        masks = None
        if not self.deterministic and self.keep < 1.0:
            shape = (self.depth, *carry.shape)
            masks = cells.gate_masks(self.make_rng("dropout"), 0, shape, self.keep)
        s, _ = self.step(carry, self.input_projection(x), None, masks)
        return s, s

    @nn.nowrap
    def initialize_carry(self, rng, input_shape) -> Array:
        del rng
        carry_dtype = cells.accumulation_dtype(DTYPES[self.dtype])
        return jnp.zeros((*input_shape[:-1], self.features), carry_dtype)

    @property
    def num_feature_axes(self) -> int:
        return 1


class HyperRHNCell(nn.Module):
    """Recurrent Highway Hypernetwork cell (Suarez 2017): a small RHN (width h) reads the
    input; z_l = s_hyper,l P_l + p_l scales the columns of the main cell's layer-l matmuls."""

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
        """x [..., E] -> (hyper xproj [..., 2h], main xproj [..., 2n]), no biases."""
        e = self.input_features
        hyper_xproj = cells.matmul(x, self.hyper.kernel_x[:e], DTYPES[self.dtype])
        if self.hyper_rank > 0:  # x U~ depends on the step's u^x: the main cell gets x.
            return hyper_xproj, x
        # two GEMMs: merged, XLA would copy the main part out
        return hyper_xproj, self.main.input_projection(jax.lax.optimization_barrier(x))

    def scales(self, hyper_layer_states: Array) -> Array:
        """[..., L, B, h] hyper layer states -> [..., L, B, n] scales z."""
        return cells.hyper_scales(
            self.proj_kernel, self.proj_bias, hyper_layer_states, DTYPES[self.dtype]
        )

    def step(self, carry, xprojs, masks, bias0_scales=(None, None)):
        """One step: carry (s_hyper [B, h], s_main [B, n]), xprojs ([B, 2h], [B, 2n]),
        masks [L, B, *] -> (carry, s_main)."""
        s_hyper, s_main = carry
        hyper_xproj, main_xproj = xprojs
        if self.hyper_input == "x_and_state":
            state_part = self.hyper.kernel_x[self.input_features :]
            hyper_xproj = hyper_xproj + cells.matmul(s_main, state_part, DTYPES[self.dtype])
        s_hyper, hyper_layers = self.hyper.step(
            s_hyper, hyper_xproj, None, masks.get("hyper_gate"), masks.get("hyper_hidden"),
            bias0_scales[0],
        )  # fmt: skip
        if self.hyper_rank > 0:
            s_main, _, gates = lowrank.highway_step(
                self.main.weights(), self.lowrank_scales, s_main, main_xproj, hyper_layers,
                masks.get("main_gate"), masks.get("main_hidden"), DTYPES[self.dtype],
                op=self.lowrank_op, remat=self.lowrank_remat, bias0_scale=bias0_scales[1],
            )  # fmt: skip
            self.main.record_gates(gates)
            return (s_hyper, s_main), s_main
        z = self.scales(hyper_layers)
        s_main, _ = self.main.step(
            s_main, main_xproj, z, masks.get("main_gate"), masks.get("main_hidden"),
            bias0_scales[1],
        )  # fmt: skip
        return (s_hyper, s_main), s_main

    def __call__(self, carry, x):
        """Deterministic single step, for use outside a language model: x [B, E]."""
        return self.step(carry, self.input_projections(x), {})


class LSTMCell(nn.Module):
    """LSTM layer (gates i, f, g, o): kernel_x [E, 4H], kernel_h [H, 4H], bias [4H]."""

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
        return cells.matmul(x, self.kernel, DTYPES[self.dtype]) + self.bias
