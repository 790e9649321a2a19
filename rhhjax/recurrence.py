"""The time recurrence as one op: `fused` (pure XLA) and `pallas` (Pallas kernels per step).

`model.impl` is resolved here and only here:

- `scan`: the textbook `nn.scan` over the cell in `rhhjax.models` (plain autodiff; the
  reference). It never reaches this module.
- `fused`: `highway_sequence` below, a `jax.custom_vjp` around the WHOLE time loop. The
  forward saves, per time step and micro-layer, the layer's input state and its unscaled
  matmul output; the reverse loop computes only the pre-activation gradients and the state
  gradient; dW, the biases' and z's gradients are formed after the loop as large matmuls
  and reductions (deferred weight gradients, as fused RNN libraries do).
- `pallas`: the same op whose per-step work (matmul + scale + bias + gates + dropout +
  highway combine; and the elementwise backward) runs in the kernels of
  `kernels/highway.py`. Off GPU it runs them in Pallas interpret mode.

HyperRHN with the paper's `hyper_input="x"`: the hyper recurrence is run first over the
whole sequence, every z for every step and layer is produced by one batched matmul, then
the main recurrence runs with those z (see `hyper_rhn_sequence`).

Dropout masks are regenerated from the same key with `cells.gate_masks`, so every
implementation drops the same units.

Shapes: T time, L depth, B batch, n width.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from rhhjax import cells

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class SequenceSpec:
    """Static description of one recurrence call (hashable: a custom_vjp nondiff arg)."""

    impl: str  # "fused" | "pallas".
    keep: float  # Gate-dropout keep probability (used when gate dropout is on).
    dtype: Any  # Matmul input dtype.
    gate_dropout: bool  # Whether gate masks are generated from the key.
    interpret: bool = False  # Pallas interpret mode (automatic off GPU).


def resolve_spec(impl: str, keep: float, dtype: Any, gate_dropout: bool) -> SequenceSpec:
    """The one place that turns `model.impl` into an executable choice."""
    if impl not in ("fused", "pallas"):
        raise ValueError(f"impl {impl!r} is not a whole-sequence implementation")
    interpret = impl == "pallas" and jax.default_backend() != "gpu"
    return SequenceSpec(impl, float(keep), jnp.dtype(dtype), gate_dropout, interpret)


# ----------------------------------------------------------------------------- per-step math


def _scaled_preactivation(pre, xproj_t, z_l, bias_l, bias_x, layer):
    """a = (pre [+ xproj at layer 0]) * [z, z] + b_l [+ b_x at layer 0]."""
    if layer == 0:
        pre = pre + xproj_t
    if z_l is not None:
        pre = pre * cells.double(z_l)
    a = pre + bias_l
    return a + bias_x if layer == 0 else a


def _gate_backward(ds, s, a, mask):
    """Elementwise backward of `cells.highway_gate`: returns (da [B, 2n], ds_carry [B, n])."""
    n = s.shape[-1]
    h = jnp.tanh(a[..., :n])
    t = jax.nn.sigmoid(a[..., n:])
    t_used = t if mask is None else t * mask
    h_used = h if mask is None else h * mask
    da_h = ds * t_used * (1.0 - h * h)
    da_t = ds * (h_used - s) * t * (1.0 - t)
    return jnp.concatenate([da_h, da_t], axis=-1), ds * (1.0 - t)


def _layer_forward(spec, s, w_l, z_l, bias_l, bias_x, xproj_t, mask, hidden_mask, layer):
    """One micro-layer: returns (s_new [B, n], pre [B, 2n] = (s * hidden_mask) W_l)."""
    if spec.impl == "pallas":
        from kernels import highway

        extra = None
        if layer == 0:
            extra = xproj_t * cells.double(z_l) if z_l is not None else xproj_t
            extra = extra + bias_x
        return highway.highway_forward(
            s, w_l.astype(spec.dtype), z_l, bias_l, extra, mask, interpret=spec.interpret
        )
    s_in = s if hidden_mask is None else s * hidden_mask
    pre = cells.matmul(s_in, w_l, spec.dtype)
    a = _scaled_preactivation(pre, xproj_t, z_l, bias_l, bias_x, layer)
    return cells.highway_gate(a, s, mask), pre


def _layer_backward(spec, ds, s, pre, z_l, bias_l, bias_x, xproj_t, mask, layer):
    """Pre-activation gradient da [B, 2n] and carry gradient ds * (1 - t) [B, n]."""
    if spec.impl == "pallas":
        from kernels import highway

        extra = None
        if layer == 0:
            extra = xproj_t * cells.double(z_l) if z_l is not None else xproj_t
            extra = extra + bias_x
        da, ds_carry, _ = highway.highway_backward(
            ds, s, pre, z_l, bias_l, extra, mask, interpret=spec.interpret
        )
        return da, ds_carry
    a = _scaled_preactivation(pre, xproj_t, z_l, bias_l, bias_x, layer)
    return _gate_backward(ds, s, a, mask)


def _step_masks(spec, key_data, step, depth, batch, width):
    if not spec.gate_dropout:
        return [None] * depth
    key = jax.random.wrap_key_data(key_data)
    masks = cells.gate_masks(key, step, (depth, batch, width), spec.keep)
    return list(masks)


# ----------------------------------------------------------------------------- the op


def _run_forward(spec, kernel_s, bias_s, bias_x, s0, xproj, z, key_data, hidden_masks):
    """Forward over all steps: (states [T, L, B, n], pres [T, L, B, 2n])."""
    depth = kernel_s.shape[0]
    batch, width = s0.shape

    def body(s, inputs):
        step, xproj_t, z_t = inputs
        masks = _step_masks(spec, key_data, step, depth, batch, width)
        states, pres = [], []
        for layer in range(depth):
            s, pre = _layer_forward(
                spec,
                s,
                kernel_s[layer],
                None if z_t is None else z_t[layer],
                bias_s[layer],
                bias_x,
                xproj_t,
                masks[layer],
                None if hidden_masks is None else hidden_masks[layer],
                layer,
            )
            states.append(s)
            pres.append(pre)
        return s, (jnp.stack(states), jnp.stack(pres))

    steps = jnp.arange(xproj.shape[0])
    _, (states, pres) = jax.lax.scan(body, s0, (steps, xproj, z))
    return states, pres


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _sequence(spec, kernel_s, bias_s, bias_x, s0, xproj, z, key_data, hidden_masks):
    return _run_forward(spec, kernel_s, bias_s, bias_x, s0, xproj, z, key_data, hidden_masks)[0]


def _sequence_fwd(spec, kernel_s, bias_s, bias_x, s0, xproj, z, key_data, hidden_masks):
    states, pres = _run_forward(
        spec, kernel_s, bias_s, bias_x, s0, xproj, z, key_data, hidden_masks
    )
    residuals = (kernel_s, bias_s, bias_x, s0, xproj, z, key_data, hidden_masks, states, pres)
    return states, residuals


def _sequence_bwd(spec, residuals, g_states):
    kernel_s, bias_s, bias_x, s0, xproj, z, key_data, hidden_masks, states, pres = residuals
    depth = kernel_s.shape[0]
    batch, width = s0.shape
    # Input state of every (t, l): the previous layer's output, or the previous step's.
    previous_step = jnp.concatenate([s0[None], states[:-1, -1]], axis=0)
    inputs = jnp.concatenate([previous_step[:, None], states[:, :-1]], axis=1)
    w_t = jnp.swapaxes(kernel_s, 1, 2).astype(spec.dtype)

    def body(carry, xs):
        ds, dbias = carry
        step, xproj_t, z_t, inputs_t, pres_t, g_t = xs
        masks = _step_masks(spec, key_data, step, depth, batch, width)
        d_scaled, dz = [None] * depth, [None] * depth
        dbias_t = [None] * depth
        for layer in reversed(range(depth)):
            ds = ds + g_t[layer]
            z_l = None if z_t is None else z_t[layer]
            da, ds_carry = _layer_backward(
                spec,
                ds,
                inputs_t[layer],
                pres_t[layer],
                z_l,
                bias_s[layer],
                bias_x,
                xproj_t,
                masks[layer],
                layer,
            )
            dbias_t[layer] = da.sum(0)
            if z_l is None:
                d_pre = da
            else:
                d_pre = da * cells.double(z_l)
                full_pre = pres_t[layer] + xproj_t if layer == 0 else pres_t[layer]
                product = da * full_pre
                dz[layer] = product[:, :width] + product[:, width:]
            d_scaled[layer] = d_pre
            ds_matmul = cells.matmul(d_pre, w_t[layer], spec.dtype)
            if hidden_masks is not None:
                ds_matmul = ds_matmul * hidden_masks[layer]
            ds = ds_carry + ds_matmul
        outputs = (jnp.stack(d_scaled), None if z_t is None else jnp.stack(dz))
        return (ds, dbias + jnp.stack(dbias_t)), outputs

    steps = jnp.arange(xproj.shape[0])
    init = (jnp.zeros_like(s0), jnp.zeros_like(bias_s))
    xs = (steps, xproj, z, inputs, pres, g_states)
    (ds0, dbias_s), (d_scaled, dz) = jax.lax.scan(body, init, xs, reverse=True)
    # Deferred weight gradient: one [n, T*B] x [T*B, 2n] matmul per layer.
    matmul_inputs = inputs if hidden_masks is None else inputs * hidden_masks[None]
    dkernel = jnp.einsum(
        "tlbi,tlbo->lio",
        matmul_inputs.astype(spec.dtype),
        d_scaled.astype(spec.dtype),
        preferred_element_type=cells.accumulation_dtype(spec.dtype),
    ).astype(kernel_s.dtype)
    dxproj = d_scaled[:, 0]
    dbias_x = dbias_s[0]
    dhidden = None if hidden_masks is None else jnp.zeros_like(hidden_masks)
    dkey = None if key_data is None else _zero_cotangent(key_data)
    return dkernel, dbias_s, dbias_x, ds0, dxproj, dz, dkey, dhidden


def _zero_cotangent(x):
    return jnp.zeros(x.shape, jax.dtypes.float0)


_sequence.defvjp(_sequence_fwd, _sequence_bwd)


def highway_sequence(
    spec: SequenceSpec,
    weights: cells.HighwayWeights,
    s0: Array,
    xproj: Array,
    z: Array | None,
    gate_key: Array | None,
    hidden_masks: Array | None,
) -> Array:
    """The RHN recurrence over a whole sequence as one differentiable op.

    Args:
      spec: static implementation choice (see `resolve_spec`).
      weights: cell parameters (kernel_x is not used: pass `xproj` instead).
      s0: [B, n] initial state.
      xproj: [T, B, 2n] input projections `x U` (no bias).
      z: [T, L, B, n] hyper scales, or None.
      gate_key: dropout key for gate masks (required when spec.gate_dropout).
      hidden_masks: [L, B, n] variational masks on the matmul input, or None.
    Returns:
      states [T, L, B, n]: the state after every micro-layer of every step.
    """
    key_data = None if gate_key is None else jax.random.key_data(gate_key)
    if spec.gate_dropout and key_data is None:
        raise ValueError("gate dropout needs a key")
    return _sequence(
        spec,
        weights.kernel_s,
        weights.bias_s,
        weights.bias_x,
        s0,
        xproj,
        z,
        key_data,
        hidden_masks,
    )


def rhn_sequence(impl, weights, s0, xproj, z, gate_key, keep, hidden_masks, dtype):
    """Plain RHN: returns (final state [B, n], outputs [T, B, n])."""
    spec = resolve_spec(impl, keep, dtype, gate_key is not None)
    states = highway_sequence(spec, weights, s0, xproj, z, gate_key, hidden_masks)
    return states[-1, -1], states[:, -1]


def hyper_rhn_sequence(impl, cell, carry, xprojs, keys, keep, hidden_masks, dtype):
    """HyperRHN (hyper_input="x"): hyper recurrence, all z at once, then the main one.

    Args:
      cell: the bound `models.HyperRHNCell` (its parameters are read, not re-declared).
      carry: (s_hyper [B, h], s_main [B, n]).
      xprojs: (hyper xproj [T, B, 2h], main xproj [T, B, 2n]).
      keys: (hyper gate key, main gate key) or None.
    Returns:
      ((s_hyper, s_main), outputs [T, B, n]).
    """
    if cell.hyper_input != "x":
        raise ValueError("fused/pallas HyperRHN needs hyper_input='x' (the paper's)")
    s_hyper, s_main = carry
    hyper_xproj, main_xproj = xprojs
    hyper_key, main_key = (None, None) if keys is None else keys
    spec = resolve_spec(impl, keep, dtype, keys is not None)
    hyper_states = highway_sequence(
        spec, cell.hyper.weights(), s_hyper, hyper_xproj, None, hyper_key,
        hidden_masks.get("hyper_hidden"),
    )
    z = cell.scales(hyper_states)  # [T, L, B, n] in one batched matmul.
    main_states = highway_sequence(
        spec, cell.main.weights(), s_main, main_xproj, z, main_key,
        hidden_masks.get("main_hidden"),
    )
    return (hyper_states[-1, -1], main_states[-1, -1]), main_states[:, -1]
