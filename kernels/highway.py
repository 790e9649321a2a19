"""Fused highway micro-layer step (Recurrent Highway Networks), Pallas Triton kernels.

One highway micro-layer step, with ``B`` the batch and ``n`` the number of units::

    s     [B, n]   f32        carry (the layer's input state)
    w     [n, 2n]  f32 | bf16 recurrent weight; columns [:n] feed h, columns [n:] feed t
    z     [B, n]   f32 | None per-example column scale (HyperRHN); the same z scales both halves
    bias  [2n]     f32
    xproj [B, 2n]  f32 | None addend *inside* the scale (layer 0: the input projection x U)
    extra [B, 2n]  f32 | None addend *outside* the scale (legacy API only)
    mask           gate-dropout mask on t: int8 keep decisions (0/1, scaled by 1/keep in the
                   kernel) in the padded API, f32 (0 or 1/keep) in the legacy API

    pre   = s @ w                                [B, 2n]  f32 accumulation (s cast to w.dtype)
    u     = pre + xproj                          [B, 2n]  the unscaled pre-activation
    a     = u * [z, z] + bias + extra            [B, 2n]
    h     = tanh(a[:, :n])
    t     = sigmoid(a[:, n:])
    s_new = h * (t * mask) + s * (1 - t)         [B, n]   the carry gate uses the *undropped* t

This is the HyperRHN layer of ``rhhjax.recurrence``: at layer 0,
``a = (s W_0 + x U) * [z_0, z_0] + b_0 + b_U``, so the caller passes ``xproj = x U`` and
``bias = b_0 + b_U``; at the other layers ``xproj`` is None. All gate arithmetic and all
outputs are f32 whatever the dtype of ``w``.

Backward of one layer, given ``ds`` (the cotangent of ``s_new``, plus ``g`` from outside)::

    da       = d a                                    [B, 2n]
    d_scaled = da * [z, z]  (= da without z)          [B, 2n]  = d u = d pre = d xproj
    ds_carry = ds * (1 - t)                           [B, n]   the carry part of d s
    dz       = da[:, :n] * u[:, :n] + da[:, n:] * u[:, n:]     (u includes xproj!)
    ds_in    = ds_carry + d_scaled @ w.T              [B, n]   the state gradient of the layer
    dw       = s.T @ d_scaled   (deferred by the caller to one GEMM after the time loop)

Public API, padded layout (for use inside a time loop; pad everything once outside it):

* :class:`HighwayConfig` -- block sizes and Triton launch parameters.
* :class:`Geometry` -- effective block sizes and padded extents for one (batch, n), with
  the padding helpers ``pad_rows``, ``pad_halves``, ``pad_weight``, ``pad_weight_t``,
  ``pad_bias``, ``unpad_rows``, ``unpad_halves`` (methods, and module functions taking ``geo``).
* :func:`forward_padded` -- one kernel: both matmul halves of a column block, gates, combine.
* :func:`backward_padded` -- one elementwise kernel: ``(d_scaled, ds_carry, dz, dbias_partial)``.
* :func:`backward_fused_padded` -- one kernel: the state-gradient GEMM of the layer above
  (``ds = ds_carry_above + d_scaled_above @ W_above^T + g``) then :func:`backward_padded`'s
  elementwise backward, per column block. The backward of a micro-layer is ONE launch.
* :func:`state_grad_padded` -- the GEMM part alone (e.g. the gradient of the initial state).
* :func:`forward_stacked`, :func:`backward_fused_stacked` -- the same kernels on the WHOLE
  stacked ``[T, L, ...]`` arrays at a traced time index ``t`` and a static ``layer``: they read
  their (t, layer) slices and write their outputs in place into stacked buffers aliased to
  the outputs, so a time loop needs no slice or update-slice launch around them.
* References: :func:`forward_padded_reference`, :func:`backward_padded_reference`,
  :func:`state_grad_reference`, :func:`backward_fused_reference` (pure ``jax.numpy``).

Legacy API (unpadded; pads and unpads per call, so do not use it inside a time loop):
:func:`highway_forward`, :func:`highway_backward`, :func:`highway_step` and their
``*_reference`` functions.

Padded layout: ``B`` is padded up to ``b_pad`` (a multiple of ``block_b``) and ``n`` up to
``n_pad`` (a multiple of ``block_n`` and ``block_k``) with zeros. Arrays with two halves are
``[..., 2, n_pad]`` so that the h and t halves stay aligned: ``x2[..., half, u]`` is
``x[..., half * n + u]``. The weight is ``w3 [n_pad, 2, n_pad]`` (``w3[k, half, j] =
w[k, half * n + j]``) for the forward and ``w_t [2, n_pad, n_pad]`` (``w_t[half, k, j] =
w[j, half * n + k]``) for the state-gradient GEMM. Padded *units* have zero weights, bias,
z and xproj, hence ``a = 0`` and ``s_new = tanh(0) * t + 0 * (1 - t) = 0`` there: padded units
of the carry stay exactly zero. Padded *rows* of the carry need not stay zero (without a
mask the bias drives them) but stay finite and never mix with real rows; their state
gradient stays zero as long as the incoming cotangents ``g`` are zero-padded, so they
contribute nothing to ``dz``, ``dbias_partial``, ``d_scaled`` or a deferred ``dW``.

The Triton backend is selected explicitly by passing
``jax.experimental.pallas.triton.CompilerParams`` to ``pl.pallas_call``; without it, recent JAX
versions lower GPU ``pallas_call`` through Mosaic GPU, which cannot lower these kernels.
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
# A squeezed block dimension: `pl.squeezed` in newer JAX, `None` in older ones.
_SQUEEZED = getattr(pl, "squeezed", None)

_F32 = jnp.float32
_MASK_DTYPES = (jnp.int8, jnp.float32)  # keep decisions 0/1, or a ready mask 0 or 1/keep

# H100 (sm_90) opt-in shared memory per block, bytes.
H100_SMEM_PER_BLOCK = 232_448


@dataclasses.dataclass(frozen=True)
class HighwayConfig:
    """Tuning knobs of the highway kernels.

    Attributes:
      block_b: rows (batch) per program. Power of two, >= 16 (the M dim of ``tl.dot``).
      block_n: units per program; each program computes both the h and the t column block.
        Power of two, >= 16.
      block_k: K chunk of the matmul loops. Power of two, >= 16 (``tl.dot`` minimum).
      num_warps: Triton warps per program.
      num_stages: Triton software-pipelining stages of the K loops.
      allow_tf32: when ``w`` is f32, let the matmuls use TF32 tensor cores (faster, ~1e-3
        relative error). Default: exact f32 (``Precision.HIGHEST``). Ignored for bf16 weights.

    The defaults target n = 1000..1024, B = 256 on an H100: a (4, 32) grid of 128 programs,
    one wave on 132 SMs. Deviceless H100 compiles (ptxas via XLA, jax 0.10.2, 2026-11-22) of
    the paper HyperRHN and RHN training steps (every kernel variant they use, n = 1000 and
    the hyper n = 128), f32 and bf16: no spills, at most 180 registers per thread, at most
    49,152 B of shared memory. bf16 dots compile to Hopper ``wgmma`` (``block_b = 32`` gives
    ``mma.sync``); exact f32 dots are FMA loops (``allow_tf32`` for tensor cores). Spilling
    alternatives, measured: 64/32/64 with 4 warps (f32 forward: 255 registers), 32/32/32 with 4
    warps (bf16 hyper forward: 8 B), 64/32/32 with 8 warps (f32 hyper forward with xproj and
    mask: 8 B). The block sizes are clamped down for small problems (never below 16).
    """

    block_b: int = 64
    block_n: int = 32
    block_k: int = 32
    num_warps: int = 4
    num_stages: int = 3
    allow_tf32: bool = False

    def smem_bytes(self, dot_dtype) -> int:
        """Predicted shared memory per program (bytes) of the largest kernel (the fused
        backward), a conservative model fitted to ptxas through XLA (H100, jax 0.10.2):

            max(num_stages - 1, 1) * (2 * block_b * block_k * 4 + 2 * block_k * block_n * w)
              + block_b * block_n * 4

        Triton's pipeliner keeps ``num_stages - 1`` copies of one K step's operands (two f32
        row tiles, loaded as f32 and cast in registers; two weight tiles in the dot dtype of
        ``w`` bytes per element), plus one f32 output tile for layout conversions. It equals
        or exceeds every measured kernel (forward, backward, fused, state-grad; 32/32/32,
        64/32/32, 64/32/64), e.g. 294,912 B for the forward and 393,216 B for the fused
        kernel pipeline at f32 128/128/64 with 4 stages.
        """
        w_bytes = jnp.dtype(dot_dtype).itemsize
        per_stage = 2 * self.block_b * self.block_k * 4 + 2 * self.block_k * self.block_n * w_bytes
        return max(self.num_stages - 1, 1) * per_stage + self.block_b * self.block_n * 4


def _is_pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


def _validate_config(config: HighwayConfig, dot_dtype=None) -> None:
    """Rejects configurations that Triton cannot lower or an H100 cannot run, one line each."""
    for name in ("block_b", "block_n", "block_k"):
        value = getattr(config, name)
        if not _is_pow2(value) or value < 16:
            raise ValueError(f"HighwayConfig.{name} must be a power of two >= 16, got {value}.")
    if not _is_pow2(config.num_warps):
        raise ValueError(f"HighwayConfig.num_warps must be a power of two, got {config.num_warps}.")
    if config.num_stages < 1:
        raise ValueError(f"HighwayConfig.num_stages must be >= 1, got {config.num_stages}.")
    if dot_dtype is not None:
        need = config.smem_bytes(dot_dtype)
        if need > H100_SMEM_PER_BLOCK:
            raise ValueError(
                f"HighwayConfig {config} needs ~{need} B of shared memory with "
                f"{jnp.dtype(dot_dtype).name} weights, over the H100's {H100_SMEM_PER_BLOCK} B "
                "per block: lower num_stages or the block sizes."
            )


def validate_config(config: HighwayConfig, dot_dtype=None) -> None:
    """Raises ValueError (one line) for a config Triton cannot lower or that needs more shared
    memory than an H100 block has with ``dot_dtype`` weights (checked when given)."""
    _validate_config(config, dot_dtype)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _clamp_block(block: int, size: int) -> int:
    """Shrinks a block to the next power of two >= size (but never below 16)."""
    return min(block, max(16, pl.next_power_of_2(size)))


def _pad_trailing(x: jax.Array, trailing: tuple[int, ...]) -> jax.Array:
    """Zero-pads the last ``len(trailing)`` axes of ``x`` up to ``trailing``."""
    lead = x.ndim - len(trailing)
    widths = [(0, 0)] * lead + [
        (0, target - size) for size, target in zip(x.shape[lead:], trailing, strict=True)
    ]
    if any(hi < 0 for _, hi in widths):
        raise ValueError(f"cannot pad shape {x.shape} to trailing {trailing}.")
    if all(hi == 0 for _, hi in widths):
        return x
    return jnp.pad(x, widths)


@dataclasses.dataclass(frozen=True)
class Geometry:
    """Effective block sizes and padded extents for one problem size (hashable, static).

    Build it with :meth:`make`. ``grid = (b_pad // block_b, n_pad // block_n)``.
    """

    batch: int
    n: int
    block_b: int
    block_n: int
    block_k: int
    b_pad: int
    n_pad: int

    @classmethod
    def make(cls, config: HighwayConfig, batch: int, n: int) -> Geometry:
        """Clamps the config's blocks to the problem and rounds ``batch`` and ``n`` up.

        The kernels take their block sizes from the geometry and only the launch parameters
        (warps, stages, ``allow_tf32``) from the config they are given.
        """
        _validate_config(config)
        if batch < 1 or n < 1:
            raise ValueError(f"Geometry needs batch >= 1 and n >= 1, got {batch} and {n}.")
        block_b = _clamp_block(config.block_b, batch)
        block_n = _clamp_block(config.block_n, n)
        block_k = _clamp_block(config.block_k, n)
        return cls(
            batch=batch,
            n=n,
            block_b=block_b,
            block_n=block_n,
            block_k=block_k,
            b_pad=_round_up(batch, block_b),
            n_pad=_round_up(n, math.lcm(block_n, block_k)),
        )

    @property
    def grid(self) -> tuple[int, int]:
        return (self.b_pad // self.block_b, self.n_pad // self.block_n)

    # --- padding helpers: all accept leading axes ([T, L, ...], [L, ...]) -------------------

    def pad_rows(self, x: jax.Array) -> jax.Array:
        """[..., B, n] -> [..., b_pad, n_pad], dtype kept (f32 states, int8 masks)."""
        return _pad_trailing(x, (self.b_pad, self.n_pad))

    def pad_halves(self, x: jax.Array) -> jax.Array:
        """[..., B, 2n] -> [..., b_pad, 2, n_pad] f32."""
        x = x.astype(_F32).reshape(*x.shape[:-1], 2, self.n)
        return _pad_trailing(x, (self.b_pad, 2, self.n_pad))

    def pad_weight(self, w: jax.Array, dtype) -> jax.Array:
        """[..., n, 2n] -> [..., n_pad, 2, n_pad] in ``dtype`` (the forward layout ``w3``)."""
        w3 = w.astype(dtype).reshape(*w.shape[:-1], 2, self.n)
        return _pad_trailing(w3, (self.n_pad, 2, self.n_pad))

    def pad_weight_t(self, w: jax.Array, dtype) -> jax.Array:
        """[..., n, 2n] -> [..., 2, n_pad, n_pad] in ``dtype``; ``w_t[h, k, j] = w[j, h*n+k]``."""
        w3 = w.astype(dtype).reshape(*w.shape[:-1], 2, self.n)  # [..., j, h, k]
        w_t = jnp.moveaxis(w3, -3, -1)  # [..., h, k, j]
        return _pad_trailing(w_t, (2, self.n_pad, self.n_pad))

    def pad_bias(self, b: jax.Array) -> jax.Array:
        """[..., 2n] -> [..., 2, n_pad] f32."""
        b2 = b.astype(_F32).reshape(*b.shape[:-1], 2, self.n)
        return _pad_trailing(b2, (2, self.n_pad))

    def unpad_rows(self, x: jax.Array) -> jax.Array:
        """[..., b_pad, n_pad] -> [..., B, n]."""
        return x[..., : self.batch, : self.n]

    def unpad_halves(self, x: jax.Array) -> jax.Array:
        """[..., b_pad, 2, n_pad] -> [..., B, 2n]."""
        x = x[..., : self.batch, :, : self.n]
        return x.reshape(*x.shape[:-3], self.batch, 2 * self.n)


def pad_rows(x: jax.Array, geo: Geometry) -> jax.Array:
    """Module-level :meth:`Geometry.pad_rows`."""
    return geo.pad_rows(x)


def pad_halves(x: jax.Array, geo: Geometry) -> jax.Array:
    """Module-level :meth:`Geometry.pad_halves`."""
    return geo.pad_halves(x)


def pad_weight(w: jax.Array, dtype, geo: Geometry) -> jax.Array:
    """Module-level :meth:`Geometry.pad_weight`."""
    return geo.pad_weight(w, dtype)


def pad_weight_t(w: jax.Array, dtype, geo: Geometry) -> jax.Array:
    """Module-level :meth:`Geometry.pad_weight_t`."""
    return geo.pad_weight_t(w, dtype)


def pad_bias(b: jax.Array, geo: Geometry) -> jax.Array:
    """Module-level :meth:`Geometry.pad_bias`."""
    return geo.pad_bias(b)


def unpad_rows(x: jax.Array, geo: Geometry) -> jax.Array:
    """Module-level :meth:`Geometry.unpad_rows`."""
    return geo.unpad_rows(x)


def unpad_halves(x: jax.Array, geo: Geometry) -> jax.Array:
    """Module-level :meth:`Geometry.unpad_halves`."""
    return geo.unpad_halves(x)


def _compiler_params(config: HighwayConfig):
    return _TritonCompilerParams(num_warps=config.num_warps, num_stages=config.num_stages)


def _dot_precision(dtype, allow_tf32: bool):
    if jnp.dtype(dtype) == jnp.float32 and not allow_tf32:
        return lax.Precision.HIGHEST
    return None


def _check(name: str, x: jax.Array | None, shape: tuple[int, ...], dtypes=None) -> None:
    """One-line shape (and dtype) check of a padded operand."""
    if x is None:
        return
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must have padded shape {tuple(shape)}, got {tuple(x.shape)}.")
    if dtypes is not None and jnp.dtype(x.dtype) not in [jnp.dtype(d) for d in dtypes]:
        names = ", ".join(jnp.dtype(d).name for d in dtypes)
        raise ValueError(f"{name} must have dtype {names}, got {jnp.dtype(x.dtype).name}.")


def _mask_scale(keep_mask: jax.Array | None, keep: float) -> float:
    """1/keep for integer keep decisions; 1 for float masks (already 0 or 1/keep)."""
    if keep_mask is None or jnp.issubdtype(keep_mask.dtype, jnp.floating):
        return 1.0
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"keep must be in (0, 1] with an int8 keep_mask, got {keep}.")
    return 1.0 / keep


# --- in-kernel helpers -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Has:
    """Which optional operands a kernel gets (static)."""

    z: bool = False
    xproj: bool = False
    extra: bool = False
    mask: bool = False
    g: bool = False
    ds_carry_above: bool = False


def _pop(refs: list, present: bool):
    return refs.pop(0) if present else None


def _gates_in_kernel(pre_h, pre_t, z, bias_ref, xproj_ref, extra_ref):
    """Unscaled u and gates h, t [block_b, block_n] from the matmul halves, inside a kernel.

    u = pre + xproj; a = u * [z, z] + bias + extra (absent operands are None).
    Returns (u_h, u_t, h, t).
    """
    u_h, u_t = pre_h, pre_t
    if xproj_ref is not None:
        u_h = u_h + xproj_ref[:, 0, :]
        u_t = u_t + xproj_ref[:, 1, :]
    a_h, a_t = (u_h * z, u_t * z) if z is not None else (u_h, u_t)
    a_h = a_h + bias_ref[0, :][None, :]
    a_t = a_t + bias_ref[1, :][None, :]
    if extra_ref is not None:
        a_h = a_h + extra_ref[:, 0, :]
        a_t = a_t + extra_ref[:, 1, :]
    return u_h, u_t, jnp.tanh(a_h), jax.nn.sigmoid(a_t)


def _load_mask(mask_ref, mask_scale: float):
    """f32 dropout multiplier [block_b, block_n] (0 or 1/keep), or None."""
    if mask_ref is None:
        return None
    m = mask_ref[...].astype(_F32)
    return m * mask_scale if mask_scale != 1.0 else m


def _k_loop(n_k: int, block_k: int, step, init):
    """fori_loop over K chunks; ``step(k_slice, acc)`` gets an aligned ``pl.ds``."""

    def body(kk, acc):
        return step(pl.ds(pl.multiple_of(kk * block_k, block_k), block_k), acc)

    return lax.fori_loop(0, n_k, body, init)


# --- forward kernel ----------------------------------------------------------------------------


def _forward_kernel(*refs, has: _Has, block_k: int, precision, mask_scale: float):
    """One (batch block i, unit block j) program of the forward.

    Refs (block shapes):
      s_ref      [block_b, n_pad]       whole rows of the carry (K operand and carry term)
      w_h_ref    [n_pad, block_n]       h-half columns of w3
      w_t_ref    [n_pad, block_n]       t-half columns of w3
      bias_ref   [2, block_n]
      z_ref      [block_b, block_n]     if has.z
      xproj_ref  [block_b, 2, block_n]  if has.xproj (inside the scale)
      extra_ref  [block_b, 2, block_n]  if has.extra (outside the scale)
      mask_ref   [block_b, block_n]     if has.mask (int8 keep decisions or f32 mask)
      s_new_ref  [block_b, block_n]     output
      pre_ref    [block_b, 2, block_n]  output: unscaled s @ w
    """
    refs = list(refs)
    s_ref, w_h_ref, w_t_ref, bias_ref = refs[:4]
    del refs[:4]
    z_ref = _pop(refs, has.z)
    xproj_ref = _pop(refs, has.xproj)
    extra_ref = _pop(refs, has.extra)
    mask_ref = _pop(refs, has.mask)
    s_new_ref, pre_ref = refs

    block_b, block_n = s_new_ref.shape
    dot_dtype = w_h_ref.dtype

    def k_step(k, acc):
        acc_h, acc_t = acc
        s_blk = s_ref[:, k].astype(dot_dtype)
        acc_h += jnp.dot(s_blk, w_h_ref[k, :], precision=precision, preferred_element_type=_F32)
        acc_t += jnp.dot(s_blk, w_t_ref[k, :], precision=precision, preferred_element_type=_F32)
        return acc_h, acc_t

    zeros = jnp.zeros((block_b, block_n), _F32)
    pre_h, pre_t = _k_loop(s_ref.shape[1] // block_k, block_k, k_step, (zeros, zeros))

    z = z_ref[...] if has.z else None
    _, _, h, t = _gates_in_kernel(pre_h, pre_t, z, bias_ref, xproj_ref, extra_ref)
    m = _load_mask(mask_ref, mask_scale)
    gate = t if m is None else t * m
    col = pl.ds(pl.multiple_of(pl.program_id(1) * block_n, block_n), block_n)
    s_new_ref[...] = h * gate + s_ref[:, col] * (1.0 - t)
    pre_ref[:, 0, :] = pre_h
    pre_ref[:, 1, :] = pre_t


def forward_padded(
    s: jax.Array,
    w3: jax.Array,
    z: jax.Array | None,
    bias2: jax.Array,
    xproj: jax.Array | None,
    keep_mask: jax.Array | None,
    *,
    keep: float = 1.0,
    geo: Geometry,
    config: HighwayConfig = HighwayConfig(),
    interpret: bool = False,
    extra: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Forward of one micro-layer in the padded layout: ONE kernel launch, no pad or cast.

    Args:
      s: [b_pad, n_pad] f32 input state.
      w3: [n_pad, 2, n_pad] weight in the dot dtype (``geo.pad_weight(w, dtype)``).
      z: [b_pad, n_pad] f32 scale, or None.
      bias2: [2, n_pad] f32 (at layer 0 the sum of both biases, b_0 + b_U).
      xproj: [b_pad, 2, n_pad] f32 addend inside the scale (layer 0: x U), or None.
      keep_mask: [b_pad, n_pad] int8 keep decisions (0/1; scaled by 1/``keep`` in the kernel),
        or f32 (0 or 1/keep, used as is), or None.
      keep: static keep probability (used with an int8 mask only).
      geo: the :class:`Geometry` the operands were padded with.
      extra: [b_pad, 2, n_pad] f32 addend outside the scale (legacy API), or None.
    Returns:
      s_new [b_pad, n_pad] f32 and pre [b_pad, 2, n_pad] f32 (the unscaled ``s @ w``, without
      xproj).
    """
    _validate_config(config, w3.dtype)
    bb, bn, n_pad = geo.block_b, geo.block_n, geo.n_pad
    rows, rows2 = (geo.b_pad, n_pad), (geo.b_pad, 2, n_pad)
    _check("s", s, rows, (_F32,))
    _check("w3", w3, (n_pad, 2, n_pad))
    _check("z", z, rows, (_F32,))
    _check("bias2", bias2, (2, n_pad), (_F32,))
    _check("xproj", xproj, rows2, (_F32,))
    _check("extra", extra, rows2, (_F32,))
    _check("keep_mask", keep_mask, rows, _MASK_DTYPES)
    has = _Has(z=z is not None, xproj=xproj is not None, extra=extra is not None)
    has = dataclasses.replace(has, mask=keep_mask is not None)

    block_rows = pl.BlockSpec((bb, bn), lambda i, j: (i, j))
    block_rows2 = pl.BlockSpec((bb, 2, bn), lambda i, j: (i, 0, j))
    # w3 is passed twice, once per half: the two BlockSpecs pick the h / t column block.
    args = [s, w3, w3, bias2]
    in_specs = [
        pl.BlockSpec((bb, n_pad), lambda i, j: (i, 0)),
        pl.BlockSpec((n_pad, _SQUEEZED, bn), lambda i, j: (0, 0, j)),
        pl.BlockSpec((n_pad, _SQUEEZED, bn), lambda i, j: (0, 1, j)),
        pl.BlockSpec((2, bn), lambda i, j: (0, j)),
    ]
    for x, spec in ((z, block_rows), (xproj, block_rows2), (extra, block_rows2)):
        if x is not None:
            args.append(x)
            in_specs.append(spec)
    if keep_mask is not None:
        args.append(keep_mask)
        in_specs.append(block_rows)

    kernel = functools.partial(
        _forward_kernel,
        has=has,
        block_k=geo.block_k,
        precision=_dot_precision(w3.dtype, config.allow_tf32),
        mask_scale=_mask_scale(keep_mask, keep),
    )
    s_new, pre = pl.pallas_call(
        kernel,
        grid=geo.grid,
        in_specs=in_specs,
        out_specs=[block_rows, block_rows2],
        out_shape=[jax.ShapeDtypeStruct(rows, _F32), jax.ShapeDtypeStruct(rows2, _F32)],
        compiler_params=_compiler_params(config),
        interpret=interpret,
        name="highway_forward",
    )(*args)
    return s_new, pre


# --- backward kernels --------------------------------------------------------------------------


def _state_grad_in_kernel(d_h_ref, d_t_ref, wt_h_ref, wt_t_ref, block_k: int, precision):
    """[block_b, block_n] f32: d_scaled_above @ W_above^T for this column block (K = 2 n_pad)."""
    dot_dtype = wt_h_ref.dtype
    block_b = d_h_ref.shape[0]
    block_n = wt_h_ref.shape[1]

    def k_step(k, acc):
        acc += jnp.dot(
            d_h_ref[:, k].astype(dot_dtype),
            wt_h_ref[k, :],
            precision=precision,
            preferred_element_type=_F32,
        )
        acc += jnp.dot(
            d_t_ref[:, k].astype(dot_dtype),
            wt_t_ref[k, :],
            precision=precision,
            preferred_element_type=_F32,
        )
        return acc

    init = jnp.zeros((block_b, block_n), _F32)
    return _k_loop(d_h_ref.shape[1] // block_k, block_k, k_step, init)


def _backward_kernel(
    *refs,
    has: _Has,
    gemm: bool,
    elementwise: bool,
    scale_da: bool,
    block_k: int,
    precision,
    mask_scale: float,
):
    """One (batch block i, unit block j) program of the backward.

    Refs (block shapes), in this order:
      if gemm: d_h_ref, d_t_ref [block_b, n_pad] (h / t halves of d_scaled_above, whole
        rows), wt_h_ref, wt_t_ref [n_pad, block_n] (w_t_above[half, :, j block]);
        ds_carry_above_ref [block_b, block_n] if has.ds_carry_above;
      else: ds_ref [block_b, block_n] (the incoming state gradient);
      g_ref [block_b, block_n] if has.g;
      if elementwise: s_ref [block_b, block_n]; pre_ref [block_b, 2, block_n];
        bias_ref [2, block_n]; z_ref, xproj_ref, extra_ref, mask_ref as in the forward;
      outputs: if elementwise: d_out_ref [block_b, 2, block_n] (d_scaled, or da when not
        scale_da), ds_carry_ref [block_b, block_n], dz_ref [block_b, block_n] if has.z,
        dbias_ref [2, block_n] (this program's column sums of da); else ds_ref_out.
    """
    refs = list(refs)
    if gemm:
        d_h_ref, d_t_ref, wt_h_ref, wt_t_ref = refs[:4]
        del refs[:4]
        ds = _state_grad_in_kernel(d_h_ref, d_t_ref, wt_h_ref, wt_t_ref, block_k, precision)
        carry_ref = _pop(refs, has.ds_carry_above)
        if carry_ref is not None:
            ds = ds + carry_ref[...]
    else:
        ds = refs.pop(0)[...]
    g_ref = _pop(refs, has.g)
    if g_ref is not None:
        ds = ds + g_ref[...]
    if not elementwise:
        refs[0][...] = ds
        return

    s_ref, pre_ref, bias_ref = refs[:3]
    del refs[:3]
    z_ref = _pop(refs, has.z)
    xproj_ref = _pop(refs, has.xproj)
    extra_ref = _pop(refs, has.extra)
    mask_ref = _pop(refs, has.mask)
    d_out_ref, ds_carry_ref = refs[:2]
    del refs[:2]
    dz_ref = _pop(refs, has.z)
    (dbias_ref,) = refs

    z = z_ref[...] if has.z else None
    u_h, u_t, h, t = _gates_in_kernel(
        pre_ref[:, 0, :], pre_ref[:, 1, :], z, bias_ref, xproj_ref, extra_ref
    )
    m = _load_mask(mask_ref, mask_scale)
    tm, hm = (t, h) if m is None else (t * m, h * m)
    da_h = ds * tm * (1.0 - h * h)
    da_t = ds * (hm - s_ref[...]) * t * (1.0 - t)
    if has.z and scale_da:
        d_out_ref[:, 0, :] = da_h * z
        d_out_ref[:, 1, :] = da_t * z
    else:
        d_out_ref[:, 0, :] = da_h
        d_out_ref[:, 1, :] = da_t
    ds_carry_ref[...] = ds * (1.0 - t)
    if dz_ref is not None:
        dz_ref[...] = da_h * u_h + da_t * u_t
    dbias_ref[0, :] = jnp.sum(da_h, axis=0)
    dbias_ref[1, :] = jnp.sum(da_t, axis=0)


def _backward_call(
    gemm_args,
    ds,
    g,
    elementwise_args,
    *,
    keep,
    geo,
    config,
    interpret,
    scale_da=True,
    name,
):
    """Builds and runs one backward pallas_call (shared by the three backward entry points).

    gemm_args: (d_scaled_above, w_t_above, ds_carry_above | None) or None.
    ds: incoming state gradient [b_pad, n_pad] when gemm_args is None.
    elementwise_args: (s, pre, z, bias2, xproj, extra, keep_mask) or None (GEMM only).
    """
    bb, bn, n_pad, b_pad = geo.block_b, geo.block_n, geo.n_pad, geo.b_pad
    rows, rows2 = (b_pad, n_pad), (b_pad, 2, n_pad)
    block_rows = pl.BlockSpec((bb, bn), lambda i, j: (i, j))
    block_rows2 = pl.BlockSpec((bb, 2, bn), lambda i, j: (i, 0, j))
    args, in_specs = [], []
    has = _Has(g=g is not None)
    dot_dtype = None
    if gemm_args is not None:
        d_above, w_t, ds_carry_above = gemm_args
        _check("d_scaled_above", d_above, rows2, (_F32,))
        _check("w_t_above", w_t, (2, n_pad, n_pad))
        _check("ds_carry_above", ds_carry_above, rows, (_F32,))
        dot_dtype = w_t.dtype
        args += [d_above, d_above, w_t, w_t]
        in_specs += [
            pl.BlockSpec((bb, _SQUEEZED, n_pad), lambda i, j: (i, 0, 0)),
            pl.BlockSpec((bb, _SQUEEZED, n_pad), lambda i, j: (i, 1, 0)),
            pl.BlockSpec((_SQUEEZED, n_pad, bn), lambda i, j: (0, 0, j)),
            pl.BlockSpec((_SQUEEZED, n_pad, bn), lambda i, j: (1, 0, j)),
        ]
        if ds_carry_above is not None:
            has = dataclasses.replace(has, ds_carry_above=True)
            args.append(ds_carry_above)
            in_specs.append(block_rows)
    else:
        _check("ds", ds, rows, (_F32,))
        args.append(ds)
        in_specs.append(block_rows)
    _validate_config(config, dot_dtype)
    _check("g", g, rows, (_F32,))
    if g is not None:
        args.append(g)
        in_specs.append(block_rows)

    mask_scale = 1.0
    if elementwise_args is None:
        out_specs, out_shape = [block_rows], [jax.ShapeDtypeStruct(rows, _F32)]
    else:
        s, pre, z, bias2, xproj, extra, keep_mask = elementwise_args
        _check("s", s, rows, (_F32,))
        _check("pre", pre, rows2, (_F32,))
        _check("z", z, rows, (_F32,))
        _check("bias2", bias2, (2, n_pad), (_F32,))
        _check("xproj", xproj, rows2, (_F32,))
        _check("extra", extra, rows2, (_F32,))
        _check("keep_mask", keep_mask, rows, _MASK_DTYPES)
        mask_scale = _mask_scale(keep_mask, keep)
        has = dataclasses.replace(
            has,
            z=z is not None,
            xproj=xproj is not None,
            extra=extra is not None,
            mask=keep_mask is not None,
        )
        args += [s, pre, bias2]
        in_specs += [block_rows, block_rows2, pl.BlockSpec((2, bn), lambda i, j: (0, j))]
        for x, spec in (
            (z, block_rows),
            (xproj, block_rows2),
            (extra, block_rows2),
            (keep_mask, block_rows),
        ):
            if x is not None:
                args.append(x)
                in_specs.append(spec)
        out_specs = [block_rows2, block_rows]
        out_shape = [jax.ShapeDtypeStruct(rows2, _F32), jax.ShapeDtypeStruct(rows, _F32)]
        if z is not None:
            out_specs.append(block_rows)
            out_shape.append(jax.ShapeDtypeStruct(rows, _F32))
        out_specs.append(pl.BlockSpec((_SQUEEZED, 2, bn), lambda i, j: (i, 0, j)))
        out_shape.append(jax.ShapeDtypeStruct((geo.grid[0], 2, n_pad), _F32))

    kernel = functools.partial(
        _backward_kernel,
        has=has,
        gemm=gemm_args is not None,
        elementwise=elementwise_args is not None,
        scale_da=scale_da,
        block_k=geo.block_k,
        precision=None if dot_dtype is None else _dot_precision(dot_dtype, config.allow_tf32),
        mask_scale=mask_scale,
    )
    return pl.pallas_call(
        kernel,
        grid=geo.grid,
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=_compiler_params(config),
        interpret=interpret,
        name=name,
    )(*args)


def _split_backward_outputs(outs, has_z: bool):
    d_scaled, ds_carry = outs[0], outs[1]
    dz = outs[2] if has_z else None
    return d_scaled, ds_carry, dz, outs[-1]


def backward_padded(
    ds: jax.Array,
    s: jax.Array,
    pre: jax.Array,
    z: jax.Array | None,
    bias2: jax.Array,
    xproj: jax.Array | None,
    keep_mask: jax.Array | None,
    *,
    g: jax.Array | None = None,
    keep: float = 1.0,
    geo: Geometry,
    config: HighwayConfig = HighwayConfig(),
    interpret: bool = False,
    extra: jax.Array | None = None,
    scale_da: bool = True,
) -> tuple[jax.Array, jax.Array, jax.Array | None, jax.Array]:
    """Elementwise gate backward of one micro-layer, padded layout: ONE kernel launch.

    Args:
      ds: [b_pad, n_pad] f32 cotangent of this layer's ``s_new``.
      s, pre, z, bias2, xproj, keep_mask, keep, extra: as given to :func:`forward_padded`
        (``pre`` is its output).
      g: [b_pad, n_pad] f32 added to ``ds`` (cotangent from outside), or None.
      scale_da: when False the first output is ``da`` instead of ``da * [z, z]`` (legacy).
    Returns:
      d_scaled [b_pad, 2, n_pad] f32: ``da * [z, z]`` (``da`` without z): the input of the
        state-gradient GEMM and of the deferred dW; also ``d xproj``.
      ds_carry [b_pad, n_pad] f32: ``(ds + g) * (1 - t)``.
      dz [b_pad, n_pad] f32 | None: ``sum over halves of da * (pre + xproj)``; None without z.
      dbias_partial [b_pad // block_b, 2, n_pad] f32: per-batch-block column sums of ``da``
        (sum over axis 0, after the time loop, for d bias2).
    """
    outs = _backward_call(
        None,
        ds,
        g,
        (s, pre, z, bias2, xproj, extra, keep_mask),
        keep=keep,
        geo=geo,
        config=config,
        interpret=interpret,
        scale_da=scale_da,
        name="highway_backward",
    )
    return _split_backward_outputs(outs, z is not None)


def backward_fused_padded(
    d_scaled_above: jax.Array,
    w_t_above: jax.Array,
    ds_carry_above: jax.Array | None,
    g: jax.Array | None,
    s: jax.Array,
    pre: jax.Array,
    z: jax.Array | None,
    bias2: jax.Array,
    xproj: jax.Array | None,
    keep_mask: jax.Array | None,
    *,
    keep: float = 1.0,
    geo: Geometry,
    config: HighwayConfig = HighwayConfig(),
    interpret: bool = False,
    extra: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array | None, jax.Array]:
    """State-gradient GEMM of the layer above + gate backward of this layer: ONE launch.

    Per column block: ``ds = ds_carry_above + d_scaled_above @ W_above^T (+ g)``, with the
    GEMM's K loop over both halves of ``w_t_above``, then :func:`backward_padded` with that
    ``ds``. "Above" is the layer that consumed this layer's output: (t, l + 1), or (t + 1, 0)
    for the last micro-layer.

    Args:
      d_scaled_above: [b_pad, 2, n_pad] f32, the layer above's ``d_scaled``.
      w_t_above: [2, n_pad, n_pad] the layer above's weight in the dot dtype
        (``geo.pad_weight_t(w, dtype)``); ``d_scaled_above`` is cast to it for the dot.
      ds_carry_above: [b_pad, n_pad] f32, the layer above's ``ds_carry``, or None (zero).
      g, s, pre, z, bias2, xproj, keep_mask, keep, extra: as in :func:`backward_padded`.
    Returns:
      (d_scaled, ds_carry, dz, dbias_partial) as in :func:`backward_padded`.
    """
    outs = _backward_call(
        (d_scaled_above, w_t_above, ds_carry_above),
        None,
        g,
        (s, pre, z, bias2, xproj, extra, keep_mask),
        keep=keep,
        geo=geo,
        config=config,
        interpret=interpret,
        name="highway_backward_fused",
    )
    return _split_backward_outputs(outs, z is not None)


def state_grad_padded(
    d_scaled: jax.Array,
    w_t: jax.Array,
    ds_carry: jax.Array | None,
    g: jax.Array | None = None,
    *,
    geo: Geometry,
    config: HighwayConfig = HighwayConfig(),
    interpret: bool = False,
) -> jax.Array:
    """``ds_carry + d_scaled @ W^T (+ g)`` [b_pad, n_pad] f32, one kernel (the GEMM part of
    :func:`backward_fused_padded` alone, e.g. for the gradient of the initial state)."""
    (ds,) = _backward_call(
        (d_scaled, w_t, ds_carry),
        None,
        g,
        None,
        keep=1.0,
        geo=geo,
        config=config,
        interpret=interpret,
        name="highway_state_grad",
    )
    return ds


# --- stacked variants: read and write [T, L, ...] arrays at a traced time index ----------------
#
# Inside a `lax.scan` over time, slicing the step's operands out of the stacked scan inputs and
# storing the step's outputs into stacked scan outputs costs one XLA launch each (a custom call
# needs materialized operands). These variants take the WHOLE stacked arrays plus the time
# index `t` (a traced int32 scalar, passed to the kernel as a shape-(1,) array) and a static
# `layer`, and read/write the (t, layer) slice inside the kernel. Stacked outputs are passed in
# and aliased to the outputs (`input_output_aliases`): the caller carries them through the
# scan, every call writes its slice in place, and nothing else of the buffer changes.
# The BlockSpecs keep the leading (T, L) dims whole (Triton's power-of-two rule applies to the
# loaded/stored tensors only, not to block shapes: jax/_src/pallas/triton/lowering.py,
# `_check_tensor_size` on the indexer shape).

_FREE = object()  # a free position of a `_View` template


class _View:
    """A kernel ref seen at fixed indices: ``template`` holds one entry per ref axis, a fixed
    index (int or traced scalar) or ``_FREE``; the view's axes are the free ones, in order.
    ``shift`` adds an offset to integer indices of a view axis (e.g. the halves of ``pre``
    stored after the input state in ``packed``). With ``acc_from`` (a ref of the same block),
    a store adds the value read from ``acc_from`` at the same place (in-place accumulation).
    """

    def __init__(self, ref, template, shift=None, acc_from=None):
        self.ref, self.template, self.shift, self.acc_from = ref, template, shift or {}, acc_from
        free = [d for d, x in zip(ref.shape, template, strict=True) if x is _FREE]
        for axis, offset in self.shift.items():
            free[axis] -= offset
        self.shape = tuple(free)
        self.dtype = ref.dtype

    def _index(self, idx):
        if idx is Ellipsis:
            idx = ()
        elif not isinstance(idx, tuple):
            idx = (idx,)
        idx = list(idx) + [slice(None)] * (len(self.shape) - len(idx))
        for axis, offset in self.shift.items():
            if not isinstance(idx[axis], int):
                raise NotImplementedError("a shifted view axis takes integer indices only")
            idx[axis] += offset
        it = iter(idx)
        return tuple(next(it) if x is _FREE else x for x in self.template)

    def __getitem__(self, idx):
        return self.ref[self._index(idx)]

    def __setitem__(self, idx, value):
        full = self._index(idx)
        if self.acc_from is not None:
            value = self.acc_from[full] + value
        self.ref[full] = value


def _t_spec():
    return pl.BlockSpec((1,), lambda i, j: (0,))


def _lead_spec(lead: tuple[int, ...], block: tuple, index):
    """BlockSpec keeping the leading dims ``lead`` whole; ``index(i, j)`` the trailing ones."""
    zeros = (0,) * len(lead)
    return pl.BlockSpec((*lead, *block), lambda i, j: (*zeros, *index(i, j)))


def _check_time(t: jax.Array) -> jax.Array:
    t = jnp.asarray(t)
    if t.shape not in ((), (1,)) or not jnp.issubdtype(t.dtype, jnp.integer):
        raise ValueError(f"t must be an integer scalar, got {t.dtype} {t.shape}.")
    return t.astype(jnp.int32).reshape(1)


def _forward_stacked_kernel(t_ref, *refs, has: _Has, layer: int, **kernel_kw):
    """`_forward_kernel` on the (t, layer) slices of the stacked operands.

    Refs: t_ref [1]; s_ref [block_b, n_pad]; w_h_ref, w_t_ref [n_pad, block_n]; bias_ref
    [2, block_n]; z_ref [T, L, block_b, block_n] if has.z; xproj_ref [T, block_b, 2, block_n]
    if has.xproj; mask_ref [T, L, block_b, block_n] if has.mask; packed_in (aliased, unused);
    outputs s_new_ref [block_b, block_n], packed_ref [T, L, block_b, 3, block_n].
    """
    t = t_ref[0]
    refs = list(refs)
    s_ref, w_h_ref, w_t_ref, bias_ref = refs[:4]
    del refs[:4]
    z_ref = _pop(refs, has.z)
    xproj_ref = _pop(refs, has.xproj)
    mask_ref = _pop(refs, has.mask)
    _, s_new_ref, packed_ref = refs
    tl4 = (t, layer, _FREE, _FREE)
    views = [s_ref, w_h_ref, w_t_ref, bias_ref]
    if has.z:
        views.append(_View(z_ref, tl4))
    if has.xproj:
        views.append(_View(xproj_ref, (t, _FREE, _FREE, _FREE)))
    if has.mask:
        views.append(_View(mask_ref, tl4))
    # The input state's block first: stored before the K loop, it holds no registers there.
    block_n = s_new_ref.shape[1]
    col = pl.ds(pl.multiple_of(pl.program_id(1) * block_n, block_n), block_n)
    packed_ref[t, layer, :, 0, :] = s_ref[:, col]
    pre = _View(packed_ref, (t, layer, _FREE, _FREE, _FREE), shift={1: 1})
    _forward_kernel(*views, s_new_ref, pre, has=has, **kernel_kw)


def forward_stacked(
    t: jax.Array,
    s: jax.Array,
    w3: jax.Array,
    z_all: jax.Array | None,
    bias2: jax.Array,
    xproj_all: jax.Array | None,
    keep_all: jax.Array | None,
    packed_all: jax.Array,
    *,
    layer: int,
    keep: float = 1.0,
    geo: Geometry,
    config: HighwayConfig = HighwayConfig(),
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """:func:`forward_padded` of micro-layer (t, layer) on stacked operands: ONE launch, no
    slice or update-slice around it.

    Args:
      t: int32 scalar (traced: the scan's time index), 0 <= t < T (not checked in the kernel).
      s: [b_pad, n_pad] f32 input state (the carry).
      w3, bias2: this layer's, as in :func:`forward_padded`.
      z_all: [T, L, b_pad, n_pad] f32, or None; read at [t, layer].
      xproj_all: [T, b_pad, 2, n_pad] f32, or None (pass it at layer 0 only); read at [t].
      keep_all: [T, L, b_pad, n_pad] int8 (0/1) or f32 masks, or None; read at [t, layer].
      packed_all: [T, L, b_pad, 3, n_pad] f32, ALIASED to the second output (donate it: carry
        it through the scan and never use the input value again).
      layer: static layer index into the L axis.
    Returns:
      s_new [b_pad, n_pad] f32, and packed_all with ``[t, layer] = (s, pre_h, pre_t)`` (the
      input state and ``pre = s @ w`` of :func:`forward_padded`), every other entry unchanged.
    """
    _validate_config(config, w3.dtype)
    bb, bn, n_pad, b_pad = geo.block_b, geo.block_n, geo.n_pad, geo.b_pad
    rows = (b_pad, n_pad)
    if packed_all.ndim != 5:
        raise ValueError(f"packed_all must be [T, L, b_pad, 3, n_pad], got {packed_all.shape}.")
    steps, depth = packed_all.shape[:2]
    if not 0 <= layer < depth:
        raise ValueError(f"layer must be in [0, {depth}), got {layer}.")
    _check("packed_all", packed_all, (steps, depth, b_pad, 3, n_pad), (_F32,))
    _check("s", s, rows, (_F32,))
    _check("w3", w3, (n_pad, 2, n_pad))
    _check("z_all", z_all, (steps, depth, *rows), (_F32,))
    _check("bias2", bias2, (2, n_pad), (_F32,))
    _check("xproj_all", xproj_all, (steps, b_pad, 2, n_pad), (_F32,))
    _check("keep_all", keep_all, (steps, depth, *rows), _MASK_DTYPES)
    has = _Has(z=z_all is not None, xproj=xproj_all is not None, mask=keep_all is not None)
    tl = (steps, depth)
    args = [_check_time(t), s, w3, w3, bias2]
    in_specs = [
        _t_spec(),
        pl.BlockSpec((bb, n_pad), lambda i, j: (i, 0)),
        pl.BlockSpec((n_pad, _SQUEEZED, bn), lambda i, j: (0, 0, j)),
        pl.BlockSpec((n_pad, _SQUEEZED, bn), lambda i, j: (0, 1, j)),
        pl.BlockSpec((2, bn), lambda i, j: (0, j)),
    ]
    rows_spec = _lead_spec(tl, (bb, bn), lambda i, j: (i, j))
    for x, spec in (
        (z_all, rows_spec),
        (xproj_all, _lead_spec((steps,), (bb, 2, bn), lambda i, j: (i, 0, j))),
        (keep_all, rows_spec),
    ):
        if x is not None:
            args.append(x)
            in_specs.append(spec)
    packed_spec = _lead_spec(tl, (bb, 3, bn), lambda i, j: (i, 0, j))
    args.append(packed_all)
    in_specs.append(packed_spec)
    kernel = functools.partial(
        _forward_stacked_kernel,
        has=has,
        layer=layer,
        block_k=geo.block_k,
        precision=_dot_precision(w3.dtype, config.allow_tf32),
        mask_scale=_mask_scale(keep_all, keep),
    )
    s_new, packed_all = pl.pallas_call(
        kernel,
        grid=geo.grid,
        in_specs=in_specs,
        out_specs=[pl.BlockSpec((bb, bn), lambda i, j: (i, j)), packed_spec],
        out_shape=[jax.ShapeDtypeStruct(rows, _F32), jax.ShapeDtypeStruct(packed_all.shape, _F32)],
        input_output_aliases={len(args) - 1: 1},
        compiler_params=_compiler_params(config),
        interpret=interpret,
        name="highway_forward_stacked",
    )(*args)
    return s_new, packed_all


def _backward_stacked_kernel(
    t_ref, *refs, has: _Has, layer: int, steps: int, depth: int, **kernel_kw
):
    """`_backward_kernel` (GEMM + elementwise) on the (t, layer) slices of stacked operands.

    The GEMM reads ``d_scaled`` of the layer above from the (aliased) stacked buffer at
    (t, layer + 1), or at (t + 1, 0) for the last layer (zero contribution when t + 1 == T).
    Refs: t_ref [1]; d_all_in [T, L, block_b, 2, n_pad]; wt_h_ref, wt_t_ref [n_pad, block_n];
    ds_carry_above_ref [block_b, block_n] if has.ds_carry_above; g_ref [T, L, block_b,
    block_n] if has.g; packed_ref [T, L, block_b, 3, block_n]; bias_ref [2, block_n]; z_ref,
    mask_ref [T, L, block_b, block_n], xproj_ref [T, block_b, 2, block_n] if present;
    dz_in [T, L, block_b, block_n] if has.z (aliased); dbias_in [L, 2, block_n] (aliased);
    outputs: d_all_out [T, L, block_b, 2, block_n], ds_carry_ref [block_b, block_n],
    dz_out if has.z, dbias_out [L, 2, block_n].
    """
    t = t_ref[0]
    refs = list(refs)
    d_all_in, wt_h_ref, wt_t_ref = refs[:3]
    del refs[:3]
    carry_ref = _pop(refs, has.ds_carry_above)
    g_ref = _pop(refs, has.g)
    packed_ref, bias_ref = refs[:2]
    del refs[:2]
    z_ref = _pop(refs, has.z)
    xproj_ref = _pop(refs, has.xproj)
    mask_ref = _pop(refs, has.mask)
    _ = _pop(refs, has.z)  # dz_in: aliased, never read
    dbias_in = refs.pop(0)
    d_all_out, ds_carry_ref = refs[:2]
    del refs[:2]
    dz_out = _pop(refs, has.z)
    (dbias_out,) = refs

    if layer + 1 < depth:
        t_above, l_above, valid = t, layer + 1, None
    else:
        t_above, l_above, valid = jnp.minimum(t + 1, steps - 1), 0, t + 1 < steps
    d_h = _View(d_all_in, (t_above, l_above, _FREE, 0, _FREE))
    d_t = _View(d_all_in, (t_above, l_above, _FREE, 1, _FREE))
    ds = _state_grad_in_kernel(d_h, d_t, wt_h_ref, wt_t_ref, kernel_kw["block_k"],
                               kernel_kw["precision"])  # fmt: skip
    if valid is not None:
        ds = jnp.where(valid, ds, 0.0)
    if carry_ref is not None:
        ds = ds + carry_ref[...]
    tl4 = (t, layer, _FREE, _FREE)
    views = [_Value(ds)]  # `_backward_kernel` without the GEMM takes the state gradient as a "ref"
    if has.g:
        views.append(_View(g_ref, tl4))
    views += [
        _View(packed_ref, (t, layer, _FREE, 0, _FREE)),
        _View(packed_ref, (t, layer, _FREE, _FREE, _FREE), shift={1: 1}),
        bias_ref,
    ]
    if has.z:
        views.append(_View(z_ref, tl4))
    if has.xproj:
        views.append(_View(xproj_ref, (t, _FREE, _FREE, _FREE)))
    if has.mask:
        views.append(_View(mask_ref, tl4))
    views += [_View(d_all_out, (t, layer, _FREE, _FREE, _FREE)), ds_carry_ref]
    if has.z:
        views.append(_View(dz_out, tl4))
    views.append(_View(dbias_out, (layer, _FREE, _FREE), acc_from=dbias_in))
    _backward_kernel(*views, has=has, gemm=False, elementwise=True, scale_da=True, **kernel_kw)


class _Value:
    """A computed value posing as a ref for ``ref[...]`` (the state gradient of the GEMM)."""

    def __init__(self, value):
        self.value = value

    def __getitem__(self, idx):
        if idx is not Ellipsis:
            raise NotImplementedError("_Value supports [...] only")
        return self.value


def backward_fused_stacked(
    t: jax.Array,
    d_scaled_all: jax.Array,
    w_t_above: jax.Array,
    ds_carry_above: jax.Array | None,
    g_all: jax.Array | None,
    packed_all: jax.Array,
    z_all: jax.Array | None,
    bias2: jax.Array,
    xproj_all: jax.Array | None,
    keep_all: jax.Array | None,
    dz_all: jax.Array | None,
    dbias_acc: jax.Array,
    *,
    layer: int,
    keep: float = 1.0,
    geo: Geometry,
    config: HighwayConfig = HighwayConfig(),
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array, jax.Array | None, jax.Array]:
    """:func:`backward_fused_padded` of micro-layer (t, layer) on stacked operands: ONE launch.

    The layer above is (t, layer + 1), or (t + 1, 0) for the last layer; its ``d_scaled`` is
    read from ``d_scaled_all`` itself (so it is no separate operand), and for t + 1 == T the
    GEMM term is zero (the first call of the reverse loop; no read of uninitialized data is
    used).

    Args:
      t: int32 scalar (traced), 0 <= t < T (not checked in the kernel).
      d_scaled_all: [T, L, b_pad, 2, n_pad] f32, ALIASED to output 0; [t, layer] is written.
      w_t_above: [2, n_pad, n_pad] the layer above's ``w_t`` (``w_t[0]`` for the last layer).
      ds_carry_above: [b_pad, n_pad] f32 ``ds_carry`` of the layer above (the carry), or None.
      g_all: [T, L, b_pad, n_pad] f32 zero-padded cotangents, or None; read at [t, layer].
      packed_all: [T, L, b_pad, 3, n_pad] f32 from :func:`forward_stacked` (read only).
      z_all, bias2, xproj_all, keep_all, keep: as in :func:`forward_stacked`.
      dz_all: [T, L, b_pad, n_pad] f32, ALIASED to output 2; required iff ``z_all`` is given.
      dbias_acc: [L, b_pad // block_b, 2, n_pad] f32, ALIASED to output 3: this call ADDS its
        per-batch-block column sums of ``da`` to ``[layer]``.
      layer: static layer index.
    Returns:
      (d_scaled_all, ds_carry [b_pad, n_pad], dz_all | None, dbias_acc), the stacked ones
      updated at (t, layer) only.
    """
    depth = d_scaled_all.shape[1] if d_scaled_all.ndim == 5 else 0
    steps = d_scaled_all.shape[0]
    if d_scaled_all.ndim != 5 or not 0 <= layer < depth:
        raise ValueError(
            f"d_scaled_all must be [T, L, b_pad, 2, n_pad] with 0 <= layer < L, got "
            f"{d_scaled_all.shape} and layer {layer}."
        )
    if (z_all is None) != (dz_all is None):
        raise ValueError("dz_all must be given exactly when z_all is.")
    bb, bn, n_pad, b_pad = geo.block_b, geo.block_n, geo.n_pad, geo.b_pad
    rows, tl = (b_pad, n_pad), (steps, depth)
    _validate_config(config, w_t_above.dtype)
    _check("d_scaled_all", d_scaled_all, (*tl, b_pad, 2, n_pad), (_F32,))
    _check("w_t_above", w_t_above, (2, n_pad, n_pad))
    _check("ds_carry_above", ds_carry_above, rows, (_F32,))
    _check("g_all", g_all, (*tl, *rows), (_F32,))
    _check("packed_all", packed_all, (*tl, b_pad, 3, n_pad), (_F32,))
    _check("z_all", z_all, (*tl, *rows), (_F32,))
    _check("bias2", bias2, (2, n_pad), (_F32,))
    _check("xproj_all", xproj_all, (steps, b_pad, 2, n_pad), (_F32,))
    _check("keep_all", keep_all, (*tl, *rows), _MASK_DTYPES)
    _check("dz_all", dz_all, (*tl, *rows), (_F32,))
    _check("dbias_acc", dbias_acc, (depth, geo.grid[0], 2, n_pad), (_F32,))
    has = _Has(
        z=z_all is not None,
        xproj=xproj_all is not None,
        mask=keep_all is not None,
        g=g_all is not None,
        ds_carry_above=ds_carry_above is not None,
    )
    block_rows = pl.BlockSpec((bb, bn), lambda i, j: (i, j))
    rows_spec = _lead_spec(tl, (bb, bn), lambda i, j: (i, j))
    d_out_spec = _lead_spec(tl, (bb, 2, bn), lambda i, j: (i, 0, j))
    dbias_spec = pl.BlockSpec((depth, _SQUEEZED, 2, bn), lambda i, j: (0, i, 0, j))
    args = [_check_time(t), d_scaled_all, w_t_above, w_t_above]
    in_specs = [
        _t_spec(),
        _lead_spec(tl, (bb, 2, n_pad), lambda i, j: (i, 0, 0)),
        pl.BlockSpec((_SQUEEZED, n_pad, bn), lambda i, j: (0, 0, j)),
        pl.BlockSpec((_SQUEEZED, n_pad, bn), lambda i, j: (1, 0, j)),
    ]
    optional = (
        (ds_carry_above, block_rows),
        (g_all, rows_spec),
        (packed_all, _lead_spec(tl, (bb, 3, bn), lambda i, j: (i, 0, j))),
        (bias2, pl.BlockSpec((2, bn), lambda i, j: (0, j))),
        (z_all, rows_spec),
        (xproj_all, _lead_spec((steps,), (bb, 2, bn), lambda i, j: (i, 0, j))),
        (keep_all, rows_spec),
        (dz_all, rows_spec),
        (dbias_acc, dbias_spec),
    )
    for x, spec in optional:
        if x is not None:
            args.append(x)
            in_specs.append(spec)
    out_specs = [d_out_spec, block_rows]
    out_shape = [jax.ShapeDtypeStruct(d_scaled_all.shape, _F32), jax.ShapeDtypeStruct(rows, _F32)]
    aliases = {1: 0}
    if dz_all is not None:
        out_specs.append(rows_spec)
        out_shape.append(jax.ShapeDtypeStruct(dz_all.shape, _F32))
        aliases[len(args) - 2] = 2
    out_specs.append(dbias_spec)
    out_shape.append(jax.ShapeDtypeStruct(dbias_acc.shape, _F32))
    aliases[len(args) - 1] = len(out_shape) - 1
    kernel = functools.partial(
        _backward_stacked_kernel,
        has=has,
        layer=layer,
        steps=steps,
        depth=depth,
        block_k=geo.block_k,
        precision=_dot_precision(w_t_above.dtype, config.allow_tf32),
        mask_scale=_mask_scale(keep_all, keep),
    )
    outs = pl.pallas_call(
        kernel,
        grid=geo.grid,
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        input_output_aliases=aliases,
        compiler_params=_compiler_params(config),
        interpret=interpret,
        name="highway_backward_fused_stacked",
    )(*args)
    dz = outs[2] if dz_all is not None else None
    return outs[0], outs[1], dz, outs[-1]


# --- references for the padded kernels (pure jnp, same padded layout) --------------------------


def _ref_dot(x, w, dims):
    precision = _dot_precision(w.dtype, allow_tf32=False)
    return jnp.einsum(dims, x.astype(w.dtype), w, precision=precision, preferred_element_type=_F32)


def _ref_mask(keep_mask, keep):
    if keep_mask is None:
        return None
    return keep_mask.astype(_F32) * _mask_scale(keep_mask, keep)


def _ref_combine(a, s, m):
    """s_new from a [b, 2, n] and s [b, n]; m the f32 dropout multiplier or None."""
    h, t = jnp.tanh(a[:, 0]), jax.nn.sigmoid(a[:, 1])
    gate = t if m is None else t * m
    return h * gate + s * (1.0 - t)


def _ref_a(u, z, bias2, extra):
    a = u if z is None else u * z[:, None, :]
    a = a + bias2[None]
    return a if extra is None else a + extra


def forward_padded_reference(s, w3, z, bias2, xproj, keep_mask, *, keep=1.0, extra=None):
    """Pure-jnp :func:`forward_padded` on the same padded operands: ``(s_new, pre)``."""
    pre = _ref_dot(s, w3, "bk,khj->bhj")
    u = pre if xproj is None else pre + xproj
    return _ref_combine(_ref_a(u, z, bias2, extra), s, _ref_mask(keep_mask, keep)), pre


def backward_padded_reference(
    ds, s, pre, z, bias2, xproj, keep_mask, *, g=None, keep=1.0, extra=None, scale_da=True
):
    """Pure-jnp :func:`backward_padded`, derived by autodiff of the forward combine.

    ``dbias_partial`` is returned with a single row (the column sums over all rows): compare
    it with the kernel's partial sums summed over axis 0.
    """
    m = _ref_mask(keep_mask, keep)
    u = pre if xproj is None else pre + xproj
    zeros = jnp.zeros_like(pre)

    def f(a_add, s_, u_, z_):
        return _ref_combine(_ref_a(u_, z_, bias2, extra) + a_add, s_, m)

    z_arg = jnp.ones_like(s) if z is None else z
    _, vjp = jax.vjp(f, zeros, s, u, z_arg)
    cot = ds if g is None else ds + g
    da, ds_carry, du, dz = vjp(cot)
    d_out = du if scale_da else da
    return d_out, ds_carry, (None if z is None else dz), jnp.sum(da, axis=0)[None]


def state_grad_reference(d_scaled, w_t, ds_carry, g=None):
    """Pure-jnp :func:`state_grad_padded`: ``ds_carry + d_scaled @ W^T (+ g)``."""
    ds = _ref_dot(d_scaled, w_t, "bhk,hkj->bj")
    if ds_carry is not None:
        ds = ds + ds_carry
    return ds if g is None else ds + g


def backward_fused_reference(
    d_scaled_above, w_t_above, ds_carry_above, g, s, pre, z, bias2, xproj, keep_mask, *,
    keep=1.0, extra=None,
):  # fmt: skip
    """Pure-jnp :func:`backward_fused_padded`: the GEMM, then the elementwise backward."""
    ds = state_grad_reference(d_scaled_above, w_t_above, ds_carry_above, g)
    return backward_padded_reference(ds, s, pre, z, bias2, xproj, keep_mask, keep=keep, extra=extra)


# --- legacy unpadded API (pads and unpads per call) --------------------------------------------


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
    return None if x is None else geo.pad_rows(x.astype(_F32))


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
    config: HighwayConfig = HighwayConfig(),
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
        geo.pad_rows(s.astype(_F32)),
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
    config: HighwayConfig = HighwayConfig(),
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
    _check_shapes(s, jax.ShapeDtypeStruct((n, 2 * n), _F32), z, bias, extra, mask)
    geo = Geometry.make(config, batch, n)
    da, ds_carry, dz, _ = backward_padded(
        geo.pad_rows(ds_new.astype(_F32)),
        geo.pad_rows(s.astype(_F32)),
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
    """Differentiable fused highway step (legacy API); returns ``s_new [B, n] f32``.

    Gradients flow to ``s``, ``w``, ``z``, ``bias``, ``extra`` (and ``mask``). The forward
    and the gate backward are Triton kernels; ``d_pre @ w.T`` and ``s.T @ d_pre`` are XLA dots
    with f32 accumulation whose inputs are cast to ``w.dtype`` (so with bf16 weights, ``d_pre``
    is rounded to bf16 for them, and ``dw`` is returned in bf16).
    """
    return _highway_step(config, interpret, s, w, z, bias, extra, mask)


# --- legacy references -------------------------------------------------------------------------


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


def cuda_lowering_device(device_kind: str = "NVIDIA H100 80GB HBM3", num_cores: int = 132):
    """Context naming a GPU as the abstract device, to trace AND lower Triton kernels for
    CUDA on a host without a GPU (``jit(f).trace(...).lower(lowering_platforms=("cuda",))``).

    Since jax 0.11 the Triton lowering asks for the GPU's compute capability and, without a
    GPU, takes it from the abstract mesh's device ("No supported GPU devices found"
    otherwise); jax 0.10.2 accepts the context and does not need it. The mesh is recorded at
    trace time, so wrap the trace too, not only the lowering.
    """
    device = jax.sharding.AbstractDevice(
        device_kind=device_kind, num_cores=num_cores, platform="gpu"
    )
    mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)
    return jax.sharding.use_abstract_mesh(mesh)
