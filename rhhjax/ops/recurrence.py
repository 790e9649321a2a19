"""The RHN time recurrence over a whole sequence as ONE differentiable op (`highway_sequence`).

A `jax.custom_vjp` around the WHOLE time loop; the loops themselves come from the
implementation module `spec.impl` names (`rhhjax.ops.spec.IMPLEMENTATIONS`: `fused`, XLA
matmuls, in `rhhjax.ops.fused`; `pallas`, Pallas kernels, in `rhhjax.ops.pallas`; `mosaic`,
Mosaic GPU kernels, in `rhhjax.ops.mosaic`; `persistent`, two persistent Mosaic GPU kernels,
in `rhhjax.ops.persistent`). This module holds what they share: padding once per call, the
gate-dropout decisions of every step, and the unpadding; each `backward_loop` also returns
the weight gradient, one large matmul per layer after the reverse loop
(`loops.deferred_weight_gradient`, or `persistent`'s own from its kernels' buffers).
`scan` (the textbook `nn.scan` in `rhhjax.models`) never reaches this module.

Everything that depends only on the parameters or on the whole sequence happens ONCE per
call, outside the time loops: padding to the implementation's layout (`geometry`), casting
the weights to the matmul dtype and the transposed weight for the backward
(`prepare_weights`), and the dropout decisions.

Padded layout inside the loops (B -> Bp rows, n -> Np units, halves kept aligned):

    s      [Bp, Np]        f32 carry            w      L per-layer arrays, matmul dtype
    xproj  [T, Bp, 2, Np]  f32 (x U, no bias)   bias   [L, 2, Np]       f32 (b_U added at l=0)
    z      [T, L, Bp, Np]  f32 | None           keep   [T, L, Bp, Np]   KEEP_DTYPE | None
           (z: the implementation's `scales_operand`; `persistent`'s is layer-major)

Every implementation is a `rhhjax.ops.spec.Implementation`: the forward loop returns the
states and what its own backward loop reads (one packed array per step, each micro-layer's
input state and saved arrays, [T, L, Bp, K, Np], the implementation's `saved_rows`; for
`persistent` also its kernels' matmul-dtype states), which this module hands back as it is;
the backward loop returns padded gradients, of which this module unpads what it returns
(d_scaled: layer 0 only, the gradient of xproj).

Padded units have zero weights, bias and input, so their state stays 0; padded batch rows
get zero cotangents, so they add nothing to any gradient.

Shapes: T time, L depth, B batch, n width.
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
    """What the loops read besides the weights, padded once: (bias [L, 2, Np] with b_U added
    at layer 0, s0 [Bp, Np], xproj [T, Bp, 2, Np], z, keep [T, L, Bp, Np], hidden)."""
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
        impl.scales_operand(geo, z),
        keep,
        geo.pad_rows(hidden_masks),
    )


def _run_forward(spec, weights, s0, xproj, z, key_data, hidden_masks, save: bool):
    """Pads, runs the forward loop: (geo, operands, states [T, L, Bp, Np], saved)."""
    impl = IMPLEMENTATIONS[spec.impl]
    geo = impl.geometry(spec, *s0.shape)
    operands = _padded_operands(spec, impl, geo, weights, s0, xproj, z, key_data, hidden_masks)
    w = impl.prepare_weights(spec, geo, weights.kernel_s)
    states, saved = impl.forward_loop(spec, geo, w, *operands, save=save)
    return geo, operands, states, saved


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _sequence(spec, weights, s0, xproj, z, key_data, hidden_masks):
    # Without differentiation nothing is saved for a backward pass.
    geo, _, states, _ = _run_forward(spec, weights, s0, xproj, z, key_data, hidden_masks, False)
    return geo.unpad_rows(_returned(spec, states))


def _sequence_fwd(spec, weights, s0, xproj, z, key_data, hidden_masks):
    geo, operands, states, saved = _run_forward(
        spec, weights, s0, xproj, z, key_data, hidden_masks, save=True
    )
    key_zero = None if key_data is None else jnp.zeros(key_data.shape, jax.dtypes.float0)
    return geo.unpad_rows(_returned(spec, states)), (operands, saved, key_zero, weights)


def _returned(spec: SequenceSpec, states: Array) -> Array:
    """states [T, L, Bp, Np] -> what the op returns: all of them, or with
    ``spec.last_layer_only`` the last layer's [T, Bp, Np]."""
    return states[:, -1] if spec.last_layer_only else states


