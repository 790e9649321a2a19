"""Gate-dropout masks as uint8 keep decisions: what the persistent kernels read, and the one
place that turns a decision into the mask value.

A mask operand is ``[P, b_pad, n_pad] uint8`` (1 keep, 0 drop), a quarter of the bytes of
the f32 mask (0 or 1/keep) it replaces. Inside a kernel a block TMA-loads its ``[rows, u]``
tile into shared memory and `load_values` turns it into the f32 values; the references
call `mask_values`. Both multiply the decision by `mask_scale` (the f32 ``1 / keep``), so
kernel and reference agree to the bit, and with the f32 mask ``decision / keep`` (a 0 / 1
decision times the correctly rounded reciprocal is that reciprocal, or 0).
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import mosaic_gpu as plgpu
from rhhjax.kernels.mosaic.plan import PersistentPlan, PlanError

Array = jax.Array
DTYPE = jnp.uint8
# A TMA box's minor extent must be a multiple of 16 bytes: u uint8 units a row.
TMA_ROW_BYTES = 16
# The vector width of an f32 [rows, u] tile's default strided layout (8 bytes a thread);
# the uint8 tile is loaded in the same layout, so the two combine elementwise.
_F32_VEC = 2
# jax 0.10's plgpu.load(ref, idx, *, layout); later releases dropped idx.
_LOAD_TAKES_INDEX = "idx" in inspect.signature(plgpu.load).parameters


def mask_scale(keep: float) -> float:
    """The f32 value of a kept unit, ``1 / keep`` rounded once to float32 (as XLA divides)."""
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"keep must be in (0, 1], got {keep}")
    return float(np.float32(1.0) / np.float32(keep))


def decisions(keep_decisions: Array | None) -> Array | None:
    """Keep decisions (bool or integer, any shape) -> uint8 (1 keep, 0 drop), or None."""
    return None if keep_decisions is None else keep_decisions.astype(DTYPE)


def mask_values(mask: Array | None, keep: float) -> Array | None:
    """uint8 decisions [...] -> the f32 mask (0 or `mask_scale`), or None: the references'
    side of `load_values`."""
    return None if mask is None else mask.astype(jnp.float32) * mask_scale(keep)


def load_strided(smem_ref) -> Array:
    """A [rows, u] shared-memory tile -> its values in the f32 tiles' strided layout
    (2-element vectors), inside a Mosaic GPU kernel: how the persistent kernels read every
    staged tile. The explicit layout also keeps jax 0.11's layout inference from tiling a
    staged buffer, which would refuse an unpadded TMA source (z: 1000 units are not a
    multiple of a 32-column tile)."""
    layout = plgpu.Layout.WG_STRIDED(tuple(smem_ref.shape), vec_size=_F32_VEC)
    if _LOAD_TAKES_INDEX:
        return plgpu.load(smem_ref, (), layout=layout)
    return plgpu.load(smem_ref, layout=layout)


def load_values(mask_smem, keep: float) -> Array:
    """A uint8 [rows, u] shared-memory tile -> f32 values [rows, u] in the layout of the
    kernel's f32 tiles (`load_strided`), inside a Mosaic GPU kernel."""
    return load_strided(mask_smem).astype(jnp.float32) * mask_scale(keep)


def check_plan(plan: PersistentPlan, kernel: str) -> None:
    """One-line `PlanError` unless a block's uint8 mask tile is a legal TMA box (``u`` a
    multiple of 16 bytes) and splits into the strided layout (``rows * u`` a multiple of
    256 elements)."""
    u, rows = plan.units_per_block, plan.rows_per_block
    if u % TMA_ROW_BYTES or (rows * u) % (128 * _F32_VEC):
        raise PlanError(
            f"persistent {kernel} with a dropout mask needs units_per_block a multiple of "
            f"{TMA_ROW_BYTES} (uint8 TMA rows), got {u}: choose col_blocks so it is."
        )


def check_operand(mask: Array | None, shape: tuple[int, ...], kernel: str) -> None:
    """One-line `PlanError` unless ``mask`` is None or uint8 of ``shape``."""
    if mask is None:
        return
    if tuple(mask.shape) != tuple(shape) or jnp.dtype(mask.dtype) != jnp.dtype(DTYPE):
        raise PlanError(
            f"persistent {kernel}: mask is {jnp.dtype(mask.dtype).name}{list(mask.shape)}, "
            f"expected uint8{list(shape)} (keep decisions; see kernels/mosaic/keep_mask.py)."
        )
