"""Recurrent cores: a cell over a sequence, x [B, T, E] -> (outputs [B, T, n], carry). Each
dispatches once on the model's `SequenceSpec`: `nn.scan` over the cell (the reference, the only
one recording gates) or one whole-sequence op (`rhhjax.ops.recurrence`, `rhhjax.ops.lowrank`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from rhhjax.models.cells import GATES_COLLECTION, HyperRHNCell, LSTMCell, RHNCell
from rhhjax.models.config import ModelConfig
from rhhjax.ops import cells, lowrank, recurrence
from rhhjax.ops.spec import SequenceSpec

Array = jax.Array


def _scan_over_time(body: Callable, module: nn.Module, carry, xs, *broadcast):
    """`nn.scan` of ``body`` over the leading (time) axis."""
    scanned = nn.scan(
        body,
        variable_broadcast="params",
        variable_axes={GATES_COLLECTION: 0},
        split_rngs={"params": False},
        in_axes=(0,) + (nn.broadcast,) * len(broadcast),
        out_axes=0,
    )
    return scanned(module, carry, xs, *broadcast)


def _rhn_body(cell: RHNCell, s, xs, gate_key, hidden_masks):
    step, xproj, bias0 = xs
    gate = None
    if gate_key is not None:
        gate = cells.gate_masks(gate_key, step, (cell.depth, *s.shape), cell.keep)
    s, _ = cell.step(s, xproj, None, gate, hidden_masks, bias0)
    return s, s


def _hyper_body(cell: HyperRHNCell, carry, xs, keep, keys, hidden_masks):
    step, xprojs, bias0s = xs
    masks = dict(hidden_masks)
    if keys is not None:
        s_hyper, s_main = carry
        masks["hyper_gate"] = cells.gate_masks(keys[0], step, (cell.depth, *s_hyper.shape), keep)
        masks["main_gate"] = cells.gate_masks(keys[1], step, (cell.depth, *s_main.shape), keep)
    return cell.step(carry, xprojs, masks, bias0s)


def _bias0_per_step(c: ModelConfig, s0: Array, length: int) -> Array | None:
    """[T, B, 1] factors on layer 0's recurrent bias (`original_first_step`), or None."""
    if not c.original_first_step:
        return None
    ones = jnp.ones((length, s0.shape[0], 1), jnp.float32)
    return ones.at[0].set(cells.first_step_bias0_scale(s0))


def _first_step_apart(
    c: ModelConfig, s0: Array, xs, run_step, run_sequence, last_layer_only: bool = False
) -> Array:
    """States [T, L, B, n] of a whole-sequence op, step 0 apart in pure JAX if asked."""
    if not c.original_first_step:
        return run_sequence(0, s0, xs)
    first = jax.tree_util.tree_map(lambda x: x[0], xs)
    s1, layers0, _ = run_step(s0, first, cells.first_step_bias0_scale(s0))
    step0 = layers0[-1] if last_layer_only else layers0
    length = jax.tree_util.tree_leaves(xs)[0].shape[0]
    if length == 1:
        return step0[None]
    rest = run_sequence(1, s1, jax.tree_util.tree_map(lambda x: x[1:], xs))
    return jnp.concatenate([step0[None], rest])


def _step_masks(key: Array | None, keep: float, depth: int, s0: Array) -> Array | None:
    return None if key is None else cells.gate_masks(key, 0, (depth, *s0.shape), keep)


def _highway_states(c, spec, weights, s0, xproj, z, gate_key, hidden_masks) -> Array:
    masks0 = _step_masks(gate_key, spec.keep, weights.kernel_s.shape[0], s0)

    def run_step(s, xs, bias0):
        x_t, z_t = xs
        return cells.highway_step(weights, s, x_t, z_t, masks0, hidden_masks, spec.dtype, bias0)

    def run_sequence(first_step, s, xs):
        spec_t = dataclasses.replace(spec, first_step=first_step)
        return recurrence.highway_sequence(spec_t, weights, s, *xs, gate_key, hidden_masks)

    last = spec.last_layer_only
    return _first_step_apart(c, s0, (xproj, z), run_step, run_sequence, last)