def _cotangent(spec: SequenceSpec, impl, g: Array, depth: int) -> Array:
    """The padded cotangent of the returned states as ``impl``'s backward reads it: as it
    is, or (last layer only, an implementation that reads every layer's) [T, L, Bp, Np] with
    zeros at the other layers."""
    if not spec.last_layer_only or impl.LAST_LAYER_COTANGENT:
        return g
    return jnp.zeros((g.shape[0], depth, *g.shape[1:]), g.dtype).at[:, -1].set(g)


def _sequence_bwd(spec, residuals, g_states):
    return _cell_backward(spec, residuals, g_states)[0]


def _cell_backward(spec, residuals, g_states, scale_bias: bool = False):
    """(the cotangents of `_sequence`'s inputs, with ``scale_bias`` the sum of dz over steps
    and rows [L, n] from the implementation's kernel (`persistent.
    backward_loop_and_scale_bias`: the gradient of the bias p of z = s P + p), else None)."""
    impl = IMPLEMENTATIONS[spec.impl]
    args = _backward_args(spec, residuals, g_states)
    if scale_bias:
        loop_out = impl.backward_loop_and_scale_bias(*args)
    else:
        loop_out = impl.backward_loop(*args)
    return _cell_cotangents(residuals, args[1], g_states, loop_out)


def _backward_args(spec, residuals, g_states) -> tuple:
    """The implementation's `backward_loop` arguments (spec, geo, transposed weights, the
    padded operands, saved, the padded cotangent g)."""
    operands, saved, _, weights = residuals
    bias, s0, xproj, z, keep, hidden = operands
    impl = IMPLEMENTATIONS[spec.impl]
    geo = impl.geometry(spec, *g_states.shape[-2:])
    w_t = impl.prepare_weights(spec, geo, weights.kernel_s, transposed=True)
    g = _cotangent(spec, impl, geo.pad_rows(g_states), bias.shape[0])
    return (spec, geo, w_t, bias, s0, xproj, z, keep, hidden, saved, g)


