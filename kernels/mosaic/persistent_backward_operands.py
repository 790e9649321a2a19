"""The persistent backward kernel's operand bundles (`ScalesInside`, `HyperBackward`), weight
layouts, shape checks and shared-memory count (`backward_smem_bytes`, `check_plan`)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from rhhjax.kernels.hardware import H100
from rhhjax.kernels.layout import F32
from rhhjax.kernels.mosaic import gemm, keep_mask
from rhhjax.kernels.mosaic.persistent_backward_cell import bias_row_group, input_names
from rhhjax.kernels.mosaic.plan import PersistentPlan, PlanError, check_arrays

Array = jax.Array
MBARRIER_BYTES = 8
MAX_TMA_ROWS = 256  # the most elements a TMA copy moves along a dimension


def _align(nbytes: int) -> int:
    return -(-nbytes // H100.smem_alignment) * H100.smem_alignment


class ScalesInside(NamedTuple):
    """What the backward recomputes z from instead of reading it (z is never written):
    the hyper cell's plan, A buffer s_mm [P * b_pad, kh_pad], tail [b_pad, kh_pad], proj
    [L * n_pad, kh_pad] and proj_bias [L, b_pad, n_pad]."""

    plan: PersistentPlan
    s_mm: Array
    tail: Array
    proj: Array
    proj_bias: Array


class HyperBackward(NamedTuple):
    """The hyper cell's operands when it runs inside `persistent_backward`, one phase behind
    the main cell: as the main cell's for its own ``plan``, plus proj_rows [L * h_pad, n_pad]
    for ds_h = dz P^T."""

    plan: PersistentPlan
    wt: Array
    g: Array
    packed: Array
    mask: Array | None
    s_mm: Array | None
    proj_rows: Array


def projection_rows(main: PersistentPlan, hyper_plan: PersistentPlan, kernel, dtype) -> Array:
    """P [L, h, n] -> [L * h_pad, n_pad], the B operand of the ds_h GEMM."""
    depth, h, n = kernel.shape
    if (h, n) != (hyper_plan.width, main.width):
        raise PlanError(
            f"projection kernel has shape {kernel.shape}, expected [L, {hyper_plan.width}, "
            f"{main.width}]."
        )
    rows = jnp.pad(kernel, [(0, 0), (0, hyper_plan.n_pad - h), (0, main.n_pad - n)])
    return rows.reshape(depth * hyper_plan.n_pad, main.n_pad).astype(dtype)


def ds_h_chunk(plan: PersistentPlan) -> tuple[int, int]:
    """(K chunk, stages) of the ds_h GEMM (K = n_pad)."""
    chunk = next(k for k in (64, 32, 16, 8) if k <= plan.k_chunk and plan.n_pad % k == 0)
    return chunk, min(plan.stages, plan.n_pad // chunk)


def _hyper_group(hyper_plan: PersistentPlan, rows: int, has_mask: bool) -> list[int]:
    """Bytes of the hyper cell's per-phase shared memory (unioned with the main tiles)."""
    hu, item = hyper_plan.units_per_block, hyper_plan.itemsize
    tile = rows * hu * 4
    group = [
        len(input_names(False, hyper=True)) * tile,
        tile,
        2 * rows * hu * item,
        2 * bias_row_group(hyper_plan) * hu * 4,
    ]
    return group + [rows * hu] * has_mask


