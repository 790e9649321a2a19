"""The RHN time recurrence over a whole sequence as one differentiable op.

`highway_sequence` is a `jax.custom_vjp` around the whole time loop; the loops come from the
implementation `spec.impl` names (`rhhjax.ops.spec.IMPLEMENTATIONS`). This module pads once
per call (B -> Bp rows, n -> Np units), draws every step's gate-dropout decisions and unpads
the gradients. Padded units and rows stay zero and add nothing to any gradient. Inside:
s [Bp, Np], xproj [T, Bp, 2, Np], bias [L, 2, Np], z and keep [T, L, Bp, Np].
`hyper_highway_sequence` runs a HyperRHN's two cells in one launch each way (`persistent`,
paired).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from rhhjax.ops import cells
from rhhjax.ops.spec import IMPLEMENTATIONS, SequenceSpec

Array = jax.Array


def _padded_operands(spec, impl, geo, weights, s0, xproj, z, key_data, hidden_masks):
    """(bias, s0, xproj, z, keep, hidden), padded once."""
    depth = weights.kernel_s.shape[0]
    bias = geo.pad_bias(weights.bias_s).at[0].add(geo.pad_bias(weights.bias_x))
    keep = None
    if spec.gate_dropout:
        key = jax.random.wrap_key_data(key_data)
        decisions = cells.gate_keeps(
            key, xproj.shape[0], (depth, geo.batch, geo.n), spec.keep, spec.first_step
        )
        keep = geo.pad_rows(decisions.astype(impl.KEEP_DTYPE))
    return (
        bias,
        geo.pad_rows(s0),
        geo.pad_halves(xproj),
        impl.scales_operand(spec, geo, z),
        keep,
        geo.pad_rows(hidden_masks),
    )


def _run_forward(spec, weights, s0, xproj, z, key_data, hidden_masks, save: bool):
    impl = IMPLEMENTATIONS[spec.impl]
    geo = impl.geometry(spec, *s0.shape)
    operands = _padded_operands(spec, impl, geo, weights, s0, xproj, z, key_data, hidden_masks)
    w = impl.prepare_weights(spec, geo, weights.kernel_s)
    states, saved = impl.forward_loop(spec, geo, w, *operands, save=save)
    return geo, operands, states, saved


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _sequence(spec, weights, s0, xproj, z, key_data, hidden_masks):
    geo, _, states, _ = _run_forward(spec, weights, s0, xproj, z, key_data, hidden_masks, False)
    return geo.unpad_rows(_returned(spec, states))


def _sequence_fwd(spec, weights, s0, xproj, z, key_data, hidden_masks):
    geo, operands, states, saved = _run_forward(
        spec, weights, s0, xproj, z, key_data, hidden_masks, save=True
    )
    key_zero = None if key_data is None else jnp.zeros(key_data.shape, jax.dtypes.float0)
    return geo.unpad_rows(_returned(spec, states)), (operands, saved, key_zero, weights)


def _returned(spec: SequenceSpec, states: Array) -> Array:
    return states[:, -1] if spec.last_layer_only else states


def _cotangent(spec: SequenceSpec, impl, g: Array, depth: int) -> Array:
    """The padded cotangent as ``impl``'s backward reads it."""
    if not spec.last_layer_only or impl.LAST_LAYER_COTANGENT:
        return g
    return jnp.zeros((g.shape[0], depth, *g.shape[1:]), g.dtype).at[:, -1].set(g)


def _sequence_bwd(spec, residuals, g_states):
    return _cell_backward(spec, residuals, g_states)


def _cell_backward(spec, residuals, g_states):
    impl = IMPLEMENTATIONS[spec.impl]
    args = _backward_args(spec, residuals, g_states)
    return _cell_cotangents(residuals, args[1], g_states, impl.backward_loop(*args))


def _backward_args(spec, residuals, g_states) -> tuple:
    operands, saved, _, weights = residuals
    bias, s0, xproj, z, keep, hidden = operands
    impl = IMPLEMENTATIONS[spec.impl]
    geo = impl.geometry(spec, *g_states.shape[-2:])
    w_t = impl.prepare_weights(spec, geo, weights.kernel_s, transposed=True)
    g = _cotangent(spec, impl, geo.pad_rows(g_states), bias.shape[0])
    return (spec, geo, w_t, bias, s0, xproj, z, keep, hidden, saved, g)


def _cell_cotangents(residuals, geo, g_states, loop_out):
    operands, _, key_zero, weights = residuals
    hidden = operands[5]
    batch, width = g_states.shape[-2:]
    ds0, d_scaled, dz, dbias, dw = loop_out
    dbias = geo.unpad_bias(dbias)
    d_weights = cells.HighwayWeights(
        kernel_x=jnp.zeros_like(weights.kernel_x),
        bias_x=dbias[0],
        kernel_s=geo.unpad_weight(dw),
        bias_s=dbias,
    )
    d_weights = jax.tree_util.tree_map(lambda g, p: g.astype(p.dtype), d_weights, weights)
    dxproj = geo.unpad_halves(d_scaled[:, 0])
    dz = None if dz is None else geo.unpad_rows(dz)
    dhidden = None if hidden is None else jnp.zeros((hidden.shape[0], batch, width), hidden.dtype)
    return d_weights, geo.unpad_rows(ds0), dxproj, dz, key_zero, dhidden


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
    """The RHN recurrence over a sequence as one differentiable op: s0 [B, n], xproj
    [T, B, 2n] (x U, no bias), z [T, L, B, n] or None -> states [T, L, B, n] ([T, B, n]
    with ``spec.last_layer_only``)."""
    key_data = None if gate_key is None else jax.random.key_data(gate_key)
    if spec.gate_dropout and key_data is None:
        raise ValueError("gate dropout needs a key")
    return _sequence(spec, weights, s0, xproj, z, key_data, hidden_masks)


