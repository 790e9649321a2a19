"""The padded layout of the whole-sequence recurrence, shared by every implementation.

:class:`Geometry` holds the effective block sizes and padded extents of one problem size
(hashable, static) and the padding helpers. ``B`` is padded up to ``b_pad`` (a multiple of
``block_b``) and ``n`` up to ``n_pad`` (a multiple of ``block_n`` and ``block_k``) with zeros.
Arrays with two halves (h and t) are ``[..., 2, n_pad]``, so that ``x2[..., half, u]`` is
``x[..., half * n + u]``; the forward weight is ``w3 [n_pad, 2, n_pad]`` (``w3[k, half, j] =
w[k, half * n + j]``) and the state-gradient weight ``w_t [2, n_pad, n_pad]`` (``w_t[half, k,
j] = w[j, half * n + k]``). States, gates and accumulations are float32 (``F32``) whatever the
matmul dtype.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Protocol

import jax
import jax.numpy as jnp

F32 = jnp.float32  # the dtype of states, gates and accumulations


class BlockSizes(Protocol):
    """What :meth:`Geometry.make` reads of a kernel config (e.g. the Triton op's)."""

    block_b: int
    block_n: int
    block_k: int

    def validate(self) -> None: ...


def round_up(x: int, multiple: int) -> int:
    """``x`` rounded up to a multiple of ``multiple``."""
    return -(-x // multiple) * multiple


def _next_power_of_2(x: int) -> int:
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


def _clamp_block(block: int, size: int) -> int:
    """Shrinks a block to the next power of two >= size (but never below 16)."""
    return min(block, max(16, _next_power_of_2(size)))


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
    recurrence: the Triton kernels' (:meth:`make`), the XLA ``fused`` path's
    (:meth:`for_units`: units only, no batch padding) and the Mosaic kernels' (built directly).

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
    def make(cls, config: BlockSizes, batch: int, n: int) -> Geometry:
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
            b_pad=round_up(batch, block_b),
            n_pad=round_up(n, math.lcm(block_n, block_k)),
        )

    @classmethod
    def for_units(cls, batch: int, n: int, unit_multiple: int) -> Geometry:
        """``n`` rounded up to a multiple of ``unit_multiple``, the batch unpadded (one block
        of ``batch`` rows, unit blocks of ``unit_multiple``): the layout of the XLA path."""
        if batch < 1 or n < 1:
            raise ValueError(f"Geometry needs batch >= 1 and n >= 1, got {batch} and {n}.")
        n_pad = round_up(n, unit_multiple)
        return cls(batch, n, batch, unit_multiple, unit_multiple, batch, n_pad)

    @property
    def grid(self) -> tuple[int, int]:
        """(batch blocks, unit blocks)."""
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
