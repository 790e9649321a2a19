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

import contextlib
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


_PALLAS_TARGET = {"platform": None}


@contextlib.contextmanager
def pallas_target(platform: str):
    """Trace `pallas` kernels for `platform` ("gpu": compiled Triton; "cpu": interpret mode)
    instead of the default backend, e.g. to lower a GPU train step on a CPU-only machine."""
    previous = _PALLAS_TARGET["platform"]
    _PALLAS_TARGET["platform"] = platform
    try:
        yield
    finally:
        _PALLAS_TARGET["platform"] = previous


def resolve_spec(impl: str, keep: float, dtype: Any, gate_dropout: bool) -> SequenceSpec:
    """The one place that turns `model.impl` into an executable choice."""
    if impl not in ("fused", "pallas"):
        raise ValueError(f"impl {impl!r} is not a whole-sequence implementation")
    platform = _PALLAS_TARGET["platform"] or jax.default_backend()
    interpret = impl == "pallas" and platform != "gpu"
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


def _gate_backward(ds, s, h, t, mask):
    """Elementwise backward of `cells.highway_gate` from the saved gates h, t [B, n].

    Returns (da [B, 2n], ds_carry [B, n]).
    """
    t_used = t if mask is None else t * mask
    h_used = h if mask is None else h * mask
    da_h = ds * t_used * (1.0 - h * h)
    da_t = ds * (h_used - s) * t * (1.0 - t)
    return jnp.concatenate([da_h, da_t], axis=-1), ds * (1.0 - t)


def _layer_extra(z_l, bias_x, xproj_t, layer):
    """The Pallas kernel's addend: (x U) * [z_0, z_0] + b_U at layer 0, else None."""
    if layer != 0:
        return None
    extra = xproj_t * cells.double(z_l) if z_l is not None else xproj_t
    return extra + bias_x


def _layer_forward(spec, s, w_l, z_l, bias_l, bias_x, xproj_t, mask, hidden_mask, layer):
    """One micro-layer: returns (s_new [B, n], saved) with what the backward needs.

    saved["pre"] = (s * hidden_mask) W_l [B, 2n] (pallas always; fused only with z, for
    dz); fused also saves the gates saved["h"], saved["t"] [B, n] so that its backward
    recomputes no transcendental function.
    """
    if spec.impl == "pallas":
        from kernels import highway

        extra = _layer_extra(z_l, bias_x, xproj_t, layer)
        s_new, pre = highway.highway_forward(
            s, w_l.astype(spec.dtype), z_l, bias_l, extra, mask, interpret=spec.interpret
        )
        return s_new, {"pre": pre}
    s_in = s if hidden_mask is None else s * hidden_mask
    pre = cells.matmul(s_in, w_l, spec.dtype)
    a = _scaled_preactivation(pre, xproj_t, z_l, bias_l, bias_x, layer)
    n = s.shape[-1]
    h = jnp.tanh(a[..., :n])
    t = jax.nn.sigmoid(a[..., n:])
    t_used = t if mask is None else t * mask
    saved = {"h": h, "t": t}
    if z_l is not None:
        saved["pre"] = pre
    return h * t_used + s * (1.0 - t), saved


def _layer_backward(spec, ds, s, saved, z_l, bias_l, bias_x, xproj_t, mask, layer):
    """Pre-activation gradient da [B, 2n] and carry gradient ds * (1 - t) [B, n]."""
    if spec.impl == "pallas":
        from kernels import highway

        extra = _layer_extra(z_l, bias_x, xproj_t, layer)
        da, ds_carry, _ = highway.highway_backward(
            ds, s, saved["pre"], z_l, bias_l, extra, mask, interpret=spec.interpret
        )
        return da, ds_carry
    return _gate_backward(ds, s, saved["h"], saved["t"], mask)


def _sequence_masks(spec, key_data, length, depth, batch, width):
    """Gate-dropout keep decisions for every step, bool [T, L, B, n] (or None).

    Generated for all steps at once (vectorised over t) from the same per-step keys as
    the `scan` model, and saved for the backward instead of being regenerated.
    """
    if not spec.gate_dropout:
        return None
    key = jax.random.wrap_key_data(key_data)
    shape = (depth, batch, width)
    return jax.vmap(lambda t: cells.gate_masks(key, t, shape, spec.keep) > 0)(jnp.arange(length))


def _layer_masks(spec, keep_t, depth):
    """bool [L, B, n] keep decisions of one step -> list of float masks (0 or 1/keep)."""
    if keep_t is None:
        return [None] * depth
    return [keep_t[layer].astype(jnp.float32) / spec.keep for layer in range(depth)]


# ----------------------------------------------------------------------------- the op