def _cell_cotangents(residuals, geo, g_states, loop_out):
    """`_cell_backward`'s return from a `backward_loop`'s (ds0, d_scaled, dz, dbias, dw[,
    dp]) gradients: each unpadded (dp, the sum of dz, None without it)."""
    operands, _, key_zero, weights = residuals
    hidden = operands[5]
    batch, width = g_states.shape[-2:]
    ds0, d_scaled, dz, dbias, dw = loop_out[:5]
    dp = loop_out[5] if len(loop_out) > 5 else None
    dp = None if dp is None else dp[..., : geo.n]
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
    return (d_weights, geo.unpad_rows(ds0), dxproj, dz, key_zero, dhidden), dp


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
      spec: static implementation choice (`rhhjax.ops.spec.resolve`), a whole-sequence
        implementation (not `scan`).
      weights: cell parameters (kernel_x is not used: pass `xproj` instead; its gradient is
        zero here and flows through `xproj`).
      s0: [B, n] initial state (float32).
      xproj: [T, B, 2n] input projections `x U` (no bias, unscaled).
      z: [T, L, B, n] hyper scales, or None.
      gate_key: dropout key for gate masks (required when spec.gate_dropout).
      hidden_masks: [L, B, n] variational masks on the matmul input, or None (not pallas).
    Returns:
      states [T, L, B, n]: the state after every micro-layer of every step (float32); with
      ``spec.last_layer_only`` [T, B, n], the last micro-layer's only.
    """
    key_data = None if gate_key is None else jax.random.key_data(gate_key)
    if spec.gate_dropout and key_data is None:
        raise ValueError("gate dropout needs a key")
    return _sequence(spec, weights, s0, xproj, z, key_data, hidden_masks)


# ----------------------------------------------------------------------------- hyper inside


def hyper_inside(spec: SequenceSpec, batch: int, width: int, hyper_width: int) -> bool:
    """Whether `hyper_highway_sequence` runs this HyperRHN: its implementation runs the hyper
    cell inside its forward kernel (``persistent``) and has plans for these widths."""
    impl = IMPLEMENTATIONS[spec.impl]
    plans = getattr(impl, "hyper_inside_plans", None)
    return plans is not None and plans(spec, batch, width, hyper_width) is not None


def _hyper_specs(spec: SequenceSpec) -> tuple[SequenceSpec, SequenceSpec]:
    """(the hyper cell's spec: every layer returned, the main cell's: the last layer only)."""
    hyper = dataclasses.replace(spec, last_layer_only=False)
    return hyper, dataclasses.replace(spec, last_layer_only=True)


def _hyper_run_forward(spec, weights, proj, s0s, xprojs, keys, save: bool):
    """Pads both cells and runs their forward as one kernel: per cell (geo, operands with
    z, states [T, L, Bp, Np], saved); the main cell's z is what its backward reads (the
    implementation's: `persistent.RecomputedScales` where it recomputes z)."""
    impl = IMPLEMENTATIONS[spec.impl]
    cells_in = zip(_hyper_specs(spec), weights, s0s, xprojs, keys, strict=True)
    geos, operands = [], []
    for cell_spec, w, s0, xproj, key_data in cells_in:
        geo = impl.geometry(cell_spec, *s0.shape)
        geos.append(geo)
        operands.append(_padded_operands(cell_spec, impl, geo, w, s0, xproj, None, key_data, None))
    kernels = tuple(w.kernel_s for w in weights)
    hyper, main, z = impl.hyper_forward_loop(spec, geos, kernels, operands, *proj, save=save)
    operands[1] = (*operands[1][:3], z, *operands[1][4:])
    return [(geo, ops, *out) for geo, ops, out in zip(geos, operands, (hyper, main), strict=True)]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _hyper_sequence(spec, weights, proj, s0s, xprojs, keys):
    # Without differentiation nothing is saved for a backward pass.
    runs = _hyper_run_forward(spec, weights, proj, s0s, xprojs, keys, save=False)
    return _hyper_returned(spec, runs)


def _hyper_returned(spec, runs) -> tuple[Array, Array]:
    """(the hyper state after the last micro-layer [B, h] (the carry: all the model reads of
    it), the main cell's last layer [T, B, n]), unpadded."""
    (geo_h, _, states_h, _), (geo_m, _, states_m, _) = runs
    _, spec_m = _hyper_specs(spec)
    return geo_h.unpad_rows(states_h[-1, -1]), geo_m.unpad_rows(_returned(spec_m, states_m))


def _hyper_sequence_fwd(spec, weights, proj, s0s, xprojs, keys):
    runs = _hyper_run_forward(spec, weights, proj, s0s, xprojs, keys, save=True)
    out = _hyper_returned(spec, runs)
    residuals = []
    for (_, operands, _, saved), w, key_data in zip(runs, weights, keys, strict=True):
        key_zero = None if key_data is None else jnp.zeros(key_data.shape, jax.dtypes.float0)
        residuals.append((operands, saved, key_zero, w))
    geo_h, _, states_h, _ = runs[0]
    return out, (tuple(residuals), proj, geo_h.unpad_rows(states_h))  # dP reads every state


