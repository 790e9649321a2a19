"""The RHN time recurrence as one differentiable op: `fused` (pure XLA) and `pallas`.

`model.impl` and the kernel knobs are resolved in `resolve_spec` and nowhere else:

- `scan`: the textbook `nn.scan` over the cell in `rhhjax.models` (plain autodiff; the
  reference). It never reaches this module.
- `fused`: `highway_sequence` below, a `jax.custom_vjp` around the WHOLE time loop, each
  micro-layer one XLA matmul plus elementwise work, forward and backward.
- `pallas`: the same op whose micro-layer steps are the Pallas kernels of `rhhjax.kernels.highway`
  (kernels/forward.py, backward.py, stacked.py): one forward kernel per micro-layer (matmul, scale,
  bias, gates, dropout, combine) and one backward kernel per micro-layer (the state-gradient matmul
  of the layer above fused with the gate backward of the layer below). When differentiated, the
  kernels read and write the whole-sequence arrays at the step index (`*_stacked`), so the time
  loops hold nothing but the kernels. Compiled on a GPU, interpret mode elsewhere
  (`model.pallas_mode`).

Everything that depends only on the parameters or on the whole sequence happens ONCE per
call, outside the time loops: padding to the kernel layout, casting the weights to the
matmul dtype, the transposed weight for the backward, the gate-dropout decisions of every
step, and, after the reverse loop, the weight gradients (one large matmul per layer:
deferred weight gradients) and the unpadding.

Padded layout inside the loops (B -> Bp rows, n -> Np units, halves kept aligned):

    s      [Bp, Np]        f32 carry            w      L x [Np, 2, Np]  matmul dtype
    xproj  [T, Bp, 2, Np]  f32 (x U, no bias)   bias   [L, 2, Np]       f32 (b_U added at l=0)
    z      [T, L, Bp, Np]  f32 | None           keep   [T, L, Bp, Np]   bool / int8 | None

(fused keeps the weight as L x [Np, 2 * Np]; the backward reads L transposed copies.) The
forward stores ONE packed array per step, each micro-layer's input state and saved arrays
([T, L, Bp, K, Np], `_saved_rows`).

Padded units have zero weights, bias and input, so their state stays 0; padded batch rows
get zero cotangents, so they add nothing to any gradient.

Shapes: T time, L depth, B batch, n width.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from rhhjax.kernels import highway
from rhhjax.ops import cells

Array = jax.Array

IMPLS = ("fused", "pallas")
PALLAS_MODES = ("auto", "compiled", "interpret")
# XLA's GPU matmuls pad a contraction dimension that is not a multiple of this (1000 -> 1024
# for its Triton GEMMs, found in the H100 compile report); the fused path pads once per call
# instead of once per time step.
FUSED_UNIT_MULTIPLE = 64


@dataclasses.dataclass(frozen=True)
class SequenceSpec:
    """Static description of one recurrence call (hashable: a custom_vjp nondiff arg)."""

    impl: str  # "fused" | "pallas".
    keep: float  # Gate-dropout keep probability (used when gate dropout is on).
    dtype: Any  # Matmul input dtype.
    gate_dropout: bool  # Whether gate masks are generated from the key.
    interpret: bool = False  # Pallas interpret mode.
    kernel: highway.HighwayConfig = highway.HighwayConfig()  # Pallas block sizes.
    # Time index of the call's first step: gate masks of entry i are those of step
    # first_step + i (1 when the caller ran step 0 itself, e.g. model.original_first_step).
    first_step: int = 0


def resolve_spec(config: Any, gate_dropout: bool) -> SequenceSpec:
    """The one place that turns a `models.ModelConfig` into an executable choice.

    Reads `impl`, `keep`, `compute_dtype`, `pallas_mode` ("auto": compiled Triton on a GPU
    backend, interpret mode elsewhere; "compiled" e.g. to trace a GPU step on a CPU host;
    "interpret") and `kernel` (a `HighwayConfig`).
    """
    if config.impl not in IMPLS:
        raise ValueError(f"impl {config.impl!r} is not a whole-sequence implementation")
    if config.pallas_mode not in PALLAS_MODES:
        raise ValueError(f"pallas_mode {config.pallas_mode!r} is not one of {PALLAS_MODES}")
    interpret = config.impl == "pallas" and (
        config.pallas_mode == "interpret"
        or (config.pallas_mode == "auto" and jax.default_backend() != "gpu")
    )
    return SequenceSpec(
        config.impl,
        float(config.keep),
        jnp.dtype(config.compute_dtype),
        bool(gate_dropout),
        interpret,
        config.kernel,
    )


# ----------------------------------------------------------------------------- layout


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Padded extents of one call: B -> b_pad rows, n -> n_pad units."""

    batch: int
    width: int
    b_pad: int
    n_pad: int
    geo: highway.Geometry | None = None  # The kernels' geometry (pallas only).

    @classmethod
    def make(cls, spec: SequenceSpec, batch: int, width: int) -> _Layout:
        if spec.impl == "pallas":
            geo = highway.Geometry.make(spec.kernel, batch, width)
            return cls(batch, width, geo.b_pad, geo.n_pad, geo)
        n_pad = -(-width // FUSED_UNIT_MULTIPLE) * FUSED_UNIT_MULTIPLE
        return cls(batch, width, batch, n_pad)

    def rows(self, x: Array | None) -> Array | None:
        """[..., B, n] -> [..., Bp, Np] (zeros appended)."""
        if x is None:
            return None
        lead = [(0, 0)] * (x.ndim - 2)
        return jnp.pad(x, [*lead, (0, self.b_pad - self.batch), (0, self.n_pad - self.width)])

    def halves(self, x: Array) -> Array:
        """[..., B, 2n] -> [..., Bp, 2, Np]."""
        x = x.reshape(*x.shape[:-1], 2, self.width)
        lead = [(0, 0)] * (x.ndim - 3)
        pads = [(0, self.b_pad - self.batch), (0, 0), (0, self.n_pad - self.width)]
        return jnp.pad(x, [*lead, *pads])

    def bias(self, b: Array) -> Array:
        """[..., 2n] -> [..., 2, Np]."""
        b = b.reshape(*b.shape[:-1], 2, self.width)
        return jnp.pad(b, [(0, 0)] * (b.ndim - 1) + [(0, self.n_pad - self.width)])

    def weight(self, w: Array, dtype: Any) -> Array:
        """[L, n, 2n] -> [L, Np, 2, Np] in the matmul dtype."""
        w = w.reshape(w.shape[0], self.width, 2, self.width).astype(dtype)
        pad = self.n_pad - self.width
        return jnp.pad(w, [(0, 0), (0, pad), (0, 0), (0, pad)])

    def unrows(self, x: Array) -> Array:
        """[..., Bp, Np] -> [..., B, n]."""
        return x[..., : self.batch, : self.width]

    def unhalves(self, x: Array) -> Array:
        """[..., Bp, 2, Np] -> [..., B, 2n]."""
        x = x[..., : self.batch, :, : self.width]
        return x.reshape(*x.shape[:-2], 2 * self.width)

    def unbias(self, b: Array) -> Array:
        """[..., 2, Np] -> [..., 2n]."""
        b = b[..., : self.width]
        return b.reshape(*b.shape[:-2], 2 * self.width)

    def unweight(self, w: Array) -> Array:
        """[L, Np, 2, Np] -> [L, n, 2n]."""
        w = w[:, : self.width, :, : self.width]
        return w.reshape(w.shape[0], self.width, 2 * self.width)


# ----------------------------------------------------------------------------- fused layers


def _mask(spec: SequenceSpec, keep_l: Array | None, dtype: Any) -> Array | None:
    """bool keep decisions [Bp, Np] -> inverted-dropout mask (0 or 1/keep), or None."""
    return None if keep_l is None else keep_l.astype(dtype) / spec.keep


def _fused_forward(spec, geo, s, w_l, z_l, bias_l, xproj_t, keep_l, hidden_l):
    """One micro-layer in XLA: one matmul and one elementwise fusion.

    s [Bp, Np]; w_l [Np, 2 * Np] in the matmul dtype. Returns (s_new [Bp, Np], saved) with
    the gates "h", "t" [Bp, Np] (the backward recomputes no transcendental) and, with z,
    "full" [Bp, 2, Np] = the unscaled sum (s W_l [+ x U at l = 0]) that z multiplies.
    """
    del geo
    s_in = s if hidden_l is None else s * hidden_l
    n_pad = s.shape[-1]
    pre = cells.matmul(s_in, w_l, spec.dtype).reshape(-1, 2, n_pad)
    full = pre if xproj_t is None else pre + xproj_t
    a = (full if z_l is None else full * z_l[:, None]) + bias_l
    h, t = jnp.tanh(a[:, 0]), jax.nn.sigmoid(a[:, 1])
    mask = _mask(spec, keep_l, s.dtype)
    s_new = h * (t if mask is None else t * mask) + s * (1.0 - t)
    saved = {"h": h, "t": t} if z_l is None else {"h": h, "t": t, "full": full}
    return s_new, saved


def _fused_state_gradient(spec, above) -> Array:
    """ds_carry + (d_scaled @ W^T) [* hidden mask] of the layer above: [Bp, Np].

    above: (d_scaled [Bp, 2 * Np] and W^T [2 * Np, Np], both in the matmul dtype,
    hidden mask [Bp, Np] | None, ds_carry [Bp, Np]).
    """
    d_scaled, w_t, hidden, ds_carry = above
    ds_in = cells.matmul(d_scaled, w_t, spec.dtype)
    return ds_carry + (ds_in if hidden is None else ds_in * hidden)


def _fused_backward(spec, above, ds_out, s_prev, saved_l, z_l, keep_l):
    """Incoming state gradient of a micro-layer from the layer above, then its gate backward.

    ds_out: [Bp, Np] cotangent of this layer's output from outside the recurrence.
    Returns (d_scaled [Bp, 2 * Np] in the matmul dtype (the next matmul's operand),
    ds_carry [Bp, Np], outputs {"da": [Bp, 2, Np]}). The bias gradient, d_scaled =
    da * [z, z] for dW and dz are formed from the stacked da after the loop, with no
    per-step reduction.
    """
    ds = _fused_state_gradient(spec, above) + ds_out
    mask = _mask(spec, keep_l, ds.dtype)
    da, ds_carry = cells.gate_backward(ds, s_prev, saved_l["h"], saved_l["t"], mask)
    da = da.reshape(da.shape[0], 2, -1)
    d_scaled = da if z_l is None else da * z_l[:, None]
    d_scaled = d_scaled.reshape(da.shape[0], -1).astype(spec.dtype)
    return d_scaled, ds_carry, {"da": da}


# ----------------------------------------------------------------------------- pallas layers


def _pallas_forward(spec, geo, s, w_l, z_l, bias_l, xproj_t, keep_l, hidden_l):
    """One micro-layer as one Pallas kernel; saved = {"pre": [Bp, 2, Np]} (s W_l)."""
    del hidden_l  # pallas has no variational dropout (a config error).
    s_new, pre = highway.forward_padded(
        s,
        w_l,
        z_l,
        bias_l,
        xproj_t,
        keep_l,
        keep=spec.keep,
        geo=geo,
        config=spec.kernel,
        interpret=spec.interpret,
    )
    return s_new, {"pre": pre}


# ----------------------------------------------------------------------------- the op


def _saved_rows(spec: SequenceSpec, has_z: bool) -> tuple[tuple[str, int], ...]:
    """What the forward saves per micro-layer besides its input state, as (name, rows of Np).

    pallas: the kernel's unscaled matmul "pre" [Bp, 2, Np]; fused: the gates "h", "t"
    [Bp, Np] and, with z, "full" [Bp, 2, Np] (see `_fused_forward`).
    """
    if spec.impl == "pallas":
        return (("pre", 2),)
    return (("h", 1), ("t", 1), ("full", 2)) if has_z else (("h", 1), ("t", 1))


def _pack(s_in: Array, saved_l: dict, fields) -> Array:
    """[Bp, Np] input state + saved arrays -> ONE [Bp, K, Np] array (one store per step)."""
    rows = [s_in[:, None]] + [saved_l[name].reshape(s_in.shape[0], n, -1) for name, n in fields]
    return jnp.concatenate(rows, axis=1)


def _unpack(packed: Array, fields) -> tuple[Array, dict]:
    """Inverse of `_pack` ([..., Bp, K, Np]): (input state [..., Bp, Np], saved arrays)."""
    saved, offset = {}, 1
    for name, n in fields:
        saved[name] = packed[..., offset, :] if n == 1 else packed[..., offset : offset + n, :]
        offset += n
    return packed[..., 0, :], saved


def _forward_loop(spec, geo, w, bias, s0, xproj, z, keep, hidden, save: bool):
    """Forward over all steps in the padded layout.

    w: per-layer weights (a tuple of L arrays, prepared by `_prepared_weights`).
    Returns (states [T, L, Bp, Np], packed [T, L, Bp, K, Np] or None): with `save`, each
    micro-layer's input state and saved arrays (`_saved_rows`) in one array, so that every
    step stores one array and the backward reads one.
    """
    depth = len(w)
    layer_forward = _pallas_forward if spec.impl == "pallas" else _fused_forward
    bias = _per_layer(bias)  # Sliced here, not in every step (the kernels take whole arrays).
    fields = _saved_rows(spec, z is not None)
    if spec.impl == "pallas" and save:
        s_last, outputs = _pallas_forward_loop(spec, geo, w, bias, s0, xproj, z, keep)
        return _states_from_inputs(outputs[..., 0, :], s_last), outputs

    def body(s, inputs):
        xproj_t, z_t, keep_t = inputs
        outputs = []
        for layer in range(depth):
            s_in = s
            s, saved_l = layer_forward(
                spec,
                geo,
                s,
                w[layer],
                None if z_t is None else z_t[layer],
                bias[layer],
                xproj_t if layer == 0 else None,
                None if keep_t is None else keep_t[layer],
                None if hidden is None else hidden[layer],
            )
            outputs.append(_pack(s_in, saved_l, fields) if save else s)
        return s, jnp.stack(outputs)

    s_last, outputs = jax.lax.scan(body, s0, (xproj, z, keep))
    if not save:
        return outputs, None
    return _states_from_inputs(outputs[..., 0, :], s_last), outputs


def _states_from_inputs(inputs: Array, s_last: Array) -> Array:
    """[T, L, Bp, Np] input states + final state -> the output state of every micro-layer:
    the output of (t, l) is the input of (t, l + 1), or of (t + 1, 0)."""
    last_layer = jnp.concatenate([inputs[1:, 0], s_last[None]], axis=0)
    return jnp.concatenate([inputs[:, 1:], last_layer[:, None]], axis=1)


def _backward_loop(spec, geo, w_t, bias, s0, xproj, z, keep, hidden, packed, g_states):
    """Reverse loop over all steps; every micro-layer is the state-gradient matmul of the
    layer above plus its own gate backward.

    w_t: per-layer transposed weights (`_prepared_weights(..., transposed=True)`);
    packed: the forward's saved arrays (`_forward_loop`).
    Returns (ds0 [Bp, Np], outputs {name: [T, L, ...]}, da_acc): fused {"da"} and None;
    pallas {"d_scaled", "dz" (with z)} and the partial bias gradients [L, P, 2, Np].
    """
    if spec.impl == "pallas":
        return _pallas_backward_loop(spec, geo, w_t, bias, s0, xproj, z, keep, packed, g_states)
    depth = len(w_t)
    bias = _per_layer(bias)
    fields = _saved_rows(spec, z is not None)

    def hidden_of(layer):
        return None if hidden is None else hidden[layer]

    def body(carry, xs):
        d_scaled_above, ds_carry_above = carry
        xproj_t, z_t, keep_t, packed_t, g_t = xs
        above = (d_scaled_above, w_t[0], hidden_of(0), ds_carry_above)
        outputs = [None] * depth
        for layer in reversed(range(depth)):
            s_prev, saved_l = _unpack(packed_t[layer], fields)
            d_scaled, ds_carry, outputs[layer] = _fused_backward(
                spec, above, g_t[layer], s_prev, saved_l,
                None if z_t is None else z_t[layer],
                None if keep_t is None else keep_t[layer],
            )  # fmt: skip
            above = (d_scaled, w_t[layer], hidden_of(layer), ds_carry)
        stacked = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *outputs)
        return (above[0], above[3]), stacked

    b_pad, n_pad = s0.shape
    init = (jnp.zeros((b_pad, 2 * n_pad), spec.dtype), jnp.zeros_like(s0))
    xs = (xproj, z, keep, packed, g_states)
    (d_scaled0, ds_carry0), outputs = jax.lax.scan(body, init, xs, reverse=True)
    # The state gradient of s0 through W_0 (no gate backward below it).
    ds0 = _fused_state_gradient(spec, (d_scaled0, w_t[0], hidden_of(0), ds_carry0))
    return ds0, outputs, None