def _run_forward(spec, kernel_s, bias_s, bias_x, s0, xproj, z, key_data, hidden_masks, save=True):
    """Forward over all steps: (states [T, L, B, n], saved {name: [T, L, B, *]}, keep).

    keep: bool [T, L, B, n] gate-dropout decisions, or None.
    """
    depth = kernel_s.shape[0]
    batch, width = s0.shape
    keep = _sequence_masks(spec, key_data, xproj.shape[0], depth, batch, width)

    def body(s, inputs):
        xproj_t, z_t, keep_t = inputs
        masks = _layer_masks(spec, keep_t, depth)
        states, saved = [], []
        for layer in range(depth):
            s, saved_l = _layer_forward(
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
            saved.append(saved_l if save else {})
        return s, (jnp.stack(states), jax.tree_util.tree_map(lambda *a: jnp.stack(a), *saved))

    _, (states, saved) = jax.lax.scan(body, s0, (xproj, z, keep))
    return states, saved, keep


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _sequence(spec, kernel_s, bias_s, bias_x, s0, xproj, z, key_data, hidden_masks):
    # Without differentiation nothing is saved for a backward pass.
    args = (spec, kernel_s, bias_s, bias_x, s0, xproj, z, key_data, hidden_masks)
    return _run_forward(*args, save=False)[0]


def _sequence_fwd(spec, kernel_s, bias_s, bias_x, s0, xproj, z, key_data, hidden_masks):
    states, saved, keep = _run_forward(
        spec, kernel_s, bias_s, bias_x, s0, xproj, z, key_data, hidden_masks
    )
    key_zero = None if key_data is None else _zero_cotangent(key_data)
    residuals = (kernel_s, bias_s, bias_x, s0, xproj, z, key_zero, hidden_masks, states, saved)
    return states, (residuals, keep)


def _sequence_bwd(spec, saved, g_states):
    residuals, keep = saved
    kernel_s, bias_s, bias_x, s0, xproj, z, key_zero, hidden_masks, states, saved = residuals
    depth = kernel_s.shape[0]
    width = s0.shape[1]
    # Input state of every (t, l): the previous layer's output, or the previous step's.
    previous_step = jnp.concatenate([s0[None], states[:-1, -1]], axis=0)
    inputs = jnp.concatenate([previous_step[:, None], states[:, :-1]], axis=1)
    w_t = jnp.swapaxes(kernel_s, 1, 2).astype(spec.dtype)

    def body(carry, xs):
        ds, dbias = carry
        xproj_t, z_t, keep_t, inputs_t, saved_t, g_t = xs
        masks = _layer_masks(spec, keep_t, depth)
        d_scaled, dz = [None] * depth, [None] * depth
        dbias_t = [None] * depth
        for layer in reversed(range(depth)):
            ds = ds + g_t[layer]
            z_l = None if z_t is None else z_t[layer]
            da, ds_carry = _layer_backward(
                spec,
                ds,
                inputs_t[layer],
                jax.tree_util.tree_map(lambda a, i=layer: a[i], saved_t),
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
                pre = saved_t["pre"][layer]
                full_pre = pre + xproj_t if layer == 0 else pre
                product = da * full_pre
                dz[layer] = product[:, :width] + product[:, width:]
            d_scaled[layer] = d_pre
            ds_matmul = cells.matmul(d_pre, w_t[layer], spec.dtype)
            if hidden_masks is not None:
                ds_matmul = ds_matmul * hidden_masks[layer]
            ds = ds_carry + ds_matmul
        outputs = (jnp.stack(d_scaled), None if z_t is None else jnp.stack(dz))
        return (ds, dbias + jnp.stack(dbias_t)), outputs

    init = (jnp.zeros_like(s0), jnp.zeros_like(bias_s))
    xs = (xproj, z, keep, inputs, saved, g_states)
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
    return dkernel, dbias_s, dbias_x, ds0, dxproj, dz, key_zero, dhidden


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
        spec,
        cell.hyper.weights(),
        s_hyper,
        hyper_xproj,
        None,
        hyper_key,
        hidden_masks.get("hyper_hidden"),
    )
    if cell.hyper_rank > 0:  # Suarez section 4: main_xproj holds the raw input x here.
        from rhhjax import lowrank

        main_states = lowrank.lowrank_sequence(
            spec, cell.main.weights(), cell.lowrank_scales, s_main, main_xproj, hyper_states,
            main_key, hidden_masks.get("main_hidden"),
        )  # fmt: skip
        return (hyper_states[-1, -1], main_states[-1, -1]), main_states[:, -1]
    z = cell.scales(hyper_states)  # [T, L, B, n] in one batched matmul.
    main_states = highway_sequence(
        spec,
        cell.main.weights(),
        s_main,
        main_xproj,
        z,
        main_key,
        hidden_masks.get("main_hidden"),
    )
    return (hyper_states[-1, -1], main_states[-1, -1]), main_states[:, -1]