def _hyper_sequence_bwd(spec, residuals, g):
    """Both cells' backward in one kernel where the implementation has it
    (`persistent.hyper_backward_loop`: the hyper cell one phase behind, its state gradient
    through z added in the kernel); else the main cell's backward (with dp, the sum of dz,
    from its kernel's column sums), z's VJP for the hyper states' cotangent
    (`cells.hyper_scales`), then the hyper cell's backward with that cotangent added. dP,
    the projection's gradient, is z's VJP either way."""
    (res_h, res_m), (proj_kernel, proj_bias), hyper_states = residuals
    g_last, g_main = g  # the hyper state after the last micro-layer's cotangent [B, h]
    spec_h, spec_m = _hyper_specs(spec)
    steps, depth = hyper_states.shape[:2]

    def scales(kernel, states):
        return cells.hyper_scales(kernel, proj_bias, states, spec.dtype)

    impl = IMPLEMENTATIONS[spec.impl]
    args_m = _backward_args(spec_m, res_m, g_main)
    joint = None
    if hasattr(impl, "hyper_backward_loop"):
        # The hyper cell's cotangent as its last layer's alone ([T, B, h], zero but at T - 1).
        spec_h_last = dataclasses.replace(spec_h, last_layer_only=True)
        g_hyper = jnp.zeros((steps, *g_last.shape), g_last.dtype).at[-1].set(g_last)
        args_h = _backward_args(spec_h_last, res_h, g_hyper)
        joint = impl.hyper_backward_loop(spec, args_h, args_m, proj_kernel)
    if joint is not None:
        d_hyper, _ = _cell_cotangents(res_h, args_h[1], g_last, joint[0])
        d_main, d_bias = _cell_cotangents(res_m, args_m[1], g_main, joint[1])
        _, kernel_vjp = jax.vjp(lambda kernel: scales(kernel, hyper_states), proj_kernel)
        (d_kernel,) = kernel_vjp(d_main[3])
    else:
        loop_out = impl.backward_loop_and_scale_bias(*args_m)
        d_main, d_bias = _cell_cotangents(res_m, args_m[1], g_main, loop_out)
        _, scales_vjp = jax.vjp(scales, proj_kernel, hyper_states)
        d_kernel, d_states = scales_vjp(d_main[3])
        g_every = jnp.zeros((steps, depth, *g_last.shape), g_last.dtype).at[-1, -1].set(g_last)
        d_hyper = _sequence_bwd(spec_h, res_h, g_every + d_states)
    pair = lambda i: (d_hyper[i], d_main[i])  # noqa: E731
    return pair(0), (d_kernel, d_bias), pair(1), pair(2), pair(4)


_hyper_sequence.defvjp(_hyper_sequence_fwd, _hyper_sequence_bwd)


def hyper_highway_sequence(
    spec: SequenceSpec,
    weights: tuple[cells.HighwayWeights, cells.HighwayWeights],
    proj: tuple[Array, Array],
    s0s: tuple[Array, Array],
    xprojs: tuple[Array, Array],
    gate_keys: tuple[Array | None, Array | None],
) -> tuple[Array, Array]:
    """A HyperRHN's two recurrences (``hyper_input="x"``: the hyper cell reads x only) over a
    whole sequence as one differentiable op whose forward runs BOTH cells in one kernel
    (`hyper_inside`). Its gradients are `highway_sequence`'s of each cell, z = s_hyper P + p
    between them (`cells.hyper_scales`).

    Args:
      spec: as `highway_sequence`'s (the main cell's ``last_layer_only`` is implied).
      weights: (hyper, main) cell parameters (kernel_x unused: pass ``xprojs``).
      proj: (P [L, h, n], p [L, n]) the hyper projection.
      s0s: (s_hyper [B, h], s_main [B, n]) initial states (float32).
      xprojs: (hyper x U [T, B, 2h], main x U [T, B, 2n]), no bias, unscaled.
      gate_keys: (hyper, main) dropout keys (required when spec.gate_dropout), or Nones.
    Returns:
      (the hyper state after the last micro-layer of the last step [B, h] (the carry), main
      states [T, B, n] after the last micro-layer of every step).
    """
    if spec.gate_dropout and None in gate_keys:
        raise ValueError("gate dropout needs a key")
    keys = tuple(None if k is None else jax.random.key_data(k) for k in gate_keys)
    return _hyper_sequence(spec, tuple(weights), tuple(proj), tuple(s0s), tuple(xprojs), keys)
