"""Rank-d hyper scaling of the main cell's weights (Suarez 2017, section 4, eq. 8).

`scaled_matmul` computes y = x W~ per example, W~ = W o sum_i u_i [v_i, v_i]^T, as
sum_i ((x o u_i) W) o [v_i, v_i], without forming W~; its backward forms dW as one matmul
with K = B * d. `highway_step` is the rank-d main cell for `scan`; `lowrank_sequence` the
whole-sequence custom VJP for `fused`. Shapes: x [B, n_in], W [n_in, n_out], u [B, d, n_in],
v [B, d, n_out / k]. Design and init: docs/design.md (rank-d hyper weight updates).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from rhhjax.ops import cells
from rhhjax.ops.sequence_spec import SequenceSpec

Array = jax.Array

OPS = ("custom_vjp", "factored", "materialized")


def _tiles(n_out: int, m: int) -> int:
    if n_out % m:
        raise ValueError(f"output width {n_out} is not a multiple of len(v) = {m}")
    return n_out // m


def _products(x: Array, w: Array, u: Array, dtype) -> Array:
    """X_u W: x [B, n_in], u [B, d, n_in] -> [B, d, n_out] (one [B*d, n_in] matmul)."""
    batch, rank, n_in = u.shape
    xu = (x[:, None, :] * u).reshape(batch * rank, n_in)
    return cells.matmul(xu, w, dtype).reshape(batch, rank, -1)


def _apply_v(products: Array, v: Array) -> Array:
    """sum_i products_i o tile(v_i): [B, d, n_out], [B, d, m] -> [B, n_out]."""
    batch, rank, n_out = products.shape
    m = v.shape[-1]
    k = _tiles(n_out, m)
    scaled = products.reshape(batch, rank, k, m) * v[:, :, None, :]
    return jnp.sum(scaled, axis=1).reshape(batch, n_out)


def _forward(x: Array, w: Array, u: Array, v: Array, dtype) -> Array:
    return _apply_v(_products(x, w, u, dtype), v)


def _backward(x: Array, w: Array, u: Array, v: Array, dy: Array, dtype):
    """(dx, dw, du, dv) of `_forward`, recomputing X_u W from x, u, v, W."""
    batch, rank, n_in = u.shape
    n_out = w.shape[1]
    m = v.shape[-1]
    k = _tiles(n_out, m)
    acc = cells.accumulation_dtype(dtype)
    xu = (x[:, None, :] * u).reshape(batch * rank, n_in)
    dy4 = dy.reshape(batch, 1, k, m)
    dyv = (dy4 * v[:, :, None, :]).reshape(batch * rank, n_out)
    # dW for the whole batch: one matmul, K = B * d.
    dw = jnp.einsum("ki,ko->io", xu.astype(dtype), dyv.astype(dtype), preferred_element_type=acc)
    dxu = cells.matmul(dyv, w.T, dtype).reshape(batch, rank, n_in)
    dx = jnp.sum(dxu * u, axis=1)
    du = dxu * x[:, None, :]
    products = cells.matmul(xu, w, dtype).reshape(batch, rank, k, m)  # recomputed
    dv = jnp.sum(products * dy4, axis=2)
    return dx, dw, du, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _scaled_matmul_vjp(x, w, u, v, dtype):
    return _forward(x, w, u, v, dtype)


def _scaled_matmul_fwd(x, w, u, v, dtype):
    return _forward(x, w, u, v, dtype), (x, w, u, v)


def _scaled_matmul_bwd(dtype, residuals, dy):
    x, w, u, v = residuals
    dx, dw, du, dv = _backward(x, w, u, v, dy, dtype)
    return dx.astype(x.dtype), dw.astype(w.dtype), du.astype(u.dtype), dv.astype(v.dtype)


_scaled_matmul_vjp.defvjp(_scaled_matmul_fwd, _scaled_matmul_bwd)


def _materialized(x: Array, w: Array, u: Array, v: Array, dtype) -> Array:
    """The reference: W~ [B, n_in, n_out] per example, then a batched matvec."""
    n_out = w.shape[1]
    v_full = jnp.tile(v, (1, 1, _tiles(n_out, v.shape[-1])))  # [v, v, ...]
    w_tilde = w[None] * jnp.einsum("bdi,bdo->bio", u, v_full)
    return jnp.einsum(
        "bi,bio->bo",
        x.astype(dtype),
        w_tilde.astype(dtype),
        preferred_element_type=cells.accumulation_dtype(dtype),
    )


def materialized_size(batch: int, n_in: int, n_out: int, itemsize: int = 4) -> int:
    return batch * n_in * n_out * itemsize


def scaled_matmul(
    x: Array, w: Array, u: Array, v: Array, dtype: Any = jnp.float32, op: str = "custom_vjp"
) -> Array:
    """y = x W~ per example without forming W~: x [..., n_in], w [n_in, n_out], u
    [..., d, n_in], v [..., d, m] (column j scaled by v[j mod m]) -> [..., n_out]."""
    if op not in OPS:
        raise ValueError(f"op {op!r} is not one of {OPS}")
    dtype = jnp.dtype(dtype)
    lead = x.shape[:-1]
    if u.shape[:-2] != lead or v.shape[:-2] != lead or u.shape[-2] != v.shape[-2]:
        raise ValueError(f"shapes do not match: x {x.shape}, u {u.shape}, v {v.shape}")
    x2 = x.reshape(-1, x.shape[-1])
    u3 = u.reshape(-1, *u.shape[-2:])
    v3 = v.reshape(-1, *v.shape[-2:])
    if op == "custom_vjp":
        y = _scaled_matmul_vjp(x2, w, u3, v3, dtype)
    elif op == "factored":
        y = _forward(x2, w, u3, v3, dtype)
    else:
        y = _materialized(x2, w, u3, v3, dtype)
    return y.reshape(*lead, w.shape[1])


class LowRankScales(NamedTuple):
    """Rank-d hyper projections (Flax names): u_kernel [L, h, d, n], u_bias [L, d, n],
    v_kernel [L, h, d, n], v_bias [L, d, n], u_x_kernel [h, d, E], u_x_bias [d, E]."""

    u_kernel: Array
    u_bias: Array
    v_kernel: Array
    v_bias: Array
    u_x_kernel: Array
    u_x_bias: Array


def rank_stacked(init: Callable[..., Array]) -> Callable[..., Array]:
    """Init of a [L, h, d, m] kernel: ``init`` on every [h, m] slice independently."""

    def stacked_init(key, shape, dtype=jnp.float32):
        depth, h, rank, m = shape
        keys = jax.random.split(key, depth * rank)
        slices = jax.vmap(lambda k: init(k, (h, m), dtype))(keys)  # [L*d, h, m]
        return jnp.transpose(slices.reshape(depth, rank, h, m), (0, 2, 1, 3))

    return stacked_init


def u_bias_init(rank: int) -> Callable[..., Array]:
    """Constant 1/sqrt(d), so that sum_i u_i v_i^T starts as a column scaling."""
    return jax.nn.initializers.constant(1.0 / math.sqrt(rank))


def declare_params(
    module,
    depth: int,
    hyper: int,
    width: int,
    embed: int,
    rank: int,
    v_kernel_init: Callable[..., Array],
    v_bias_init: Callable[..., Array],
) -> LowRankScales:
    """Declares the rank-d parameters on a Flax module (from `setup`); the v inits are the
    paper's of P and p."""
    zeros = jax.nn.initializers.zeros
    return LowRankScales(
        u_kernel=module.param("u_kernel", zeros, (depth, hyper, rank, width)),
        u_bias=module.param("u_bias", u_bias_init(rank), (depth, rank, width)),
        v_kernel=module.param("v_kernel", rank_stacked(v_kernel_init), (depth, hyper, rank, width)),
        v_bias=module.param("v_bias", v_bias_init, (depth, rank, width)),
        u_x_kernel=module.param("u_x_kernel", zeros, (hyper, rank, embed)),
        u_x_bias=module.param("u_x_bias", u_bias_init(rank), (rank, embed)),
    )


