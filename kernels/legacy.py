"""Legacy unpadded highway step: forward, backward and a custom VJP, with references.

:func:`highway_forward` and :func:`highway_backward` pad and unpad per call around
:func:`rhhjax.kernels.forward.forward_padded` and :func:`rhhjax.kernels.backward.backward_padded`
(so do not use them inside a time loop); :func:`highway_step` is the differentiable step
(``jax.custom_vjp``: the two kernels plus XLA dots for ``ds`` and ``dw``). Legacy semantics:
``a = pre * [z, z] + bias + extra`` (``extra`` outside the scale, no ``xproj``) and an f32
mask (0 or 1/keep).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from rhhjax.kernels.backward import backward_padded
from rhhjax.kernels.common import (
    F32,
    dot_precision,
)
from rhhjax.kernels.config import DEFAULT_CONFIG, Geometry, HighwayConfig
from rhhjax.kernels.forward import forward_padded


def _check_shapes(s, w, z, bias, extra, mask) -> tuple[int, int]:
    if s.ndim != 2:
        raise ValueError(f"s must be [B, n], got shape {s.shape}.")
    batch, n = s.shape
    if w.shape != (n, 2 * n):
        raise ValueError(f"w must be [n, 2n] = {(n, 2 * n)}, got {w.shape}.")
    if bias.shape != (2 * n,):
        raise ValueError(f"bias must be [2n] = {(2 * n,)}, got {bias.shape}.")
    for name, x, shape in (
        ("z", z, (batch, n)),
        ("extra", extra, (batch, 2 * n)),
        ("mask", mask, (batch, n)),
    ):
        if x is not None and x.shape != shape:
            raise ValueError(f"{name} must be {shape}, got {x.shape}.")
    return batch, n


def _pad_opt_rows(x, geo):
    return None if x is None else geo.pad_rows(x.astype(F32))


def _pad_opt_halves(x, geo):
    return None if x is None else geo.pad_halves(x)


@functools.partial(jax.jit, static_argnames=("config", "interpret"))
def highway_forward(
    s: jax.Array,
    w: jax.Array,
    z: jax.Array | None,
    bias: jax.Array,
    extra: jax.Array | None,
    mask: jax.Array | None,
    *,
    config: HighwayConfig = DEFAULT_CONFIG,
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """Fused highway step (legacy API). Returns ``(s_new [B, n] f32, pre [B, 2n] f32)``.

    ``a = pre * [z, z] + bias + extra`` (``extra`` is added *outside* the scale here).
    ``pre = s @ w`` is the unscaled matmul output (saved for ``dz`` in the backward pass).
    ``z``, ``extra`` and ``mask`` (f32, 0 or 1/keep) may be None. Pads and unpads per call:
    inside a time loop use :func:`forward_padded`.
    """
    batch, n = _check_shapes(s, w, z, bias, extra, mask)
    geo = Geometry.make(config, batch, n)
    s_new, pre = forward_padded(
        geo.pad_rows(s.astype(F32)),
        geo.pad_weight(w, w.dtype),
        _pad_opt_rows(z, geo),
        geo.pad_bias(bias),
        None,
        _pad_opt_rows(mask, geo),
        geo=geo,
        config=config,
        interpret=interpret,
        extra=_pad_opt_halves(extra, geo),
    )
    return geo.unpad_rows(s_new), geo.unpad_halves(pre)


@functools.partial(jax.jit, static_argnames=("config", "interpret"))
def highway_backward(
    ds_new: jax.Array,
    s: jax.Array,
    pre: jax.Array,
    z: jax.Array | None,
    bias: jax.Array,
    extra: jax.Array | None,
    mask: jax.Array | None,
    *,
    config: HighwayConfig = DEFAULT_CONFIG,
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    """Backward of the gates (legacy API). Returns ``(da [B, 2n], ds_carry [B, n], dz [B, n] |
    None)``, f32.

    ``da`` is the cotangent of ``a = pre * [z, z] + bias + extra``; ``ds_carry`` the part of
    ``ds`` through the carry term ``s * (1 - t)``; ``dz = sum of halves of da * pre``.
    """
    batch, n = s.shape
    if ds_new.shape != (batch, n) or pre.shape != (batch, 2 * n):
        raise ValueError(
            f"ds_new must be {(batch, n)} and pre {(batch, 2 * n)}, "
            f"got {ds_new.shape} and {pre.shape}."
        )
    _check_shapes(s, jax.ShapeDtypeStruct((n, 2 * n), F32), z, bias, extra, mask)
    geo = Geometry.make(config, batch, n)
    da, ds_carry, dz, _ = backward_padded(
        geo.pad_rows(ds_new.astype(F32)),
        geo.pad_rows(s.astype(F32)),
        geo.pad_halves(pre),
        _pad_opt_rows(z, geo),
        geo.pad_bias(bias),
        None,
        _pad_opt_rows(mask, geo),
        geo=geo,
        config=config,
        interpret=interpret,
        extra=_pad_opt_halves(extra, geo),
        scale_da=False,
    )
    return (
        geo.unpad_halves(da),
        geo.unpad_rows(ds_carry),
        None if dz is None else geo.unpad_rows(dz),
    )


# --- custom_vjp (legacy) -----------------------------------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _highway_step(config, interpret, s, w, z, bias, extra, mask):
    s_new, _ = highway_forward(s, w, z, bias, extra, mask, config=config, interpret=interpret)
    return s_new


def _highway_step_fwd(config, interpret, s, w, z, bias, extra, mask):
    s_new, pre = highway_forward(s, w, z, bias, extra, mask, config=config, interpret=interpret)
    return s_new, (s, w, z, bias, extra, mask, pre)


def _highway_step_bwd(config, interpret, res, ds_new):
    s, w, z, bias, extra, mask, pre = res
    da, ds_carry, dz = highway_backward(
        ds_new, s, pre, z, bias, extra, mask, config=config, interpret=interpret
    )
    d_pre = da if z is None else da * jnp.tile(z.astype(F32), (1, 2))
    precision = dot_precision(w.dtype, config.allow_tf32)
    d_pre_c = d_pre.astype(w.dtype)
    # ds = ds_carry + d_pre @ w.T ; dw = s.T @ d_pre, both with f32 accumulation.
    ds = ds_carry + lax.dot_general(
        d_pre_c, w, (((1,), (1,)), ((), ())), precision=precision, preferred_element_type=F32
    )
    dw = lax.dot_general(
        s.astype(w.dtype),
        d_pre_c,
        (((0,), (0,)), ((), ())),
        precision=precision,
        preferred_element_type=F32,
    )
    dbias = jnp.sum(da, axis=0)
    dz_out = None if z is None else dz.astype(z.dtype)
    dextra = None if extra is None else da.astype(extra.dtype)
    dmask = None
    if mask is not None:
        # d s_new / d mask = h * t. Computed by XLA from `pre`; dead code (and eliminated under
        # jit) unless someone actually differentiates with respect to the mask.
        h, t = _gates(pre, z, bias, extra)
        dmask = (ds_new * h * t).astype(mask.dtype)
    return (
        ds.astype(s.dtype),
        dw.astype(w.dtype),
        dz_out,
        dbias.astype(bias.dtype),
        dextra,
        dmask,
    )


_highway_step.defvjp(_highway_step_fwd, _highway_step_bwd)


def highway_step(
    s: jax.Array,
    w: jax.Array,
    z: jax.Array | None,
    bias: jax.Array,
    extra: jax.Array | None,
    mask: jax.Array | None,
    *,
    config: HighwayConfig = DEFAULT_CONFIG,
    interpret: bool = False,
) -> jax.Array:
    """Differentiable fused highway step (legacy API); returns ``s_new [B, n] f32``.

    Gradients flow to ``s``, ``w``, ``z``, ``bias``, ``extra`` (and ``mask``). The forward
    and the gate backward are Triton kernels; ``d_pre @ w.T`` and ``s.T @ d_pre`` are XLA dots
    with f32 accumulation whose inputs are cast to ``w.dtype`` (so with bf16 weights, ``d_pre``
    is rounded to bf16 for them, and ``dw`` is returned in bf16).
    """
    return _highway_step(config, interpret, s, w, z, bias, extra, mask)


# --- legacy references -------------------------------------------------------------------------


def _preactivation(pre, z, bias, extra):
    a = pre if z is None else pre * jnp.tile(z.astype(F32), (1, 2))
    a = a + bias.astype(F32)
    if extra is not None:
        a = a + extra.astype(F32)
    return a


def _gates(pre, z, bias, extra):
    n = pre.shape[-1] // 2
    a = _preactivation(pre, z, bias, extra)
    return jnp.tanh(a[:, :n]), jax.nn.sigmoid(a[:, n:])


def _combine(a, s, mask):
    n = s.shape[-1]
    h, t = jnp.tanh(a[:, :n]), jax.nn.sigmoid(a[:, n:])
    gate = t if mask is None else t * mask.astype(F32)
    return h * gate + s.astype(F32) * (1.0 - t)


def _reference_matmul(s, w):
    return jnp.dot(
        s.astype(w.dtype),
        w,
        precision=dot_precision(w.dtype, allow_tf32=False),
        preferred_element_type=F32,
    )


def highway_forward_reference(s, w, z, bias, extra, mask) -> tuple[jax.Array, jax.Array]:
    """Pure-jnp :func:`highway_forward`: ``(s_new, pre)``."""
    pre = _reference_matmul(s, w)
    return _combine(_preactivation(pre, z, bias, extra), s, mask), pre


def highway_backward_reference(ds_new, s, pre, z, bias, extra, mask):
    """Pure-jnp :func:`highway_backward`, derived by autodiff of the combine."""
    n = s.shape[-1]
    a = _preactivation(pre, z, bias, extra)
    _, vjp = jax.vjp(lambda a_, s_: _combine(a_, s_, mask), a, s.astype(F32))
    da, ds_carry = vjp(ds_new.astype(F32))
    dz = None if z is None else da[:, :n] * pre[:, :n] + da[:, n:] * pre[:, n:]
    return da, ds_carry, dz


def highway_step_reference(s, w, z, bias, extra, mask) -> jax.Array:
    """Pure-jnp highway step (differentiate it with plain autodiff)."""
    return highway_forward_reference(s, w, z, bias, extra, mask)[0]