def backward_smem_bytes(
    plan: PersistentPlan,
    has_z: bool = True,
    has_mask: bool = True,
    depth: int = 7,
    scales_plan: PersistentPlan | None = None,
    hyper_plan: PersistentPlan | None = None,
    hyper_mask: bool = True,
) -> int:
    """Shared memory per block of `persistent_backward` (defaults: z, mask, L = 7): the
    GEMM pipeline, the staged f32 epilogue tiles, mask, carry, accumulator, d_scaled, the
    column sums and mbarriers, each rounded to 1 KiB; more with ``scales_plan`` (z
    recomputed) or ``hyper_plan`` (the hyper cell inside)."""
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
    n_in = len(input_names(has_z, scales_plan is not None))
    tile = rows * u * 4
    gemms = [(plan.k_chunk, stages, u)]  # (K chunk, stages, B rows)
    if scales_plan is not None:
        z_chunk = scales_plan.k_chunk
        gemms.append((z_chunk, min(scales_plan.stages, scales_plan.k_pad // z_chunk), u))
    epi = [_align(n_in * tile)]
    barriers = n_in + has_mask
    hyper_alloc = []
    if hyper_plan is not None:
        hu, h_chunk = hyper_plan.units_per_block, hyper_plan.k_chunk
        gemms.append((h_chunk, min(hyper_plan.stages, 2 * hyper_plan.n_pad // h_chunk), hu))
        gemms.append((*ds_h_chunk(plan), hu))
        epi.append(sum(map(_align, _hyper_group(hyper_plan, rows, hyper_mask))))
        hyper_alloc = [rows * hu * 4]
        barriers += len(input_names(False, hyper=True)) + hyper_mask
    pipelines = [[s * rows * k * item, s * b * k * item] for k, s, b in gemms]
    pipeline = max(pipelines, key=lambda b: sum(map(_align, b)))
    # One set of mbarriers per distinct stage count.
    barriers += sum({s for _, s, _ in gemms}) + stages * (plan.staged + plan.multicast)
    barriers += split_barriers
    allocations = (
        *pipeline,
        *split_alloc,
        *hyper_alloc,
        tile,
        tile,
        2 * rows * u * item,
        rows * u * has_mask,
        2 * bias_row_group(plan) * u * 4,
        depth * bias_row_group(plan) * u * 4 * has_z,
    )
    return sum(map(_align, allocations)) + max(epi) + MBARRIER_BYTES * barriers


def check_plan(
    plan: PersistentPlan,
    has_z: bool = True,
    has_mask: bool = True,
    depth: int = 7,
    scales_plan: PersistentPlan | None = None,
    hyper_plan: PersistentPlan | None = None,
    hyper_mask: bool = True,
) -> None:
    """PlanError unless the backward kernel can run ``plan`` co-resident: grid <= SMs,
    rows <= 256, ``u % 8 == 0``, K in whole chunks, shared memory within the limit."""
    plan.check_grid()
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
    if scales_plan is not None and (scales_plan.rows_per_block, scales_plan.b_pad) != (
        plan.rows_per_block, plan.b_pad,
    ):  # fmt: skip
        raise PlanError(
            f"persistent backward recomputes z with the hyper plan's rows: {scales_plan} has "
            f"other rows than {plan}."
        )
    if plan.staged and (scales_plan or hyper_plan) is not None:
        raise PlanError(f"persistent backward: {plan.staged_levers()} runs the hyper cell apart.")
    if plan.split_k:
        _check_split(plan, scales_plan is not None or hyper_plan is not None)
    if hyper_plan is not None:
        same = (hyper_plan.rows_per_block, hyper_plan.b_pad) == (plan.rows_per_block, plan.b_pad)
        if not same or hyper_plan.col_blocks > plan.col_blocks or not has_z:
            raise PlanError(
                f"persistent backward runs the hyper cell inside with the main cell's rows, at "
                f"most its column blocks, and z: {hyper_plan} does not fit {plan}."
            )
        hyper_plan.check_backward_k()
        if hyper_mask:
            keep_mask.check_plan(hyper_plan, "backward")
    need = backward_smem_bytes(plan, has_z, has_mask, depth, scales_plan, hyper_plan, hyper_mask)
    if need > plan.smem_limit:
        raise PlanError(
            f"persistent backward needs {need} B of shared memory per block, over the "
            f"{plan.smem_limit} B limit ({plan.dtype}, rows {plan.rows_per_block}, k_chunk "
            f"{plan.k_chunk}, stages {plan.stages}): lower stages or k_chunk, or raise "
            "row_blocks."
        )


def _check_split(plan: PersistentPlan, hyper_inside: bool) -> None:
    if plan.staged or hyper_inside:
        other = plan.staged_levers() if plan.staged else "the hyper cell inside"
        raise PlanError(f"persistent backward: split_k runs without {other}.")
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


def check_operands(
    plan: PersistentPlan, wt, g, packed, z, mask, bias, s_mm, z_inside: bool = False
) -> int:
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
    has_z = z is not None or z_inside
    if has_z != (bias is not None) or (bias is not None and bias.shape != bias_shape):
        raise PlanError(
            f"bias is {None if bias is None else bias.shape}: with z it must be {bias_shape} "
            "(the gates are recomputed from full), without z None."
        )
    keep_mask.check_operand(mask, (phases, b_pad, n_pad), "backward")
    if jnp.dtype(wt.dtype).name != plan.dtype:
        raise PlanError(f"wt dtype {wt.dtype} is not the plan's {plan.dtype}.")
    return depth


def check_hyper(plan: PersistentPlan, hyper: HyperBackward, phases: int, depth: int) -> None:
    """PlanError unless `HyperBackward`'s operands have its plan's shapes."""
    hp = hyper.plan
    operands = (hyper.wt, hyper.g, hyper.packed, None, hyper.mask, None, hyper.s_mm)
    h_depth = check_operands(hp, *operands)
    if (h_depth, hyper.packed.shape[0]) != (depth, phases):
        raise PlanError(
            f"hyper backward operands have {hyper.packed.shape[0]} phases of depth {h_depth}, "
            f"the main cell {phases} of depth {depth}."
        )
    shape = (depth * hp.n_pad, plan.n_pad)
    check_arrays({"proj_rows": (hyper.proj_rows, shape, plan.dtype)}, "persistent backward: hyper")


def check_scales(plan: PersistentPlan, scales: ScalesInside, z, bias, phases: int, depth: int):
    """PlanError unless `ScalesInside`'s operands have its shapes."""
    if z is not None or bias is None:
        raise PlanError("persistent backward: with z recomputed pass the bias and no z.")
    kh_pad, mm = scales.plan.k_pad, plan.dtype
    expected = {
        "s_mm": (scales.s_mm, (phases * plan.b_pad, kh_pad), mm),
        "tail": (scales.tail, (plan.b_pad, kh_pad), mm),
        "proj": (scales.proj, (depth * plan.n_pad, kh_pad), mm),
        "proj_bias": (scales.proj_bias, (depth, plan.b_pad, plan.n_pad), "float32"),
    }
    check_arrays(expected, "persistent backward: scales'")
