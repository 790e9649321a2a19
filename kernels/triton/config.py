"""Block sizes of the highway kernels, their validation, and the padded layout.

:class:`HighwayConfig` holds the tuning knobs (block sizes, Triton warps and stages);
:class:`Geometry` the effective block sizes and padded extents of one problem size, with the
padding helpers. Padded layout: ``B`` is padded up
to ``b_pad`` (a multiple of ``block_b``) and ``n`` up to ``n_pad`` (a multiple of ``block_n``
and ``block_k``) with zeros; arrays with two halves (h and t) are ``[..., 2, n_pad]``, the
forward weight is ``w3 [n_pad, 2, n_pad]`` and the state-gradient weight ``w_t [2, n_pad,
n_pad]`` (see :mod:`rhhjax.kernels.highway`).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from rhhjax.errors import UserError

# H100 (sm_90) opt-in shared memory per block, bytes.
H100_SMEM_PER_BLOCK = 232_448


class KernelConfigError(UserError):
    """A :class:`HighwayConfig` that Triton cannot lower or an H100 cannot run."""


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

    def validate(self, dot_dtype=None) -> None:
        """Raises :class:`KernelConfigError` (one line) for block sizes Triton cannot lower,
        or (with ``dot_dtype``, the dtype of the weights) a config that needs more shared
        memory than an H100 block has. Every kernel wrapper and :meth:`Geometry.make` call it.
        """
        for name in ("block_b", "block_n", "block_k"):
            value = getattr(self, name)
            if not _is_pow2(value) or value < 16:
                raise KernelConfigError(
                    f"HighwayConfig.{name} must be a power of two >= 16, got {value}."
                )
        if not _is_pow2(self.num_warps):
            raise KernelConfigError(
                f"HighwayConfig.num_warps must be a power of two, got {self.num_warps}."
            )
        if self.num_stages < 1:
            raise KernelConfigError(
                f"HighwayConfig.num_stages must be >= 1, got {self.num_stages}."
            )
        if dot_dtype is not None:
            need = self.smem_bytes(dot_dtype)
            if need > H100_SMEM_PER_BLOCK:
                raise KernelConfigError(
                    f"HighwayConfig {self} needs ~{need} B of shared memory with "
                    f"{jnp.dtype(dot_dtype).name} weights, over the H100's "
                    f"{H100_SMEM_PER_BLOCK} B per block: lower num_stages or the block sizes."
                )


DEFAULT_CONFIG = HighwayConfig()  # the kernels' default (an argument default: B008)


def _is_pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


def validate_config(config: HighwayConfig, dot_dtype=None) -> None:
    """Raises :class:`KernelConfigError` (one line) for a config Triton cannot lower or that
    needs more shared memory than an H100 block has with ``dot_dtype`` weights (checked when
    given). The same as ``config.validate(dot_dtype)``."""
    config.validate(dot_dtype)


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
    """The padded layout of one problem size: effective block sizes and padded extents
    (hashable, static), with the padding helpers. The ONE layout of the whole-sequence
    recurrence: the Pallas kernels' (:meth:`make`) and the XLA ``fused`` path's
    (:meth:`for_units`: units only, no batch padding).

    ``grid = (b_pad // block_b, n_pad // block_n)``.
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
        config.validate()
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

    @classmethod
    def for_units(cls, batch: int, n: int, unit_multiple: int) -> Geometry:
        """``n`` rounded up to a multiple of ``unit_multiple``, the batch unpadded (one block
        of ``batch`` rows, unit blocks of ``unit_multiple``): the layout of the XLA path."""
        if batch < 1 or n < 1:
            raise ValueError(f"Geometry needs batch >= 1 and n >= 1, got {batch} and {n}.")
        n_pad = _round_up(n, unit_multiple)
        return cls(batch, n, batch, unit_multiple, unit_multiple, batch, n_pad)

    @property
    def grid(self) -> tuple[int, int]:
        return (self.b_pad // self.block_b, self.n_pad // self.block_n)

    # --- padding helpers: all accept leading axes ([T, L, ...], [L, ...]) -------------------

    def pad_rows(self, x: jax.Array | None) -> jax.Array | None:
        """[..., B, n] -> [..., b_pad, n_pad], dtype kept (f32 states, int8 masks); None
        stays None."""
        return None if x is None else _pad_trailing(x, (self.b_pad, self.n_pad))

    def pad_halves(self, x: jax.Array) -> jax.Array:
        """[..., B, 2n] -> [..., b_pad, 2, n_pad], dtype kept (the h and t halves aligned)."""
        x = x.reshape(*x.shape[:-1], 2, self.n)
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
        """[..., 2n] -> [..., 2, n_pad], dtype kept."""
        b2 = b.reshape(*b.shape[:-1], 2, self.n)
        return _pad_trailing(b2, (2, self.n_pad))

    def unpad_rows(self, x: jax.Array) -> jax.Array:
        """[..., b_pad, n_pad] -> [..., B, n]."""
        return x[..., : self.batch, : self.n]

    def unpad_halves(self, x: jax.Array) -> jax.Array:
        """[..., b_pad, 2, n_pad] -> [..., B, 2n]."""
        x = x[..., : self.batch, :, : self.n]
        return x.reshape(*x.shape[:-3], self.batch, 2 * self.n)

    def unpad_bias(self, b: jax.Array) -> jax.Array:
        """[..., 2, n_pad] -> [..., 2n]."""
        b = b[..., : self.n]
        return b.reshape(*b.shape[:-2], 2 * self.n)

    def unpad_weight(self, w: jax.Array) -> jax.Array:
        """[..., n_pad, 2, n_pad] -> [..., n, 2n] (the inverse of :meth:`pad_weight`)."""
        w = w[..., : self.n, :, : self.n]
        return w.reshape(*w.shape[:-3], self.n, 2 * self.n)
