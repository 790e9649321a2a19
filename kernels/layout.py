"""The padded layout of the whole-sequence recurrence, shared by every implementation.

`Geometry`: B padded to ``b_pad`` (a multiple of ``block_b``), n to ``n_pad`` (of
``block_n`` and ``block_k``); each implementation's ``geometry`` picks the blocks. Halves
are ``[..., 2, n_pad]``; weights ``w3 [n_pad, 2, n_pad]`` (``w3[k, h, j] = w[k, h * n +
j]``) and ``w_t [2, n_pad, n_pad]`` (``w_t[h, k, j] = w[j, h * n + k]``). States, gates
and accumulations are float32.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

F32 = jnp.float32


def round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def _pad_trailing(x: jax.Array, trailing: tuple[int, ...]) -> jax.Array:
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
    """The padded layout of one problem size (static), with the padding helpers."""

    batch: int
    n: int
    block_b: int
    block_n: int
    block_k: int
    b_pad: int
    n_pad: int

    @classmethod
    def for_units(cls, batch: int, n: int, unit_multiple: int) -> Geometry:
        """``n`` rounded up to ``unit_multiple``, batch unpadded: the XLA path's layout."""
        if batch < 1 or n < 1:
            raise ValueError(f"Geometry needs batch >= 1 and n >= 1, got {batch} and {n}.")
        n_pad = round_up(n, unit_multiple)
        return cls(batch, n, batch, unit_multiple, unit_multiple, batch, n_pad)

    def pad_rows(self, x: jax.Array | None) -> jax.Array | None:
        """[..., B, n] -> [..., b_pad, n_pad]; None stays None."""
        return None if x is None else _pad_trailing(x, (self.b_pad, self.n_pad))

    def pad_halves(self, x: jax.Array) -> jax.Array:
        """[..., B, 2n] -> [..., b_pad, 2, n_pad]."""
        x = x.reshape(*x.shape[:-1], 2, self.n)
        return _pad_trailing(x, (self.b_pad, 2, self.n_pad))

    def pad_weight(self, w: jax.Array, dtype) -> jax.Array:
        """[..., n, 2n] -> w3 [..., n_pad, 2, n_pad] in ``dtype``."""
        w3 = w.astype(dtype).reshape(*w.shape[:-1], 2, self.n)
        return _pad_trailing(w3, (self.n_pad, 2, self.n_pad))

    def pad_weight_t(self, w: jax.Array, dtype) -> jax.Array:
        """[..., n, 2n] -> w_t [..., 2, n_pad, n_pad] in ``dtype``."""
        w3 = w.astype(dtype).reshape(*w.shape[:-1], 2, self.n)  # [..., j, h, k]
        w_t = jnp.moveaxis(w3, -3, -1)  # [..., h, k, j]
        return _pad_trailing(w_t, (2, self.n_pad, self.n_pad))

    def pad_bias(self, b: jax.Array) -> jax.Array:
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