def _lstm_body(cell: LSTMCell, carry, xproj):
    return cell.step(carry, xproj)


class DropoutKeys:
    """Named sub-keys of one dropout key, identical for every implementation."""

    HYPER_GATE, MAIN_GATE, INPUT, HYPER_HIDDEN, MAIN_HIDDEN, OUTPUT = range(6)

    @staticmethod
    def get(key: Array, which: int) -> Array:
        return jax.random.fold_in(key, which)


def _gate_key(c: ModelConfig, key: Array | None, which: int) -> Array | None:
    if key is None or c.dropout != "gate" or c.keep >= 1.0:
        return None
    return DropoutKeys.get(key, which)


def _hidden_masks(c: ModelConfig, key: Array | None, which: int, batch: int, width: int):
    """Variational masks [L, B, width] on the state fed to W_l, or None when off."""
    if key is None or c.dropout != "variational" or c.keep_hidden >= 1.0:
        return None
    mkey = DropoutKeys.get(key, which)
    return cells.sequence_masks(mkey, (c.depth, batch, width), c.keep_hidden)


def _highway_cell_fields(c: ModelConfig) -> dict:
    return dict(
        features=c.hidden, input_features=c.embed_dim, depth=c.depth, init=c.init,
        t_bias_init=c.t_bias_init, dtype=c.dtype,
    )  # fmt: skip


class RHNCore(nn.Module):
    """Plain RHN over a sequence. x [B, T, E] -> (outputs [B, T, n], carry [B, n])."""

    config: ModelConfig
    spec: SequenceSpec

    def setup(self):
        self.cell = RHNCell(**_highway_cell_fields(self.config), keep=self.config.keep)

    def initial_carry(self, batch: int) -> Array:
        return jnp.zeros((batch, self.config.hidden), self.config.carry_dtype)

    def __call__(self, x: Array, carry: Array, key: Array | None):
        c = self.config
        gate_key = _gate_key(c, key, DropoutKeys.MAIN_GATE)
        hidden_masks = _hidden_masks(c, key, DropoutKeys.MAIN_HIDDEN, x.shape[0], c.hidden)
        xproj = self.cell.input_projection(jnp.swapaxes(x, 0, 1))
        steps = jnp.arange(x.shape[1])
        if self.spec.is_scan:
            bias0 = _bias0_per_step(c, carry, x.shape[1])
            carry, ys = _scan_over_time(
                _rhn_body, self.cell, carry, (steps, xproj, bias0), gate_key, hidden_masks
            )
        else:
            spec = dataclasses.replace(
                self.spec, gate_dropout=gate_key is not None, last_layer_only=True
            )
            ys = _highway_states(
                c, spec, self.cell.weights(), carry, xproj, None, gate_key, hidden_masks
            )
            carry = ys[-1]
        return jnp.swapaxes(ys, 0, 1), carry