def paper_equivalent_scales(proj_kernel: Array, proj_bias: Array, embed: int) -> LowRankScales:
    """Rank-1 parameters equal to the paper's column scaling: u = 1, v = z = s_h P + p."""
    depth, hyper, width = proj_kernel.shape
    dtype = proj_kernel.dtype
    return LowRankScales(
        u_kernel=jnp.zeros((depth, hyper, 1, width), dtype),
        u_bias=jnp.ones((depth, 1, width), dtype),
        v_kernel=proj_kernel[:, :, None, :],
        v_bias=proj_bias[:, None, :],
        u_x_kernel=jnp.zeros((hyper, 1, embed), dtype),
        u_x_bias=jnp.ones((1, embed), dtype),
    )


def project(kernel: Array, bias: Array, s_h: Array, dtype: Any) -> Array:
    """Factors from a hyper state: kernel [h, d, m], bias [d, m], s_h [B, h] -> [B, d, m]."""
    hyper = kernel.shape[0]
    out = jnp.matmul(
        s_h.astype(dtype),
        kernel.reshape(hyper, -1).astype(dtype),
        preferred_element_type=cells.accumulation_dtype(dtype),
    )
    return out.reshape(s_h.shape[0], *bias.shape) + bias


def _layer_matmul(
    s_in, w_l, s_h, u_kernel, u_bias, v_kernel, v_bias, x, w_x, ux_kernel, ux_bias, *, dtype, op
):
    """s_in W~_l (+ x U~ at layer 0, when x is given): [B, 2n] float32, no biases."""
    u = project(u_kernel, u_bias, s_h, dtype)
    v = project(v_kernel, v_bias, s_h, dtype)
    a = scaled_matmul(s_in, w_l, u, v, dtype, op)
    if x is not None:
        a = a + scaled_matmul(x, w_x, project(ux_kernel, ux_bias, s_h, dtype), v, dtype, op)
    return a


