"""Pure-JAX emulation of the persistent whole-sequence kernel's schedule.

The persistent kernel (`rhhjax.kernels.mosaic.plan` counts its resources) runs all
``T * L`` micro-layer phases of a sequence in one launch. This module computes the same
recurrence as `recurrence.highway_sequence` in EXACTLY that kernel's schedule, so that the
schedule's numerics are checked on a CPU before a kernel exists:

* Ownership: block ``(r, g)`` of a ``row_blocks x col_blocks`` grid owns batch rows
  ``r * rows ..`` and units ``g * u ..`` (``u = plan.units_per_block``): both the h-columns and
  the t-columns of its units, so scale, bias, gates and combine are block-local.
* Forward phase ``(t, l)``: each block accumulates ``s[rows, :] @ W_l[:, :, units]`` over K
  chunks of ``plan.k_chunk`` in a fixed order (chunk 0, 1, ...), each chunk's product in
  float32 and added to a float32 accumulator; then ``u = acc (+ x U at l = 0)``,
  ``a = u * z + b``, the gates and the combine on its slice, written to the whole-sequence
  outputs with the saved gates h, t (and u with z) for the backward.
* Grid barrier: the phase boundary. Here: the new state is assembled from the blocks'
  slices (`_assemble`) before the next phase reads any of it.
* Backward phase ``(t, l)`` (reverse order): each block owns the same units; it computes
  its columns of ``d_scaled_above @ W_above^T`` (``K = 2 * n_pad``, the rows of ``W`` of its
  units, same chunk order), adds the carried ``ds * (1 - t)`` of the layer above and the
  outside cotangent, runs the gate backward on its slice, and writes ``d_scaled = da * z``
  (the next phase's operand) and ``dz``; its bias gradient accumulates block-locally across
  phases. One barrier per phase, then one tail phase for the gradient of ``s0``.
* Weight gradients: one large GEMM per layer after the loop (``s_in^T d_scaled`` over all
  steps and rows).

Rows are padded to ``plan.b_pad`` and units to ``plan.n_pad`` with zeros (padded units keep a
zero state; padded rows get zero cotangents). Shapes: T time, L depth, B batch, n width.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from rhhjax.kernels.hardware import H100
from rhhjax.kernels.layout import F32
from rhhjax.kernels.mosaic.plan import PersistentPlan

from rhhjax.ops import cells

Array = jax.Array


class Schedule(NamedTuple):
    """The schedule knobs (static): blocks along the gate columns and the batch, K chunk."""

    col_blocks: int = H100.sms
    row_blocks: int = 1
    k_chunk: int = 64

    def plan(self, batch: int, width: int, dtype: Any) -> PersistentPlan:
        """The kernel plan of one call (its padded extents are the emulation's)."""
        return PersistentPlan(
            batch=batch,
            width=width,
            dtype=jnp.dtype(dtype).name,
            col_blocks=self.col_blocks,
            row_blocks=self.row_blocks,
            k_chunk=self.k_chunk,
        )


# ----------------------------------------------------------------------------- block layout


def _to_blocks(plan: PersistentPlan, x: Array) -> Array:
    """Full [Bp, n_pad] -> block-local [R, C, rows, u] (or [Bp, 2, n_pad] -> [R, C, rows, 2, u])."""
    r, c, rows, u = plan.row_blocks, plan.col_blocks, plan.rows_per_block, plan.units_per_block
    if x.ndim == 2:
        return x.reshape(r, rows, c, u).transpose(0, 2, 1, 3)
    return x.reshape(r, rows, 2, c, u).transpose(0, 3, 1, 2, 4)


def _assemble(plan: PersistentPlan, x: Array) -> Array:
    """The grid barrier: block slices [R, C, rows, (2,) u] -> the full [Bp, (2,) n_pad]."""
    if x.ndim == 4:
        return x.transpose(0, 2, 1, 3).reshape(plan.b_pad, plan.n_pad)
    return x.transpose(0, 2, 3, 1, 4).reshape(plan.b_pad, 2, plan.n_pad)


def _a_chunks(plan: PersistentPlan, a: Array, k: int, dtype) -> Array:
    """GEMM A operand [Bp, K'] -> [R, rows, K/k_chunk, k_chunk] in the matmul dtype (zero
    columns appended or dropped to K = k: they multiply zero weights)."""
    width = a.shape[-1]
    a = jnp.pad(a, [(0, 0), (0, max(k - width, 0))])[:, :k]
    return a.astype(dtype).reshape(plan.row_blocks, plan.rows_per_block, -1, plan.k_chunk)


def _ordered_sum(partials: Array) -> Array:
    """Sum over the leading (K chunk) axis in chunk order 0, 1, ..., into float32."""
    acc = partials[0]
    for c in range(1, partials.shape[0]):
        acc = acc + partials[c]
    return acc


def forward_weights(plan: PersistentPlan, kernel_s: Array, dtype) -> Array:
    """W [L, n, 2n] -> each block's forward slice [L, C, K/k_chunk, k_chunk, 2, u] in dtype:
    w[l, g, c, k, h, j] = W[l, c * k_chunk + k, h * n + g * u + j] (zero when padded)."""
    depth, n = kernel_s.shape[0], plan.width
    w = kernel_s.astype(dtype).reshape(depth, n, 2, n)
    w = jnp.pad(w, [(0, 0), (0, plan.k_pad - n), (0, 0), (0, plan.n_pad - n)])
    w = w.reshape(depth, -1, plan.k_chunk, 2, plan.col_blocks, plan.units_per_block)
    return w.transpose(0, 4, 1, 2, 3, 5)


def backward_weights(plan: PersistentPlan, kernel_s: Array, dtype) -> Array:
    """W [L, n, 2n] -> each block's backward slice [L, C, K2/k_chunk, k_chunk, u] in dtype:
    the rows of W of the block's units, K running over the gate columns (h, i) of n_pad each:
    w[l, g, c, k, j] = W[l, g * u + j, h * n + i] with c * k_chunk + k = h * n_pad + i."""
    depth, n, n_pad = kernel_s.shape[0], plan.width, plan.n_pad
    w = kernel_s.astype(dtype).reshape(depth, n, 2, n)
    w = jnp.pad(w, [(0, 0), (0, n_pad - n), (0, 0), (0, n_pad - n)])  # [L, j, h, i]
    w = w.transpose(0, 2, 3, 1).reshape(depth, 2 * n_pad, n_pad)  # [L, (h, i), j]
    w = jnp.pad(w, [(0, 0), (0, plan.k2_pad - 2 * n_pad), (0, 0)])
    w = w.reshape(depth, -1, plan.k_chunk, plan.col_blocks, plan.units_per_block)
    return w.transpose(0, 3, 1, 2, 4)


# ----------------------------------------------------------------------------- phases


def forward_phase(plan, keep, dtype, s, w_l, z_l, bias_l, xproj_t, keep_l):
    """One forward micro-layer phase of every block, then the barrier.

    s [Bp, n_pad] f32 (the assembled state); w_l [C, Kc, k_chunk, 2, u]; z_l, keep_l
    [Bp, n_pad] or None; bias_l [2, n_pad]; xproj_t [Bp, 2, n_pad] or None (layer 0).
    Returns (s_new [Bp, n_pad], saved {"h", "t" [Bp, n_pad], "u" [Bp, 2, n_pad] with z}).
    """
    a_op = _a_chunks(plan, s, plan.k_pad, dtype)
    partials = jnp.einsum("rbck,gckhu->crgbhu", a_op, w_l, preferred_element_type=F32)
    u = _ordered_sum(partials)  # [R, C, rows, 2, u]
    if xproj_t is not None:
        u = u + _to_blocks(plan, xproj_t)
    a = u if z_l is None else u * _to_blocks(plan, z_l)[:, :, :, None]
    a = a + bias_l.reshape(2, plan.col_blocks, 1, plan.units_per_block).transpose(1, 2, 0, 3)
    h, t = jnp.tanh(a[..., 0, :]), jax.nn.sigmoid(a[..., 1, :])
    gate = t if keep_l is None else t * (_to_blocks(plan, keep_l).astype(F32) / keep)
    s_new = h * gate + _to_blocks(plan, s) * (1.0 - t)
    saved = {"h": _assemble(plan, h), "t": _assemble(plan, t)}
    if z_l is not None:
        saved["u"] = _assemble(plan, u)
    return _assemble(plan, s_new), saved


def state_gradient(plan, dtype, d_scaled_above, wt_above, ds_carry_above):
    """Every block's units of ``ds_carry_above + d_scaled_above @ W_above^T``: [Bp, n_pad].

    d_scaled_above [Bp, 2, n_pad] f32; wt_above [C, K2c, k_chunk, u]; ds_carry_above
    [Bp, n_pad]. Returned as block slices [R, C, rows, u].
    """
    a_op = _a_chunks(plan, d_scaled_above.reshape(plan.b_pad, -1), plan.k2_pad, dtype)
    partials = jnp.einsum("rbck,gcku->crgbu", a_op, wt_above, preferred_element_type=F32)
    return _to_blocks(plan, ds_carry_above) + _ordered_sum(partials)


def backward_phase(plan, keep, dtype, above, g_l, s_prev, saved_l, z_l, keep_l):
    """One backward micro-layer phase of every block (the state-gradient GEMM of the layer
    above fused with this layer's gate backward), then the barrier.

    above: (d_scaled [Bp, 2, n_pad] f32, W^T blocks, ds_carry [Bp, n_pad]) of the phase
    above; g_l [Bp, n_pad] the outside cotangent; s_prev the phase's input state; saved_l its
    saved gates. Returns (d_scaled [Bp, 2, n_pad], ds_carry [Bp, n_pad], da [Bp, 2, n_pad],
    dz [Bp, n_pad] or None).
    """
    ds = state_gradient(plan, dtype, *above) + _to_blocks(plan, g_l)
    mask = None if keep_l is None else _to_blocks(plan, keep_l).astype(F32) / keep
    h, t = _to_blocks(plan, saved_l["h"]), _to_blocks(plan, saved_l["t"])
    da, ds_carry = cells.gate_backward(ds, _to_blocks(plan, s_prev), h, t, mask)
    da = da.reshape(*da.shape[:-1], 2, plan.units_per_block)
    d_scaled, dz = da, None
    if z_l is not None:
        d_scaled = da * _to_blocks(plan, z_l)[:, :, :, None]
        dz = _assemble(plan, jnp.sum(da * _to_blocks(plan, saved_l["u"]), axis=-2))
    return _assemble(plan, d_scaled), _assemble(plan, ds_carry), _assemble(plan, da), dz


# ----------------------------------------------------------------------------- loops


class _Operands(NamedTuple):
    """The padded operands of the loops (see `_operands`)."""

    bias: Array  # [L, 2, n_pad], b_U added at layer 0
    s0: Array  # [Bp, n_pad]
    xproj: Array  # [T, Bp, 2, n_pad]
    z: Array | None  # [T, L, Bp, n_pad]
    keep: Array | None  # [T, L, Bp, n_pad] bool


def _pad_rows(plan: PersistentPlan, x: Array | None) -> Array | None:
    """[..., B, n] -> [..., Bp, n_pad]."""
    if x is None:
        return None
    lead = [(0, 0)] * (x.ndim - 2)
    return jnp.pad(x, [*lead, (0, plan.b_pad - plan.batch), (0, plan.n_pad - plan.width)])


def _pad_halves(plan: PersistentPlan, x: Array, rows: bool) -> Array:
    """[..., 2n] -> [..., 2, n_pad]; with `rows`, [..., B, 2n] -> [..., Bp, 2, n_pad]."""
    x = x.astype(F32).reshape(*x.shape[:-1], 2, plan.width)
    pads = [(0, 0)] * (x.ndim - 1) + [(0, plan.n_pad - plan.width)]
    if rows:
        pads[-3] = (0, plan.b_pad - plan.batch)
    return jnp.pad(x, pads)


def _operands(spec, plan, weights, s0, xproj, z, key_data) -> _Operands:
    """Pads everything the loops read, once per call; gate keep decisions of every step."""
    depth = weights.kernel_s.shape[0]
    bias = _pad_halves(plan, weights.bias_s, False)
    bias = bias.at[0].add(_pad_halves(plan, weights.bias_x, False))
    keep = None
    if spec.gate_dropout:
        key = jax.random.wrap_key_data(key_data)
        shape = (depth, plan.batch, plan.width)
        keep = cells.gate_keeps(key, xproj.shape[0], shape, spec.keep, spec.first_step)
    xproj = _pad_halves(plan, xproj, True)
    return _Operands(bias, _pad_rows(plan, s0), xproj, _pad_rows(plan, z), _pad_rows(plan, keep))


def _per_step(x: Array | None, layer: int) -> Array | None:
    return None if x is None else x[layer]


def forward_loop(spec, plan, w_blocks, ops: _Operands):
    """All forward phases, time-major: (states [T, L, Bp, n_pad], saved {name: [T, L, ...]})."""
    depth = w_blocks.shape[0]

    def body(s, xs):
        xproj_t, z_t, keep_t = xs
        states, saved = [], []
        for layer in range(depth):
            s, saved_l = forward_phase(
                plan, spec.keep, spec.dtype, s, w_blocks[layer], _per_step(z_t, layer),
                ops.bias[layer], xproj_t if layer == 0 else None, _per_step(keep_t, layer),
            )  # fmt: skip
            states.append(s)
            saved.append(saved_l)
        return s, (jnp.stack(states), jax.tree_util.tree_map(lambda *a: jnp.stack(a), *saved))

    _, (states, saved) = jax.lax.scan(body, ops.s0, (ops.xproj, ops.z, ops.keep))
    return states, saved


def _inputs_of(states: Array, s0: Array) -> Array:
    """[T, L, Bp, n_pad] phase outputs -> each phase's input state (the previous output)."""
    flat = states.reshape(-1, *states.shape[2:])
    inputs = jnp.concatenate([s0[None], flat[:-1]], axis=0)
    return inputs.reshape(states.shape)


def backward_loop(spec, plan, wt_blocks, ops: _Operands, inputs, saved, g_states):
    """All backward phases in reverse, then the tail phase for s0.

    Returns (ds0 [Bp, n_pad], d_scaled [T, L, Bp, 2, n_pad], dz [T, L, Bp, n_pad] | None,
    dbias [L, 2, n_pad] accumulated block-locally over the phases).
    """
    depth = wt_blocks.shape[0]
    zero_scaled = jnp.zeros((plan.b_pad, 2, plan.n_pad), F32)

    def body(carry, xs):
        d_scaled_above, ds_carry_above, dbias = carry
        z_t, keep_t, inputs_t, saved_t, g_t = xs
        above = (d_scaled_above, wt_blocks[0], ds_carry_above)
        d_scaled_t, dz_t = [None] * depth, [None] * depth
        for layer in reversed(range(depth)):
            saved_l = {name: value[layer] for name, value in saved_t.items()}
            d_scaled, ds_carry, da, dz_t[layer] = backward_phase(
                plan, spec.keep, spec.dtype, above, g_t[layer], inputs_t[layer], saved_l,
                _per_step(z_t, layer), _per_step(keep_t, layer),
            )  # fmt: skip
            dbias = dbias.at[layer].add(da.sum(0))
            d_scaled_t[layer] = d_scaled
            above = (d_scaled, wt_blocks[layer], ds_carry)
        dz_out = None if ops.z is None else jnp.stack(dz_t)
        return (above[0], above[2], dbias), (jnp.stack(d_scaled_t), dz_out)

    init = (zero_scaled, jnp.zeros_like(ops.s0), jnp.zeros((depth, 2, plan.n_pad), F32))
    xs = (ops.z, ops.keep, inputs, saved, g_states)
    (d_scaled0, ds_carry0, dbias), (d_scaled, dz) = jax.lax.scan(body, init, xs, reverse=True)
    ds0 = _assemble(plan, state_gradient(plan, spec.dtype, d_scaled0, wt_blocks[0], ds_carry0))
    return ds0, d_scaled, dz, dbias


# ----------------------------------------------------------------------------- the op


def _run_forward(spec, schedule, weights, s0, xproj, z, key_data):
    plan = schedule.plan(*s0.shape, spec.dtype)
    ops = _operands(spec, plan, weights, s0, xproj, z, key_data)
    w_blocks = forward_weights(plan, weights.kernel_s, spec.dtype)
    states, saved = forward_loop(spec, plan, w_blocks, ops)
    return plan, ops, states, saved


def _unpad_rows(plan: PersistentPlan, x: Array) -> Array:
    return x[..., : plan.batch, : plan.width]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _sequence(spec, schedule, weights, s0, xproj, z, key_data):
    plan, _, states, _ = _run_forward(spec, schedule, weights, s0, xproj, z, key_data)
    return _unpad_rows(plan, states)


def _sequence_fwd(spec, schedule, weights, s0, xproj, z, key_data):
    plan, ops, states, saved = _run_forward(spec, schedule, weights, s0, xproj, z, key_data)
    key_zero = None if key_data is None else jnp.zeros(key_data.shape, jax.dtypes.float0)
    return _unpad_rows(plan, states), (ops, states, saved, key_zero, weights)


def _sequence_bwd(spec, schedule, residuals, g_states):
    ops, states, saved, key_zero, weights = residuals
    plan = schedule.plan(*g_states.shape[-2:], spec.dtype)
    wt_blocks = backward_weights(plan, weights.kernel_s, spec.dtype)
    inputs = _inputs_of(states, ops.s0)
    ds0, d_scaled, dz, dbias = backward_loop(
        spec, plan, wt_blocks, ops, inputs, saved, _pad_rows(plan, g_states)
    )
    # Deferred weight gradient: one [n_pad, T*Bp] x [T*Bp, 2*n_pad] GEMM per layer.
    acc = cells.accumulation_dtype(spec.dtype)
    dw = jnp.einsum(
        "tlbi,tlbho->liho",
        inputs.astype(spec.dtype),
        d_scaled.astype(spec.dtype),
        preferred_element_type=acc,
    )
    n, depth = plan.width, dw.shape[0]
    dw = dw[:, :n, :, :n].reshape(depth, n, 2 * n)
    dbias = dbias[..., :n].reshape(depth, 2 * n)
    d_weights = cells.HighwayWeights(
        kernel_x=jnp.zeros_like(weights.kernel_x), bias_x=dbias[0], kernel_s=dw, bias_s=dbias
    )
    d_weights = jax.tree_util.tree_map(lambda g, p: g.astype(p.dtype), d_weights, weights)
    dxproj = d_scaled[:, 0, : plan.batch, :, :n].reshape(-1, plan.batch, 2 * n)
    dz = None if dz is None else _unpad_rows(plan, dz)
    return d_weights, _unpad_rows(plan, ds0), dxproj, dz, key_zero


_sequence.defvjp(_sequence_fwd, _sequence_bwd)


def highway_sequence(
    spec: Any,
    weights: cells.HighwayWeights,
    s0: Array,
    xproj: Array,
    z: Array | None,
    gate_key: Array | None,
    hidden_masks: Array | None,
    schedule: Schedule | None = None,
) -> Array:
    """The RHN recurrence over a whole sequence in the persistent kernel's schedule.

    The same op as `recurrence.highway_sequence` (same arguments and result; `spec` is its
    `SequenceSpec`: `keep`, `dtype`, `gate_dropout` and `first_step` are read, `impl` and
    the Pallas knobs are not), plus the static `schedule`.

    Args:
      spec: static choice (keep probability, matmul dtype, gate dropout, first step).
      weights: cell parameters (kernel_x unused: pass `xproj`; its gradient is zero).
      s0: [B, n] initial state (float32).
      xproj: [T, B, 2n] input projections `x U` (no bias, unscaled).
      z: [T, L, B, n] hyper scales, or None.
      gate_key: dropout key for gate masks (required when spec.gate_dropout).
      hidden_masks: must be None (the persistent kernel has no variational dropout).
      schedule: blocks and K chunk of the emulated kernel (default: the H100's 132 column
        blocks, K chunk 64).
    Returns:
      states [T, L, B, n]: the state after every micro-layer of every step (float32); with
      ``spec.last_layer_only`` [T, B, n], the last micro-layer's only.
    """
    if hidden_masks is not None:
        raise ValueError("impl 'persistent' has no variational dropout")
    key_data = None if gate_key is None else jax.random.key_data(gate_key)
    if spec.gate_dropout and key_data is None:
        raise ValueError("gate dropout needs a key")
    states = _sequence(spec, schedule or Schedule(), weights, s0, xproj, z, key_data)
    return states[:, -1] if spec.last_layer_only else states
