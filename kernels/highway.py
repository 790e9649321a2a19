"""Fused highway micro-layer step (Recurrent Highway Networks), Pallas Triton kernels.

One highway micro-layer step, with ``B`` the batch and ``n`` the number of units::

    s     [B, n]   f32        carry
    w     [n, 2n]  f32 | bf16 recurrent weight; columns [:n] feed h, columns [n:] feed t
    z     [B, n]   f32 | None per-example column scale (HyperRHN); the same z scales both halves
    bias  [2n]     f32
    extra [B, 2n]  f32 | None addend computed outside (e.g. the input projection at layer 0)
    mask  [B, n]   f32 | None inverted-dropout mask on the transform gate (0 or 1/keep)

    pre   = s @ w                        [B, 2n]  f32 accumulation (s cast to w.dtype for the dot)
    a     = pre * [z, z] + bias + extra  [B, 2n]
    h     = tanh(a[:, :n])
    t     = sigmoid(a[:, n:])
    s_new = h * (t * mask) + s * (1 - t) [B, n]   the carry gate uses the *undropped* t

All gate arithmetic and all outputs are f32 whatever the dtype of ``w``.

Public API:

* :class:`HighwayConfig` -- block sizes and Triton launch parameters.
* :func:`highway_forward` -- one Triton kernel: matmul for both halves of a column block,
  scale, bias, extra, gates and the highway combine. Returns ``(s_new, pre)``.
* :func:`highway_backward` -- elementwise Triton kernel: ``(da, ds_carry, dz)``.
* :func:`highway_step` -- ``jax.custom_vjp`` over the two; the weight-side matmuls of the
  backward pass (``d_pre @ w.T`` and ``s.T @ d_pre``) are left to XLA.
* :func:`highway_forward_reference`, :func:`highway_backward_reference`,
  :func:`highway_step_reference` -- pure ``jax.numpy`` versions for testing.

The Triton backend is selected explicitly by passing
``jax.experimental.pallas.triton.CompilerParams`` to ``pl.pallas_call``; without it, recent JAX
versions lower GPU ``pallas_call`` through Mosaic GPU (``jax_pallas_use_mosaic_gpu``), which
cannot lower these kernels.

Layout inside the kernels: ``B`` is padded up to a multiple of ``block_b`` and ``n`` up to a
multiple of ``block_n`` and ``block_k`` with zeros, outside the kernels. Arrays with two halves
(``w``, ``bias``, ``extra``, ``pre``, ``da``) are viewed as ``[..., 2, n]`` and padded per half,
so that the h and t halves stay aligned: unit ``u`` of the t half lives at column
``n_pad + u`` of the padded 2-D array. Padded units have zero weights, bias and input, hence
``s_new = tanh(0) * t + 0 * (1 - t) = 0`` there; padded batch rows are discarded.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

# The Triton compiler-params class was called `TritonCompilerParams` in older JAX versions.
_TritonCompilerParams = getattr(plgpu, "CompilerParams", None) or plgpu.TritonCompilerParams

_F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class HighwayConfig:
    """Tuning knobs of the highway kernels.

    Attributes:
      block_b: rows (batch) per program. Power of two, >= 16 (the M dim of ``tl.dot``).
      block_n: units per program; each program computes both the h and the t column block.
        Power of two, >= 16.
      block_k: K chunk of the matmul loop. Power of two, >= 16 (``tl.dot`` minimum).
      num_warps: Triton warps per program.
      num_stages: Triton software-pipelining stages of the K loop.
      allow_tf32: when ``w`` is f32, let the kernel and the backward matmuls use TF32 tensor
        cores (faster, ~1e-3 relative error). Default: exact f32 (``Precision.HIGHEST``).
        Ignored for bf16 weights.

    The defaults target n = 1000..1024, B = 256 on an H100: a (4, 32) grid of 128 programs,
    about one per SM. The block sizes are clamped down for small problems (never below 16).
    """

    block_b: int = 64
    block_n: int = 32
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3
    allow_tf32: bool = False


def _is_pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


def _validate_config(config: HighwayConfig) -> None:
    """Rejects configurations that Triton cannot lower, with a readable message."""
    for name in ("block_b", "block_n", "block_k"):
        value = getattr(config, name)
        if not _is_pow2(value) or value < 16:
            raise ValueError(f"HighwayConfig.{name} must be a power of two >= 16, got {value}.")
    if not _is_pow2(config.num_warps):
        raise ValueError(f"HighwayConfig.num_warps must be a power of two, got {config.num_warps}.")
    if config.num_stages < 1:
        raise ValueError(f"HighwayConfig.num_stages must be >= 1, got {config.num_stages}.")


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _clamp_block(block: int, size: int) -> int:
    """Shrinks a block to the next power of two >= size (but never below 16)."""
    return min(block, max(16, pl.next_power_of_2(size)))


@dataclasses.dataclass(frozen=True)
class _Geometry:
    """Effective block sizes and padded extents for one problem size."""

    block_b: int
    block_n: int
    block_k: int
    b_pad: int
    n_pad: int

    @classmethod
    def make(cls, config: HighwayConfig, batch: int, n: int) -> _Geometry:
        block_b = _clamp_block(config.block_b, batch)
        block_n = _clamp_block(config.block_n, n)
        block_k = _clamp_block(config.block_k, n)
        return cls(
            block_b=block_b,
            block_n=block_n,
            block_k=block_k,
            b_pad=_round_up(batch, block_b),
            n_pad=_round_up(n, math.lcm(block_n, block_k)),
        )

    @property
    def grid(self) -> tuple[int, int]:
        return (self.b_pad // self.block_b, self.n_pad // self.block_n)


def _compiler_params(config: HighwayConfig):
    return _TritonCompilerParams(num_warps=config.num_warps, num_stages=config.num_stages)


def _dot_precision(dtype, allow_tf32: bool):
    if jnp.dtype(dtype) == jnp.float32 and not allow_tf32:
        return lax.Precision.HIGHEST
    return None


# --- padding helpers (outside the kernels) ----------------------------------------------------


def _pad_to(x: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    widths = [(0, target - size) for size, target in zip(x.shape, shape, strict=True)]
    if all(hi == 0 for _, hi in widths):
        return x
    return jnp.pad(x, widths)


def _halves(x: jax.Array, n: int) -> jax.Array:
    """[..., 2n] -> [..., 2, n] (a free reshape)."""
    return x.reshape(*x.shape[:-1], 2, n)


def _pad_rows(x: jax.Array | None, geo: _Geometry) -> jax.Array | None:
    """[B, n] -> [b_pad, n_pad] f32."""
    if x is None:
        return None
    return _pad_to(x.astype(_F32), (geo.b_pad, geo.n_pad))


def _pad_halves_rows(x: jax.Array | None, n: int, geo: _Geometry) -> jax.Array | None:
    """[B, 2n] -> [b_pad, 2, n_pad] f32."""
    if x is None:
        return None
    return _pad_to(_halves(x.astype(_F32), n), (geo.b_pad, 2, geo.n_pad))


def _unpad_halves(x: jax.Array, batch: int, n: int) -> jax.Array:
    """[b_pad, 2, n_pad] -> [B, 2n]."""
    return x[:batch, :, :n].reshape(batch, 2 * n)


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


# --- forward kernel ----------------------------------------------------------------------------


def _gates_in_kernel(pre_h, pre_t, z_ref, bias_ref, extra_ref):
    """h, t [block_b, block_n] from the unscaled matmul halves, inside a kernel.

    a = pre * [z, z] + bias + extra (z_ref / extra_ref None when absent).
    """
    a_h, a_t = pre_h, pre_t
    if z_ref is not None:
        z = z_ref[...]
        a_h, a_t = a_h * z, a_t * z
    a_h += bias_ref[0, :][None, :]
    a_t += bias_ref[1, :][None, :]
    if extra_ref is not None:
        a_h += extra_ref[:, 0, :]
        a_t += extra_ref[:, 1, :]
    return jnp.tanh(a_h), jax.nn.sigmoid(a_t)


def _highway_forward_kernel(
    *refs,
    has_z: bool,
    has_extra: bool,
    has_mask: bool,
    block_k: int,
    precision,
):
    """One (batch block, unit block) program.

    Refs (block shapes):
      s_ref      [block_b, n_pad]       whole rows of the carry (K operand and carry term)
      w_h_ref    [n_pad, block_n]       h-half columns of w
      w_t_ref    [n_pad, block_n]       t-half columns of w
      bias_ref   [2, block_n]
      z_ref      [block_b, block_n]     if has_z
      extra_ref  [block_b, 2, block_n]  if has_extra
      mask_ref   [block_b, block_n]     if has_mask
      s_new_ref  [block_b, block_n]     output
      pre_ref    [block_b, 2, block_n]  output: unscaled s @ w
    """
    refs = list(refs)
    s_ref, w_h_ref, w_t_ref, bias_ref = refs[:4]
    del refs[:4]
    z_ref = refs.pop(0) if has_z else None
    extra_ref = refs.pop(0) if has_extra else None
    mask_ref = refs.pop(0) if has_mask else None
    s_new_ref, pre_ref = refs

    block_b, block_n = s_new_ref.shape
    n_pad = s_ref.shape[1]
    dot_dtype = w_h_ref.dtype

    def k_step(kk, carry):
        acc_h, acc_t = carry
        k_slice = pl.ds(pl.multiple_of(kk * block_k, block_k), block_k)
        s_blk = s_ref[:, k_slice].astype(dot_dtype)
        acc_h += jnp.dot(
            s_blk, w_h_ref[k_slice, :], precision=precision, preferred_element_type=_F32
        )
        acc_t += jnp.dot(
            s_blk, w_t_ref[k_slice, :], precision=precision, preferred_element_type=_F32
        )
        return acc_h, acc_t

    zeros = jnp.zeros((block_b, block_n), _F32)
    pre_h, pre_t = lax.fori_loop(0, n_pad // block_k, k_step, (zeros, zeros))

    h, t = _gates_in_kernel(pre_h, pre_t, z_ref, bias_ref, extra_ref)
    gate = t * mask_ref[...] if has_mask else t
    col = pl.ds(pl.multiple_of(pl.program_id(1) * block_n, block_n), block_n)
    s_col = s_ref[:, col]
    s_new_ref[...] = h * gate + s_col * (1.0 - t)
    pre_ref[:, 0, :] = pre_h
    pre_ref[:, 1, :] = pre_t


def _highway_forward_padded(s, w, z, bias, extra, mask, *, config, interpret):
    """Runs the forward kernel; returns padded (s_new [b_pad, n_pad], pre [b_pad, 2, n_pad])."""
    batch, n = _check_shapes(s, w, z, bias, extra, mask)
    _validate_config(config)
    geo = _Geometry.make(config, batch, n)
    bb, bn, n_pad = geo.block_b, geo.block_n, geo.n_pad

    w3 = _pad_to(_halves(w, n), (n_pad, 2, n_pad))
    # w is passed twice, once per half: the two BlockSpecs pick the h / t column block.
    args = [_pad_rows(s, geo), w3, w3, _pad_to(_halves(bias.astype(_F32), n), (2, n_pad))]
    in_specs = [
        pl.BlockSpec((bb, n_pad), lambda i, j: (i, 0)),
        pl.BlockSpec((n_pad, None, bn), lambda i, j: (0, 0, j)),
        pl.BlockSpec((n_pad, None, bn), lambda i, j: (0, 1, j)),
        pl.BlockSpec((2, bn), lambda i, j: (0, j)),
    ]
    if z is not None:
        args.append(_pad_rows(z, geo))
        in_specs.append(pl.BlockSpec((bb, bn), lambda i, j: (i, j)))
    if extra is not None:
        args.append(_pad_halves_rows(extra, n, geo))
        in_specs.append(pl.BlockSpec((bb, 2, bn), lambda i, j: (i, 0, j)))
    if mask is not None:
        args.append(_pad_rows(mask, geo))
        in_specs.append(pl.BlockSpec((bb, bn), lambda i, j: (i, j)))

    kernel = functools.partial(
        _highway_forward_kernel,
        has_z=z is not None,
        has_extra=extra is not None,
        has_mask=mask is not None,
        block_k=geo.block_k,
        precision=_dot_precision(w.dtype, config.allow_tf32),
    )
    s_new, pre = pl.pallas_call(
        kernel,
        grid=geo.grid,
        in_specs=in_specs,
        out_specs=[
            pl.BlockSpec((bb, bn), lambda i, j: (i, j)),
            pl.BlockSpec((bb, 2, bn), lambda i, j: (i, 0, j)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((geo.b_pad, n_pad), _F32),
            jax.ShapeDtypeStruct((geo.b_pad, 2, n_pad), _F32),
        ],
        compiler_params=_compiler_params(config),
        interpret=interpret,
        name="highway_forward",
    )(*args)
    return s_new, pre


@functools.partial(jax.jit, static_argnames=("config", "interpret"))
def highway_forward(
    s: jax.Array,
    w: jax.Array,
    z: jax.Array | None,
    bias: jax.Array,
    extra: jax.Array | None,
    mask: jax.Array | None,
    *,
    config: HighwayConfig = HighwayConfig(),
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """Fused highway step. Returns ``(s_new [B, n] f32, pre [B, 2n] f32)``.

    ``pre = s @ w`` is the unscaled matmul output (saved for ``dz`` in the backward pass).
    ``z``, ``extra`` and ``mask`` may be None (no scaling / zero / all-ones).
    """
    batch, n = s.shape
    s_new, pre = _highway_forward_padded(
        s, w, z, bias, extra, mask, config=config, interpret=interpret
    )
    return s_new[:batch, :n], _unpad_halves(pre, batch, n)


# --- backward kernel (elementwise) -------------------------------------------------------------


def _highway_backward_kernel(*refs, has_z: bool, has_extra: bool, has_mask: bool):
    """Elementwise backward of the gates and the highway combine.

    Refs (block shapes):
      ds_new_ref [block_b, block_n]; s_ref [block_b, block_n]; pre_ref [block_b, 2, block_n];
      bias_ref [2, block_n]; z_ref [block_b, block_n] if has_z;
      extra_ref [block_b, 2, block_n] if has_extra; mask_ref [block_b, block_n] if has_mask;
      outputs: da_ref [block_b, 2, block_n], ds_carry_ref [block_b, block_n],
      dz_ref [block_b, block_n] if has_z.
    """
    refs = list(refs)
    ds_new_ref, s_ref, pre_ref, bias_ref = refs[:4]
    del refs[:4]
    z_ref = refs.pop(0) if has_z else None
    extra_ref = refs.pop(0) if has_extra else None
    mask_ref = refs.pop(0) if has_mask else None
    da_ref, ds_carry_ref = refs[:2]
    dz_ref = refs[2] if has_z else None

    g = ds_new_ref[...]
    pre_h = pre_ref[:, 0, :]
    pre_t = pre_ref[:, 1, :]
    h, t = _gates_in_kernel(pre_h, pre_t, z_ref, bias_ref, extra_ref)
    if has_mask:
        m = mask_ref[...]
        tm, hm = t * m, h * m
    else:
        tm, hm = t, h

    da_h = g * tm * (1.0 - h * h)
    da_t = g * (hm - s_ref[...]) * t * (1.0 - t)
    da_ref[:, 0, :] = da_h
    da_ref[:, 1, :] = da_t
    ds_carry_ref[...] = g * (1.0 - t)
    if has_z:
        dz_ref[...] = da_h * pre_h + da_t * pre_t


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
    config: HighwayConfig = HighwayConfig(),
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    """Backward of the gates. Returns ``(da [B, 2n], ds_carry [B, n], dz [B, n] | None)``, f32.

    ``da`` is the cotangent of ``a = pre * [z, z] + bias + extra``; ``ds_carry`` the part of
    ``ds`` through the carry term ``s * (1 - t)``; ``dz`` is None when ``z`` is None.
    """
    batch, n = s.shape
    if ds_new.shape != (batch, n) or pre.shape != (batch, 2 * n):
        raise ValueError(
            f"ds_new must be {(batch, n)} and pre {(batch, 2 * n)}, "
            f"got {ds_new.shape} and {pre.shape}."
        )
    _validate_config(config)
    geo = _Geometry.make(config, batch, n)
    bb, bn = geo.block_b, geo.block_n

    args = [
        _pad_rows(ds_new, geo),
        _pad_rows(s, geo),
        _pad_halves_rows(pre, n, geo),
        _pad_to(_halves(bias.astype(_F32), n), (2, geo.n_pad)),
    ]
    rows = pl.BlockSpec((bb, bn), lambda i, j: (i, j))
    rows2 = pl.BlockSpec((bb, 2, bn), lambda i, j: (i, 0, j))
    in_specs = [rows, rows, rows2, pl.BlockSpec((2, bn), lambda i, j: (0, j))]
    if z is not None:
        args.append(_pad_rows(z, geo))
        in_specs.append(rows)
    if extra is not None:
        args.append(_pad_halves_rows(extra, n, geo))
        in_specs.append(rows2)
    if mask is not None:
        args.append(_pad_rows(mask, geo))
        in_specs.append(rows)

    out_shape = [
        jax.ShapeDtypeStruct((geo.b_pad, 2, geo.n_pad), _F32),
        jax.ShapeDtypeStruct((geo.b_pad, geo.n_pad), _F32),
    ]
    out_specs = [rows2, rows]
    if z is not None:
        out_shape.append(jax.ShapeDtypeStruct((geo.b_pad, geo.n_pad), _F32))
        out_specs.append(rows)

    kernel = functools.partial(
        _highway_backward_kernel,
        has_z=z is not None,
        has_extra=extra is not None,
        has_mask=mask is not None,
    )
    outs = pl.pallas_call(
        kernel,
        grid=geo.grid,
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=_compiler_params(config),
        interpret=interpret,
        name="highway_backward",
    )(*args)
    da = _unpad_halves(outs[0], batch, n)
    ds_carry = outs[1][:batch, :n]
    dz = outs[2][:batch, :n] if z is not None else None
    return da, ds_carry, dz


# --- custom_vjp ------------------------------------------------------------------------------


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
    d_pre = da if z is None else da * jnp.tile(z.astype(_F32), (1, 2))
    precision = _dot_precision(w.dtype, config.allow_tf32)
    d_pre_c = d_pre.astype(w.dtype)
    # ds = ds_carry + d_pre @ w.T ; dw = s.T @ d_pre, both with f32 accumulation.
    ds = ds_carry + lax.dot_general(
        d_pre_c, w, (((1,), (1,)), ((), ())), precision=precision, preferred_element_type=_F32
    )
    dw = lax.dot_general(
        s.astype(w.dtype),
        d_pre_c,
        (((0,), (0,)), ((), ())),
        precision=precision,
        preferred_element_type=_F32,
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
    config: HighwayConfig = HighwayConfig(),
    interpret: bool = False,
) -> jax.Array:
    """Differentiable fused highway step; returns ``s_new [B, n] f32``.

    Gradients flow to ``s``, ``w``, ``z``, ``bias``, ``extra`` (and ``mask``). The forward
    and the gate backward are Triton kernels; ``d_pre @ w.T`` and ``s.T @ d_pre`` are XLA dots
    with f32 accumulation whose inputs are cast to ``w.dtype`` (so with bf16 weights, ``d_pre``
    is rounded to bf16 for them, and ``dw`` is returned in bf16).
    """
    return _highway_step(config, interpret, s, w, z, bias, extra, mask)


# --- references --------------------------------------------------------------------------------


def _preactivation(pre, z, bias, extra):
    a = pre if z is None else pre * jnp.tile(z.astype(_F32), (1, 2))
    a = a + bias.astype(_F32)
    if extra is not None:
        a = a + extra.astype(_F32)
    return a


def _gates(pre, z, bias, extra):
    n = pre.shape[-1] // 2
    a = _preactivation(pre, z, bias, extra)
    return jnp.tanh(a[:, :n]), jax.nn.sigmoid(a[:, n:])


def _combine(a, s, mask):
    n = s.shape[-1]
    h, t = jnp.tanh(a[:, :n]), jax.nn.sigmoid(a[:, n:])
    gate = t if mask is None else t * mask.astype(_F32)
    return h * gate + s.astype(_F32) * (1.0 - t)


def _reference_matmul(s, w):
    return jnp.dot(
        s.astype(w.dtype),
        w,
        precision=_dot_precision(w.dtype, allow_tf32=False),
        preferred_element_type=_F32,
    )


def highway_forward_reference(s, w, z, bias, extra, mask) -> tuple[jax.Array, jax.Array]:
    """Pure-jnp :func:`highway_forward`: ``(s_new, pre)``."""
    pre = _reference_matmul(s, w)
    return _combine(_preactivation(pre, z, bias, extra), s, mask), pre


def highway_backward_reference(ds_new, s, pre, z, bias, extra, mask):
    """Pure-jnp :func:`highway_backward`, derived by autodiff of the combine."""
    n = s.shape[-1]
    a = _preactivation(pre, z, bias, extra)
    _, vjp = jax.vjp(lambda a_, s_: _combine(a_, s_, mask), a, s.astype(_F32))
    da, ds_carry = vjp(ds_new.astype(_F32))
    dz = None if z is None else da[:, :n] * pre[:, :n] + da[:, n:] * pre[:, n:]
    return da, ds_carry, dz


def highway_step_reference(s, w, z, bias, extra, mask) -> jax.Array:
    """Pure-jnp highway step (differentiate it with plain autodiff)."""
    return highway_forward_reference(s, w, z, bias, extra, mask)[0]