class HyperRHNCore(nn.Module):
    """HyperRHN over a sequence. x [B, T, E] -> (outputs [B, T, n], (s_hyper, s_main))."""

    config: ModelConfig
    spec: SequenceSpec

    def setup(self):
        c = self.config
        self.cell = HyperRHNCell(
            **_highway_cell_fields(c),
            hyper_features=c.hyper_hidden,
            hyper_input=c.hyper_input,
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
        xprojs = self.cell.input_projections(jnp.swapaxes(x, 0, 1))  # time-major [T, B, 2h / 2n]
        steps = jnp.arange(x.shape[1])
        if self.spec.is_scan:
            bias0s = tuple(_bias0_per_step(c, s, x.shape[1]) for s in carry)
            carry, ys = _scan_over_time(
                _hyper_body, self.cell, carry, (steps, xprojs, bias0s), c.keep, keys, hidden_masks
            )
        else:
            carry, ys = self._whole_sequence(carry, xprojs, keys, hidden_masks)
        return jnp.swapaxes(ys, 0, 1), carry

    def _whole_sequence(self, carry, xprojs, keys, hidden_masks):
        """Hyper recurrence over the sequence, then the main one -> (carry, [T, B, n])."""
        c, cell = self.config, self.cell
        s_hyper, s_main = carry
        hyper_xproj, main_xproj = xprojs
        hyper_key, main_key = (None, None) if keys is None else keys
        spec = dataclasses.replace(self.spec, gate_dropout=keys is not None)
        batch = s_main.shape[0]
        paired = c.hyper_rank == 0 and not hidden_masks
        if paired and recurrence.pairs(spec, batch, c.hidden, c.hyper_hidden):
            hyper_last, main_states = self._paired(spec, carry, xprojs, keys)
            return (hyper_last, main_states[-1]), main_states
        hyper_states = _highway_states(
            c, spec, cell.hyper.weights(), s_hyper, hyper_xproj, None, hyper_key,
            hidden_masks.get("hyper_hidden"),
        )  # fmt: skip
        main_hidden = hidden_masks.get("main_hidden")
        if c.hyper_rank > 0:  # Suarez section 4: main_xproj holds the raw input x here.
            main_states = self._lowrank_states(
                spec, s_main, main_xproj, hyper_states, main_key, main_hidden
            )[:, -1]
        else:
            main_states = _highway_states(
                c, dataclasses.replace(spec, last_layer_only=True), cell.main.weights(),
                s_main, main_xproj, cell.scales(hyper_states), main_key, main_hidden,
            )  # fmt: skip
        return (hyper_states[-1, -1], main_states[-1]), main_states

    def _paired(self, spec, carry, xprojs, keys) -> tuple[Array, Array]:
        """(last hyper state [B, h], main states [T, B, n]) of the op running both cells in one
        launch each way (`recurrence.hyper_highway_sequence`); step 0 apart if asked."""
        c, cell = self.config, self.cell
        weights = (cell.hyper.weights(), cell.main.weights())
        proj = (cell.proj_kernel, cell.proj_bias)
        keys = (None, None) if keys is None else keys

        def run(first_step, s0s, xs):
            spec_t = dataclasses.replace(spec, first_step=first_step)
            return recurrence.hyper_highway_sequence(spec_t, weights, proj, s0s, xs, keys)

        if not c.original_first_step:
            return run(0, carry, xprojs)

        def step0(w, s0, xproj, key, z):
            masks0 = _step_masks(key, spec.keep, c.depth, s0)
            bias0 = cells.first_step_bias0_scale(s0)
            return cells.highway_step(w, s0, xproj[0], z, masks0, None, spec.dtype, bias0)

        s_h1, hyper0, _ = step0(weights[0], carry[0], xprojs[0], keys[0], None)
        s_m1, main0, _ = step0(weights[1], carry[1], xprojs[1], keys[1], cell.scales(hyper0))
        if xprojs[0].shape[0] == 1:
            return hyper0[-1], main0[-1][None]
        hyper_last, main_rest = run(1, (s_h1, s_m1), tuple(x[1:] for x in xprojs))
        return hyper_last, jnp.concatenate([main0[-1][None], main_rest])

    def _lowrank_states(self, spec, s0, x, hyper_states, gate_key, hidden_masks) -> Array:
        c, weights, scales = self.config, self.cell.main.weights(), self.cell.lowrank_scales
        masks0 = _step_masks(gate_key, spec.keep, c.depth, s0)

        def run_step(s, xs, bias0):
            x_t, hyper_t = xs
            return lowrank.highway_step(
                weights, scales, s, x_t, hyper_t, masks0, hidden_masks, spec.dtype,
                op=c.lowrank_op, remat=c.lowrank_remat, bias0_scale=bias0,
            )  # fmt: skip

        def run_sequence(first_step, s, xs):
            spec_t = dataclasses.replace(spec, first_step=first_step)
            return lowrank.lowrank_sequence(spec_t, weights, scales, s, *xs, gate_key, hidden_masks)

        return _first_step_apart(c, s0, (x, hyper_states), run_step, run_sequence)


class LSTMCore(nn.Module):
    """Stacked LSTM (the paper's 2 x 1125 baseline). x [B, T, E] -> (outputs, carry)."""

    config: ModelConfig
    spec: SequenceSpec

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
