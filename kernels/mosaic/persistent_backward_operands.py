"""The persistent backward kernel's weight layout, shape checks and shared-memory count
(`backward_smem_bytes`, `check_plan`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from rhhjax.kernels.hardware import H100
from rhhjax.kernels.layout import F32
from rhhjax.kernels.mosaic import gemm, keep_mask
from rhhjax.kernels.mosaic.persistent_backward_cell import bias_row_group, bias_rows, input_names
from rhhjax.kernels.mosaic.plan import (
    BIAS_ROWS,
    MBARRIER_BYTES,
    PersistentPlan,
    PlanError,
    layout_smem_bytes,
)

Array = jax.Array
MAX_TMA_ROWS = 256  # the most elements a TMA copy moves along a dimension
REDUCTION_SCRATCH_BYTES = 2048  # Mosaic GPU's default scratch for a reduction across warps


def _align(nbytes: int) -> int:
    return -(-nbytes // H100.smem_alignment) * H100.smem_alignment


def backward_smem_bytes(
    plan: PersistentPlan, has_z: bool = True, has_mask: bool = True, layout: str = "grid"
) -> int:
    """Shared memory per block of `persistent_backward` in ``layout`` (defaults: z, mask):
    the GEMM pipeline, the staged f32 epilogue tiles, mask, carry, accumulator, d_scaled, the
    column sums, each rounded to 1 KiB, and the mbarriers (the layout's too)."""
    rows, u, item = plan.rows_per_block, plan.units_per_block, plan.itemsize
    k_steps = 2 * plan.n_pad // plan.k_chunk
    stages = min(plan.stages, max(k_steps, 1))
    if plan.staged:
        stages = plan.staged_stages(k_steps)
    split_alloc, split_barriers = [], 0
    if plan.split_k:
        lead, rest = (plan.staged_stages(k) for k in gemm.SplitK.halves(k_steps))
        split_alloc = [rest * rows * plan.k_chunk * item, rest * u * plan.k_chunk * item]
        split_alloc.append(rows * u * 4)
        stages, split_barriers = lead, lead + 2 * rest + 2
    n_in, bias_row = len(input_names(has_z, plan.in_registers)), bias_rows(plan, has_z)
    tile = rows * u * 4
    barriers = n_in + has_mask + bias_row + plan.pipeline_barriers(stages) + split_barriers
    allocations = (
        stages * rows * plan.k_chunk * item,
        stages * u * plan.k_chunk * item,
        *split_alloc,
        0 if plan.in_registers else tile,
        tile,
        2 * rows * u * item,
        rows * u * has_mask,
        2 * bias_row_group(plan) * u * 4,
        BIAS_ROWS * u * 4 * bias_row,
    )
    tiles = sum(map(_align, allocations)) + _align(n_in * tile)
    if plan.in_registers and (plan.staged or plan.split_k):  # else under the scoped stages
        tiles += REDUCTION_SCRATCH_BYTES
    return tiles + MBARRIER_BYTES * barriers + layout_smem_bytes(layout)


def check_plan(
    plan: PersistentPlan, has_z: bool = True, has_mask: bool = True, layout: str = "grid"
) -> None:
    """PlanError unless the backward kernel can run ``plan``'s blocks (co-residency is the
    layout's): rows <= 256, ``u % 8 == 0``, K in whole chunks, shared memory within the limit."""
    if plan.rows_per_block > MAX_TMA_ROWS:
        raise PlanError(
            f"persistent backward needs rows_per_block <= {MAX_TMA_ROWS} (a TMA box), got "
            f"{plan.rows_per_block} (batch {plan.batch}): raise row_blocks."
        )
    if plan.units_per_block % 8:
        raise PlanError(
            f"persistent backward needs units_per_block % 8 == 0 (wgmma N), got "
            f"{plan.units_per_block} (width {plan.width}, col_blocks {plan.col_blocks})."
        )
    plan.check_backward_k()
    if has_mask:
        keep_mask.check_plan(plan, "backward")
    if plan.split_k:
        _check_split(plan)
    need = backward_smem_bytes(plan, has_z, has_mask, layout)
    if need > plan.smem_limit:
        raise PlanError(
            f"persistent backward needs {need} B of shared memory per block, over the "
            f"{plan.smem_limit} B limit ({plan.dtype}, rows {plan.rows_per_block}, k_chunk "
            f"{plan.k_chunk}, stages {plan.stages}): lower stages or k_chunk, or raise "
            "row_blocks."
        )


def _check_split(plan: PersistentPlan) -> None:
    if plan.staged:
        raise PlanError(f"persistent backward: split_k runs without {plan.staged_options()}.")
    k_steps = 2 * plan.n_pad // plan.k_chunk
    if k_steps < 2:
        raise PlanError(
            f"persistent backward: split_k needs 2 K chunks or more, got {k_steps} "
            f"(k_chunk {plan.k_chunk})."
        )


def backward_weights(plan: PersistentPlan, kernel_s: Array, dtype) -> Array:
    """W [L, n, 2n] -> wt [L * n_pad, 2 * n_pad]: each W_l padded, stacked on rows."""
    depth, n, n_pad = kernel_s.shape[0], plan.width, plan.n_pad
    if kernel_s.shape[1:] != (n, 2 * n):
        raise PlanError(f"kernel_s {kernel_s.shape} is not [L, {n}, {2 * n}] (plan width {n}).")
    w = kernel_s.reshape(depth, n, 2, n)
    w = jnp.pad(w, [(0, 0), (0, n_pad - n), (0, 0), (0, n_pad - n)])
    return w.reshape(depth * n_pad, 2 * n_pad).astype(dtype)


def check_operands(plan: PersistentPlan, wt, g, packed, z, mask, bias, s_mm) -> int:
    """PlanError unless the operands have the plan's padded shapes; returns L."""
    b_pad, n_pad = plan.b_pad, plan.n_pad
    if wt.ndim != 2 or wt.shape[1] != 2 * n_pad or wt.shape[0] % n_pad or not wt.shape[0]:
        raise PlanError(f"wt {wt.shape} is not [L * {n_pad}, {2 * n_pad}] (plan n_pad).")
    depth = wt.shape[0] // n_pad
    phases = packed.shape[0] if packed.ndim == 4 else 0
    if packed.ndim != 4 or packed.shape[1] != b_pad or packed.shape[3] != n_pad or not phases:
        raise PlanError(f"packed {packed.shape} is not [T * L, {b_pad}, K, {n_pad}].")
    if phases % depth:
        raise PlanError(f"packed {packed.shape} has {phases} phases, not a multiple of L {depth}.")
    if g.shape not in ((phases, b_pad, n_pad), (phases // depth, b_pad, n_pad)):
        raise PlanError(
            f"g {g.shape} is not [{phases}, {b_pad}, {n_pad}] (every phase) or "
            f"[{phases // depth}, {b_pad}, {n_pad}] (layer {depth - 1} only)."
        )
    if packed.shape[2] != plan.packed_rows:
        raise PlanError(
            f"packed {packed.shape} does not have {plan.packed_rows} saved rows ({plan.dtype}: "
            f"{'s_prev, then ' * plan.state_in_packed}h and tg, or with z full's halves)."
        )
    s_mm_shape = (phases * b_pad, plan.k_pad)
    if plan.state_in_packed != (s_mm is None) or (
        s_mm is not None and (s_mm.shape != s_mm_shape or s_mm.dtype != F32)
    ):
        raise PlanError(
            f"s_mm is {None if s_mm is None else (s_mm.dtype.name, s_mm.shape)}: in f32 the "
            f"input states are read from it, float32 {s_mm_shape}; in bf16 None (packed)."
        )
    z_shape = (depth, phases // depth, b_pad, plan.z_width)
    if z is not None and z.shape != z_shape:
        raise PlanError(f"z {z.shape} is not {z_shape} (layer-major [L, T, b_pad, z_width]).")
    bias_shape = (depth, b_pad, 2, n_pad)
    has_z = z is not None
    if has_z != (bias is not None) or (bias is not None and bias.shape != bias_shape):
        raise PlanError(
            f"bias is {None if bias is None else bias.shape}: with z it must be {bias_shape} "
            "(the gates are recomputed from full), without z None."
        )
    keep_mask.check_operand(mask, (phases, b_pad, n_pad), "backward")
    if jnp.dtype(wt.dtype).name != plan.dtype:
        raise PlanError(f"wt dtype {wt.dtype} is not the plan's {plan.dtype}.")
    return depth