def _pallas_forward_loop(spec, geo, w, bias, s0, xproj, z, keep):
    """The saving forward of `pallas`: ONE kernel per micro-layer and step and nothing else.

    The kernels read z, keep and xproj at the step index straight from the whole-sequence
    arrays and write each micro-layer's (input state, pre) into `packed` [T, L, Bp, 3, Np]
    in place (`highway.forward_stacked`), so no per-step slice or store surrounds them.
    Returns (s_last [Bp, Np], packed).
    """
    length, depth = xproj.shape[0], len(w)
    packed = jnp.zeros((length, depth, *s0.shape[:1], 3, s0.shape[1]), s0.dtype)

    def body(carry, _):
        (s, packed), t = carry
        for layer in range(depth):
            s, packed = highway.forward_stacked(
                t, s, w[layer], z, bias[layer], xproj if layer == 0 else None, keep, packed,
                layer=layer, keep=spec.keep, geo=geo, config=spec.kernel,
                interpret=spec.interpret,
            )  # fmt: skip
        return ((s, packed), t + 1), None

    ((s_last, packed), _), _ = jax.lax.scan(body, ((s0, packed), jnp.int32(0)), None, length=length)
    return s_last, packed


def _pallas_backward_loop(spec, geo, w_t, bias, s0, xproj, z, keep, packed, g_states):
    """The reverse loop of `pallas`: ONE kernel per micro-layer and step and nothing else.

    `highway.backward_fused_stacked` reads the layer above's d_scaled, the saved (s, pre),
    z, keep, xproj and g at the step index from the whole-sequence arrays and writes
    d_scaled and dz at (t, l) and the partial bias sums in place. A while loop counting t
    down is the only loop state besides the carried state gradient.
    """
    length, depth = xproj.shape[0], len(w_t)
    b_pad, n_pad = s0.shape
    bias = _per_layer(bias)  # Sliced here, not in every step.
    kernel_args = dict(keep=spec.keep, geo=geo, config=spec.kernel, interpret=spec.interpret)
    init = (
        jnp.zeros_like(s0),
        jnp.zeros((length, depth, b_pad, 2, n_pad), s0.dtype),
        None if z is None else jnp.zeros((length, depth, b_pad, n_pad), s0.dtype),
        jnp.zeros((depth, geo.grid[0], 2, n_pad), s0.dtype),
    )

    def body(carry):
        (ds_carry, d_scaled, dz, da_acc), t = carry
        for layer in reversed(range(depth)):
            d_scaled, ds_carry, dz, da_acc = highway.backward_fused_stacked(
                t, d_scaled, w_t[(layer + 1) % depth], ds_carry, g_states, packed, z,
                bias[layer], xproj if layer == 0 else None, keep, dz, da_acc, layer=layer,
                **kernel_args,
            )  # fmt: skip
        return (ds_carry, d_scaled, dz, da_acc), t - 1

    (ds_carry, d_scaled, dz, da_acc), _ = jax.lax.while_loop(
        lambda carry: carry[1] >= 0, body, (init, jnp.int32(length - 1))
    )
    # The state gradient of s0 through W_0 (no gate backward below it).
    ds0 = highway.state_grad_padded(
        d_scaled[0, 0], w_t[0], ds_carry, geo=geo, config=spec.kernel, interpret=spec.interpret
    )
    outputs = {"d_scaled": d_scaled} if dz is None else {"d_scaled": d_scaled, "dz": dz}
    return ds0, outputs, da_acc