def highway_step(
    weights: cells.HighwayWeights,
    scales: LowRankScales,
    s: Array,
    x: Array,
    hyper_layer_states: Array,
    gate_masks: Array | None,
    hidden_masks: Array | None,
    dtype: Any = jnp.float32,
    op: str = "custom_vjp",
    remat: bool = True,
    bias0_scale: Array | None = None,
) -> tuple[Array, Array, Array]:
    """One step of the rank-d main cell: s [B, n], x [B, E] (not projected),
    hyper_layer_states [L, B, h] -> (s_new [B, n], layer_states, gates [L, B, n])."""
    dtype = jnp.dtype(dtype)
    layer_fn = functools.partial(_layer_matmul, dtype=dtype, op=op)
    if remat:
        layer_fn = jax.checkpoint(layer_fn)
    depth = weights.kernel_s.shape[0]
    states, gates = [], []
    for layer in range(depth):
        s_in = s if hidden_masks is None else s * hidden_masks[layer]
        first = layer == 0
        a = layer_fn(
            s_in,
            weights.kernel_s[layer],
            hyper_layer_states[layer],
            scales.u_kernel[layer],
            scales.u_bias[layer],
            scales.v_kernel[layer],
            scales.v_bias[layer],
            x if first else None,
            weights.kernel_x if first else None,
            scales.u_x_kernel if first else None,
            scales.u_x_bias if first else None,
        )
        a = a + cells.layer_bias(weights, layer, bias0_scale)
        gates.append(cells.transform_gate(a))
        s = cells.highway_gate(a, s, None if gate_masks is None else gate_masks[layer])
        states.append(s)
    return s, jnp.stack(states), jnp.stack(gates)


def _matmul_weights(weights: cells.HighwayWeights, dtype) -> tuple[list[Array], Array]:
    kernel_s = weights.kernel_s.astype(dtype)
    return [kernel_s[layer] for layer in range(kernel_s.shape[0])], weights.kernel_x.astype(dtype)


