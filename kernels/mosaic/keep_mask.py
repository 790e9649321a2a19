"""Gate-dropout masks as uint8 keep decisions [P, b_pad, n_pad] (1 keep, 0 drop), a quarter
of the f32 mask's bytes. Kernels (`load_values`) and references (`mask_values`) both
multiply by `mask_scale`, the f32 1 / keep, so they agree to the bit."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import mosaic_gpu as plgpu
from rhhjax.kernels.mosaic.plan import PersistentPlan, PlanError

Array = jax.Array
DTYPE = jnp.uint8
TMA_ROW_BYTES = 16  # a TMA box's minor extent is a multiple of 16 bytes
_F32_VEC = 2  # the f32 tiles' strided layout vector, which the uint8 tile shares
# jax 0.10's plgpu.load(ref, idx, *, layout); later releases dropped idx.
_LOAD_TAKES_INDEX = "idx" in inspect.signature(plgpu.load).parameters


def mask_scale(keep: float) -> float:
    """1 / keep rounded once to float32, as XLA divides."""
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"keep must be in (0, 1], got {keep}")
    return float(np.float32(1.0) / np.float32(keep))


def decisions(keep_decisions: Array | None) -> Array | None:
    """Keep decisions (bool or integer) -> uint8, or None."""
    return None if keep_decisions is None else keep_decisions.astype(DTYPE)


def mask_values(mask: Array | None, keep: float) -> Array | None:
    """uint8 decisions -> the f32 mask (0 or `mask_scale`), or None."""
    return None if mask is None else mask.astype(jnp.float32) * mask_scale(keep)


def load(smem_ref, layout) -> Array:
    """A whole shared-memory ref in register ``layout`` (`plgpu.load` of jax 0.10 to 0.12)."""
    if _LOAD_TAKES_INDEX:
        return plgpu.load(smem_ref, (), layout=layout)
    return plgpu.load(smem_ref, layout=layout)


def load_strided(smem_ref) -> Array:
    """A [rows, u] shared-memory tile in the f32 tiles' strided layout (which also keeps
    jax 0.11's layout inference from tiling an unpadded TMA source)."""
    return load(smem_ref, plgpu.Layout.WG_STRIDED(tuple(smem_ref.shape), vec_size=_F32_VEC))


def load_values(mask_smem, keep: float, layout=None) -> Array:
    """A uint8 [rows, u] shared-memory tile -> f32 mask values in ``layout`` (or strided)."""
    tile = load_strided(mask_smem) if layout is None else load(mask_smem, layout)
    return tile.astype(jnp.float32) * mask_scale(keep)


def check_plan(plan: PersistentPlan, kernel: str) -> None:
    """PlanError unless the uint8 mask tile is a legal TMA box and fits the strided layout."""
    u, rows = plan.units_per_block, plan.rows_per_block
    if u % TMA_ROW_BYTES or (rows * u) % (128 * _F32_VEC):
        raise PlanError(
            f"persistent {kernel} with a dropout mask needs units_per_block a multiple of "
            f"{TMA_ROW_BYTES} (uint8 TMA rows), got {u}: choose col_blocks so it is."
        )


def check_operand(mask: Array | None, shape: tuple[int, ...], kernel: str) -> None:
    """PlanError unless ``mask`` is None or uint8 of ``shape``."""
    if mask is None:
        return
    if tuple(mask.shape) != tuple(shape) or jnp.dtype(mask.dtype) != jnp.dtype(DTYPE):
        raise PlanError(
            f"persistent {kernel}: mask is {jnp.dtype(mask.dtype).name}{list(mask.shape)}, "
            f"expected uint8{list(shape)} (keep decisions; see kernels/mosaic/keep_mask.py)."
        )