def _prepared_weights(spec, layout, kernel_s, transposed=False) -> tuple[Array, ...]:
    """W_l [L, n, 2n] -> a tuple of L per-layer arrays, padded and cast ONCE per call.

    fused: [Np, 2 * Np] (transposed: [2 * Np, Np]); pallas: [Np, 2, Np] (transposed:
    [2, Np, Np], w_t[h, k, j] = w[j, h * n + k]), the layouts of `kernels/config.py`.
    """
    w = layout.weight(kernel_s, spec.dtype)  # [L, Np, 2, Np]
    n_pad = layout.n_pad
    if spec.impl == "pallas":
        w = jnp.transpose(w, (0, 2, 3, 1)) if transposed else w
    else:
        w = w.reshape(-1, n_pad, 2 * n_pad)
        w = jnp.swapaxes(w, 1, 2) if transposed else w
    return _per_layer(w)


def _per_layer(x: Array) -> tuple[Array, ...]:
    """[L, ...] -> L arrays, sliced once outside the time loops."""
    return tuple(x[layer] for layer in range(x.shape[0]))


def _padded_operands(spec, layout, weights, s0, xproj, z, key_data, hidden_masks):
    """What the loops read besides the weights, padded once: (bias [L, 2, Np] with b_U added
    at layer 0, s0 [Bp, Np], xproj [T, Bp, 2, Np], z, keep [T, L, Bp, Np], hidden)."""
    depth = weights.kernel_s.shape[0]
    bias = layout.bias(weights.bias_s).at[0].add(layout.bias(weights.bias_x))
    keep = None
    if spec.gate_dropout:
        key = jax.random.wrap_key_data(key_data)
        decisions = cells.gate_keeps(
            key, xproj.shape[0], (depth, layout.batch, layout.width), spec.keep, spec.first_step
        )
        keep = layout.rows(decisions.astype(jnp.int8 if spec.impl == "pallas" else jnp.bool_))
    return (
        bias,
        layout.rows(s0),
        layout.halves(xproj),
        layout.rows(z),
        keep,
        layout.rows(hidden_masks),
    )