def _run_forward(spec, weights, scales, s0, x, hyper_states, key_data, hidden_masks):
    """Forward over all steps: (states [T, L, B, n], gates {h, t}, keep)."""
    depth = weights.kernel_s.shape[0]
    batch, width = s0.shape
    dtype = spec.dtype
    keep = None
    if spec.gate_dropout:
        key = jax.random.wrap_key_data(key_data)
        keep = cells.gate_keeps(key, x.shape[0], (depth, batch, width), spec.keep, spec.first_step)
    kernel_s, kernel_x = _matmul_weights(weights, dtype)

    def body(s, inputs):
        x_t, hyper_t, keep_t = inputs
        masks = _layer_masks(spec, keep_t, depth)
        states, hs, ts = [], [], []
        for layer in range(depth):
            s_in = s if hidden_masks is None else s * hidden_masks[layer]
            s_h = hyper_t[layer]
            u = project(scales.u_kernel[layer], scales.u_bias[layer], s_h, dtype)
            v = project(scales.v_kernel[layer], scales.v_bias[layer], s_h, dtype)
            a = _forward(s_in, kernel_s[layer], u, v, dtype) + weights.bias_s[layer]
            if layer == 0:
                u_x = project(scales.u_x_kernel, scales.u_x_bias, s_h, dtype)
                a = a + _forward(x_t, kernel_x, u_x, v, dtype) + weights.bias_x
            h = jnp.tanh(a[..., :width])
            t = jax.nn.sigmoid(a[..., width:])
            t_used = t if masks[layer] is None else t * masks[layer]
            s = h * t_used + s * (1.0 - t)
            states.append(s)
            hs.append(h)
            ts.append(t)
        return s, (jnp.stack(states), jnp.stack(hs), jnp.stack(ts))

    _, (states, hs, ts) = jax.lax.scan(body, s0, (x, hyper_states, keep))
    return states, {"h": hs, "t": ts}, keep


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _sequence(spec, weights, scales, s0, x, hyper_states, key_data, hidden_masks):
    return _run_forward(spec, weights, scales, s0, x, hyper_states, key_data, hidden_masks)[0]


def _sequence_fwd(spec, weights, scales, s0, x, hyper_states, key_data, hidden_masks):
    states, gates, keep = _run_forward(
        spec, weights, scales, s0, x, hyper_states, key_data, hidden_masks
    )
    key_zero = None if key_data is None else jnp.zeros(key_data.shape, jax.dtypes.float0)
    residuals = (weights, scales, s0, x, hyper_states, key_zero, hidden_masks, states, gates)
    return states, (residuals, keep)


def _project_backward(kernel, s_h, d_factor, dtype):
    """`project`'s gradients for d_factor [B, d, m]: (dkernel [h, d, m], dbias, ds_h)."""
    acc = cells.accumulation_dtype(dtype)
    hyper = kernel.shape[0]
    flat = d_factor.reshape(d_factor.shape[0], -1)
    dkernel = jnp.einsum(
        "bh,bk->hk", s_h.astype(dtype), flat.astype(dtype), preferred_element_type=acc
    ).reshape(kernel.shape)
    ds_h = cells.matmul(flat, kernel.reshape(hyper, -1).T, dtype)
    return dkernel, jnp.sum(d_factor, axis=0), ds_h


def _layer_masks(spec, keep_t: Array | None, depth: int) -> list[Array | None]:
    if keep_t is None:
        return [None] * depth
    return [keep_t[layer].astype(jnp.float32) / spec.keep for layer in range(depth)]


