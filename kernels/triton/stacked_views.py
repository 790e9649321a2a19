"""Kernel refs seen at the (t, layer) slice of stacked ``[T, L, ...]`` arrays.

The stacked kernels (:mod:`rhhjax.kernels.triton.stacked`) read and write the slice of the time step
``t`` (a traced index, passed as a shape-(1,) array) and the static ``layer`` inside the kernel,
through :class:`View`; :class:`Value` lets a computed value stand where a kernel body reads a
ref. :func:`time_spec` and :func:`lead_spec` are the BlockSpecs of the time index and of arrays
whose leading (T, L) dims stay whole.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

FREE = object()  # a free position of a `View` template


class View:
    """A kernel ref seen at fixed indices: ``template`` holds one entry per ref axis, a fixed
    index (int or traced scalar) or ``FREE``; the view's axes are the free ones, in order.
    ``shift`` adds an offset to integer indices of a view axis (e.g. the halves of ``pre``
    stored after the input state in ``packed``). With ``acc_from`` (a ref of the same block),
    a store adds the value read from ``acc_from`` at the same place (in-place accumulation).
    """

    def __init__(self, ref, template, shift=None, acc_from=None):
        self.ref, self.template, self.shift, self.acc_from = ref, template, shift or {}, acc_from
        free = [d for d, x in zip(ref.shape, template, strict=True) if x is FREE]
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
        return tuple(next(it) if x is FREE else x for x in self.template)

    def __getitem__(self, idx):
        return self.ref[self._index(idx)]

    def __setitem__(self, idx, value):
        full = self._index(idx)
        if self.acc_from is not None:
            value = self.acc_from[full] + value
        self.ref[full] = value


def time_spec():
    """BlockSpec of the time index ``t`` (a shape-(1,) int32 array), the same for every program."""
    return pl.BlockSpec((1,), lambda i, j: (0,))


def lead_spec(lead: tuple[int, ...], block: tuple, index):
    """BlockSpec keeping the leading dims ``lead`` whole; ``index(i, j)`` the trailing ones."""
    zeros = (0,) * len(lead)
    return pl.BlockSpec((*lead, *block), lambda i, j: (*zeros, *index(i, j)))


def check_time(t: jax.Array) -> jax.Array:
    """An integer scalar (or shape-(1,)) time index as the kernels' int32 [1] operand."""
    t = jnp.asarray(t)
    if t.shape not in ((), (1,)) or not jnp.issubdtype(t.dtype, jnp.integer):
        raise ValueError(f"t must be an integer scalar, got {t.dtype} {t.shape}.")
    return t.astype(jnp.int32).reshape(1)


class Value:
    """A computed value posing as a ref for ``ref[...]`` (the state gradient of the GEMM)."""

    def __init__(self, value):
        self.value = value

    def __getitem__(self, idx):
        if idx is not Ellipsis:
            raise NotImplementedError("Value supports [...] only")
        return self.value