def _run_forward(spec, weights, s0, xproj, z, key_data, hidden_masks, save: bool):
    """Pads, runs the forward loop: (layout, operands, states [T, L, Bp, Np], packed)."""
    layout = _Layout.make(spec, *s0.shape)
    operands = _padded_operands(spec, layout, weights, s0, xproj, z, key_data, hidden_masks)
    w = _prepared_weights(spec, layout, weights.kernel_s)
    states, packed = _forward_loop(spec, layout.geo, w, *operands, save=save)
    return layout, operands, states, packed


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _sequence(spec, weights, s0, xproj, z, key_data, hidden_masks):
    # Without differentiation nothing is saved for a backward pass.
    layout, _, states, _ = _run_forward(
        spec, weights, s0, xproj, z, key_data, hidden_masks, save=False
    )
    return layout.unrows(states)


def _sequence_fwd(spec, weights, s0, xproj, z, key_data, hidden_masks):
    layout, operands, states, packed = _run_forward(
        spec, weights, s0, xproj, z, key_data, hidden_masks, save=True
    )
    key_zero = None if key_data is None else jnp.zeros(key_data.shape, jax.dtypes.float0)
    return layout.unrows(states), (operands, packed, key_zero, weights)


def _sequence_bwd(spec, residuals, g_states):
    operands, packed, key_zero, weights = residuals
    bias, s0, xproj, z, keep, hidden = operands
    batch, width = g_states.shape[-2:]
    layout = _Layout.make(spec, batch, width)
    w_t = _prepared_weights(spec, layout, weights.kernel_s, transposed=True)
    ds0, outputs, da_acc = _backward_loop(
        spec, layout.geo, w_t, bias, s0, xproj, z, keep, hidden, packed, layout.rows(g_states)
    )
    inputs, saved = _unpack(packed, _saved_rows(spec, z is not None))
    if spec.impl == "pallas":
        d_scaled = outputs["d_scaled"]
        dbias = da_acc.sum(1)  # The stacked backward kernel always accumulates it.
    else:  # d_scaled = da * [z, z], dz and the bias gradient, from the stacked da.
        da = outputs["da"]
        d_scaled = da if z is None else da * z[:, :, :, None]
        dbias = da.sum((0, 2))
        if z is not None:
            outputs = {"dz": jnp.sum(da * saved["full"], axis=-2)}
    # Deferred weight gradient: one [Np, T*Bp] x [T*Bp, 2*Np] matmul per layer.
    matmul_inputs = inputs if hidden is None else inputs * hidden[None]
    dw = jnp.einsum(
        "tlbi,tlbho->liho",
        matmul_inputs.astype(spec.dtype),
        d_scaled.astype(spec.dtype),
        preferred_element_type=cells.accumulation_dtype(spec.dtype),
    )
    dbias = layout.unbias(dbias)
    d_weights = cells.HighwayWeights(
        kernel_x=jnp.zeros_like(weights.kernel_x),
        bias_x=dbias[0],
        kernel_s=layout.unweight(dw),
        bias_s=dbias,
    )
    d_weights = jax.tree_util.tree_map(lambda g, p: g.astype(p.dtype), d_weights, weights)
    dxproj = layout.unhalves(d_scaled[:, 0])
    dz = outputs.get("dz")
    dz = None if dz is None else layout.unrows(dz)
    dhidden = None if hidden is None else jnp.zeros((hidden.shape[0], batch, width), hidden.dtype)
    return d_weights, layout.unrows(ds0), dxproj, dz, key_zero, dhidden


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
      weights: cell parameters (kernel_x is not used: pass `xproj` instead; its gradient is
        zero here and flows through `xproj`).
      s0: [B, n] initial state (float32).
      xproj: [T, B, 2n] input projections `x U` (no bias, unscaled).
      z: [T, L, B, n] hyper scales, or None.
      gate_key: dropout key for gate masks (required when spec.gate_dropout).
      hidden_masks: [L, B, n] variational masks on the matmul input, or None (fused only).
    Returns:
      states [T, L, B, n]: the state after every micro-layer of every step (float32).
    """
    key_data = None if gate_key is None else jax.random.key_data(gate_key)
    if spec.gate_dropout and key_data is None:
        raise ValueError("gate dropout needs a key")
    if spec.impl == "pallas" and hidden_masks is not None:
        raise ValueError("impl 'pallas' has no variational dropout")
    return _sequence(spec, weights, s0, xproj, z, key_data, hidden_masks)