def _sequence_bwd(spec, saved, g_states):
    residuals, keep = saved
    weights, scales, s0, x, hyper_states, key_zero, hidden_masks, states, gates = residuals
    depth = weights.kernel_s.shape[0]
    dtype = spec.dtype
    kernel_s, kernel_x = _matmul_weights(weights, dtype)
    previous_step = jnp.concatenate([s0[None], states[:-1, -1]], axis=0)
    inputs = jnp.concatenate([previous_step[:, None], states[:, :-1]], axis=1)

    def add(a, b):
        return jax.tree_util.tree_map(jnp.add, a, b)

    def body(carry, xs):
        ds, grads = carry
        x_t, hyper_t, keep_t, inputs_t, h_t, t_t, g_t = xs
        masks = _layer_masks(spec, keep_t, depth)
        d_hyper = [None] * depth
        dw, dbias_s, du_k, du_b, dv_k, dv_b = ([None] * depth for _ in range(6))
        dx_t = d_kernel_x = d_bias_x = d_ux_k = d_ux_b = None
        for layer in reversed(range(depth)):
            ds = ds + g_t[layer]
            s_prev = inputs_t[layer]
            da, ds_carry = cells.gate_backward(ds, s_prev, h_t[layer], t_t[layer], masks[layer])
            s_in = s_prev if hidden_masks is None else s_prev * hidden_masks[layer]
            s_h = hyper_t[layer]
            u = project(scales.u_kernel[layer], scales.u_bias[layer], s_h, dtype)
            v = project(scales.v_kernel[layer], scales.v_bias[layer], s_h, dtype)
            ds_in, dw[layer], du, dv = _backward(s_in, kernel_s[layer], u, v, da, dtype)
            dbias_s[layer] = jnp.sum(da, axis=0)
            if hidden_masks is not None:
                ds_in = ds_in * hidden_masks[layer]
            ds = ds_carry + ds_in
            if layer == 0:
                u_x = project(scales.u_x_kernel, scales.u_x_bias, s_h, dtype)
                dx_t, d_kernel_x, du_x, dv_x = _backward(x_t, kernel_x, u_x, v, da, dtype)
                dv = dv + dv_x
                d_bias_x = dbias_s[0]
                d_ux_k, d_ux_b, dsh_x = _project_backward(scales.u_x_kernel, s_h, du_x, dtype)
            du_k[layer], du_b[layer], dsh_u = _project_backward(
                scales.u_kernel[layer], s_h, du, dtype
            )
            dv_k[layer], dv_b[layer], dsh_v = _project_backward(
                scales.v_kernel[layer], s_h, dv, dtype
            )
            d_hyper[layer] = dsh_u + dsh_v + (dsh_x if layer == 0 else 0.0)
        step_grads = (
            cells.HighwayWeights(d_kernel_x, d_bias_x, jnp.stack(dw), jnp.stack(dbias_s)),
            LowRankScales(
                jnp.stack(du_k), jnp.stack(du_b), jnp.stack(dv_k), jnp.stack(dv_b), d_ux_k, d_ux_b
            ),
        )
        return (ds, add(grads, step_grads)), (dx_t, jnp.stack(d_hyper))

    zeros = jax.tree_util.tree_map(
        lambda a: jnp.zeros(a.shape, cells.accumulation_dtype(dtype)), (weights, scales)
    )
    xs = (x, hyper_states, keep, inputs, gates["h"], gates["t"], g_states)
    (ds0, (d_weights, d_scales)), (dx, d_hyper) = jax.lax.scan(
        body, (jnp.zeros_like(s0), zeros), xs, reverse=True
    )
    d_weights = jax.tree_util.tree_map(lambda g, p: g.astype(p.dtype), d_weights, weights)
    d_scales = jax.tree_util.tree_map(lambda g, p: g.astype(p.dtype), d_scales, scales)
    dhidden = None if hidden_masks is None else jnp.zeros_like(hidden_masks)
    return (
        d_weights,
        d_scales,
        ds0.astype(s0.dtype),
        dx.astype(x.dtype),
        d_hyper.astype(hyper_states.dtype),
        key_zero,
        dhidden,
    )


_sequence.defvjp(_sequence_fwd, _sequence_bwd)


def lowrank_sequence(
    spec: SequenceSpec,
    weights: cells.HighwayWeights,
    scales: LowRankScales,
    s0: Array,
    x: Array,
    hyper_states: Array,
    gate_key: Array | None,
    hidden_masks: Array | None,
) -> Array:
    """The rank-d main recurrence as one custom VJP: s0 [B, n], x [T, B, E], hyper_states
    [T, L, B, h] -> states [T, L, B, n]; u, v are recomputed in the backward."""
    key_data = None if gate_key is None else jax.random.key_data(gate_key)
    if spec.gate_dropout and key_data is None:
        raise ValueError("gate dropout needs a key")
    return _sequence(spec, weights, scales, s0, x, hyper_states, key_data, hidden_masks)