def pairs(spec: SequenceSpec, batch: int, width: int, hyper_width: int) -> bool:
    """Whether `hyper_highway_sequence` runs this HyperRHN (its impl pairs the cells)."""
    plans = getattr(IMPLEMENTATIONS[spec.impl], "pair_plans", None)
    return plans is not None and plans(spec, batch, width, hyper_width) is not None


def _pair_specs(spec: SequenceSpec) -> tuple[SequenceSpec, SequenceSpec]:
    hyper = dataclasses.replace(spec, last_layer_only=False)
    return hyper, dataclasses.replace(spec, last_layer_only=True)


def _pair_forward(spec, weights, proj, s0s, xprojs, keys, save: bool):
    """Pads both cells and runs their forwards in one launch: [(geo, operands, states,
    saved)] of the hyper cell and the main cell, the main's z the launch's."""
    impl = IMPLEMENTATIONS[spec.impl]
    geos, operands = [], []
    for cell_spec, w, s0, xproj, key_data in zip(
        _pair_specs(spec), weights, s0s, xprojs, keys, strict=True
    ):
        geo = impl.geometry(cell_spec, *s0.shape)
        geos.append(geo)
        operands.append(_padded_operands(cell_spec, impl, geo, w, s0, xproj, None, key_data, None))
    kernels = tuple(w.kernel_s for w in weights)
    hyper, main, z = impl.pair_forward_loop(spec, geos, kernels, operands, *proj, save=save)
    operands[1] = (*operands[1][:3], z, *operands[1][4:])
    return [(geo, ops, *out) for geo, ops, out in zip(geos, operands, (hyper, main), strict=True)]


def _pair_returned(spec, runs) -> tuple[Array, Array]:
    """(last hyper state [B, h], main states [T, B, n]), unpadded."""
    (geo_h, _, states_h, _), (geo_m, _, states_m, _) = runs
    main_states = _returned(_pair_specs(spec)[1], states_m)
    return geo_h.unpad_rows(states_h[-1, -1]), geo_m.unpad_rows(main_states)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _pair_sequence(spec, weights, proj, s0s, xprojs, keys):
    return _pair_returned(spec, _pair_forward(spec, weights, proj, s0s, xprojs, keys, save=False))


def _pair_sequence_fwd(spec, weights, proj, s0s, xprojs, keys):
    runs = _pair_forward(spec, weights, proj, s0s, xprojs, keys, save=True)
    residuals = []
    for (_, operands, _, saved), w, key_data in zip(runs, weights, keys, strict=True):
        key_zero = None if key_data is None else jnp.zeros(key_data.shape, jax.dtypes.float0)
        residuals.append((operands, saved, key_zero, w))
    geo_h, _, states_h, _ = runs[0]
    return _pair_returned(spec, runs), (tuple(residuals), proj, geo_h.unpad_rows(states_h))


def _pair_sequence_bwd(spec, residuals, g):
    """Both cells' backward in one launch (the hyper cell's cotangent gains dz @ P_l inside
    it), then z's weight gradients (XLA)."""
    (res_h, res_m), (proj_kernel, proj_bias), hyper_states = residuals
    g_last, g_main = g
    spec_h, spec_m = _pair_specs(spec)
    g_every = jnp.zeros_like(hyper_states).at[-1, -1].set(g_last)
    args_m = _backward_args(spec_m, res_m, g_main)
    args_h = _backward_args(spec_h, res_h, g_every)
    out_h, out_m = IMPLEMENTATIONS[spec.impl].pair_backward_loop(spec, args_h, args_m, proj_kernel)
    d_main = _cell_cotangents(res_m, args_m[1], g_main, out_m)
    d_hyper = _cell_cotangents(res_h, args_h[1], g_every, out_h)
    # z's weight gradients from dz [T, L, Bp, Np] as the kernel left it: P and p padded to
    # Np units, not dz sliced to n (a copy of it).
    geo_m, batch = args_m[1], hyper_states.shape[2]
    pad = lambda x: jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, geo_m.n_pad - geo_m.n)])  # noqa: E731
    padded = (pad(proj_kernel), pad(proj_bias))

    def scales(kernel, bias):
        return cells.hyper_scales(kernel, bias, hyper_states, spec.dtype)

    _, scales_vjp = jax.vjp(scales, *padded)
    d_kernel, d_bias = (d[..., : geo_m.n] for d in scales_vjp(out_m[2][..., :batch, :]))
    pair = lambda i: (d_hyper[i], d_main[i])  # noqa: E731
    return pair(0), (d_kernel, d_bias), pair(1), pair(2), pair(4)


_pair_sequence.defvjp(_pair_sequence_fwd, _pair_sequence_bwd)


def hyper_highway_sequence(
    spec: SequenceSpec,
    weights: tuple[cells.HighwayWeights, cells.HighwayWeights],
    proj: tuple[Array, Array],
    s0s: tuple[Array, Array],
    xprojs: tuple[Array, Array],
    gate_keys: tuple[Array | None, Array | None],
) -> tuple[Array, Array]:
    """A HyperRHN's two recurrences as one op running both cells in one launch each way:
    (hyper, main) pairs, proj (P [L, h, n], p [L, n]) -> (last hyper state [B, h], main
    states [T, B, n])."""
    if spec.gate_dropout and None in gate_keys:
        raise ValueError("gate dropout needs a key")
    keys = tuple(None if k is None else jax.random.key_data(k) for k in gate_keys)
    return _pair_sequence(spec, tuple(weights), tuple(proj), tuple(s0s), tuple(xprojs), keys)
