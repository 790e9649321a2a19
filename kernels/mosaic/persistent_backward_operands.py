"""The persistent backward kernel's operands and plan checks, apart from the kernel
(`kernels/mosaic/persistent_backward.py`): the bundles a caller passes for z recomputed in
the kernel (`ScalesInside`) and for the hyper cell inside it (`HyperBackward`), the weight
and projection layouts they take (`backward_weights`, `projection_rows`), the one-line
checks of shapes and dtypes (`check_operands`, `check_scales`, `check_hyper`), and the
shared memory a plan needs (`backward_smem_bytes`, `check_plan`: what `ops.persistent` and
the plan model ask before any compile)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from rhhjax.kernels.hardware import H100
from rhhjax.kernels.layout import F32
from rhhjax.kernels.mosaic import keep_mask
from rhhjax.kernels.mosaic.persistent_backward_cell import bias_row_group, input_names
from rhhjax.kernels.mosaic.plan import PersistentPlan, PlanError, check_arrays

Array = jax.Array
MBARRIER_BYTES = 8
MAX_TMA_ROWS = 256  # Mosaic GPU's async copies move at most 256 elements along a dimension


def _align(nbytes: int) -> int:
    return -(-nbytes // H100.smem_alignment) * H100.smem_alignment


class ScalesInside(NamedTuple):
    """What the backward recomputes z from instead of reading it (the HyperRHN whose forward
    ran the hyper cell inside, `persistent_forward.HyperInside`, with ``save_scales=False``):
    z_p = s_hyper[p] P_l + p_l as the forward computed it (`persistent_forward.scales_to_smem`,
    the same GEMM on the same operands), so z [L, T, b_pad, z_width] f32 is never written
    nor read (1.44 GB at the paper's size)::

        plan      the hyper cell's plan inside the forward (its k_chunk and stages run the
                  GEMM; the same rows as the backward's plan)
        s_mm      [P * b_pad, kh_pad] matmul dtype  the hyper cell's A buffer (forward output)
        tail      [b_pad, kh_pad] matmul dtype      its state after the last phase
        proj      [L * n_pad, kh_pad] matmul dtype  `persistent_forward.projection_weights`
        proj_bias [L, b_pad, n_pad] f32             p_l broadcast over rows
    """

    plan: PersistentPlan
    s_mm: Array
    tail: Array
    proj: Array
    proj_bias: Array


class HyperBackward(NamedTuple):
    """The hyper cell's operands for `persistent_backward` with the hyper cell INSIDE the
    kernel's phases, one phase BEHIND the main cell (its state gradient through z, ds_h =
    dz P^T, needs dz of every main block), on the blocks ``(r, c < plan.col_blocks)`` of
    its own plan (the same rows). Operands as the main cell's, for ``plan``:

        wt     [L * h_pad, 2 * h_pad] matmul dtype (`backward_weights(plan, ...)`)
        g      [P, b_pad, h_pad] f32   the cotangent of its states from outside the op,
                                       or [T, b_pad, h_pad]: its last layer's only
        packed [P, b_pad, K, h_pad] f32  its forward's saved rows (s_prev in bf16, h, tg)
        mask   [P, b_pad, h_pad] uint8 | None;  s_mm [P * b_pad, kh_pad] f32 | None (f32)
        proj_rows [L * h_pad, n_pad] matmul dtype  P_l as it is (rows l * h_pad + i: row i
                  of P_l), the B operand of ds_h's GEMM (`projection_rows`)

    Per hyper phase q: ds_h = dz_mm(q) @ P_l^T (K = n_pad; dz in the matmul dtype, each
    main block's tile written to a two-slot ring after its epilogue), added to g in shared
    memory, then the main cell's phase math at ``plan`` (no z)."""

    plan: PersistentPlan
    wt: Array
    g: Array
    packed: Array
    mask: Array | None
    s_mm: Array | None
    proj_rows: Array


def projection_rows(main: PersistentPlan, hyper_plan: PersistentPlan, kernel, dtype) -> Array:
    """The hyper projection P [L, h, n] -> [L * h_pad, n_pad] in ``dtype``, zero-padded: the
    B operand of the backward's ds_h GEMM (`HyperBackward`)."""
    depth, h, n = kernel.shape
    if (h, n) != (hyper_plan.width, main.width):
        raise PlanError(
            f"projection kernel has shape {kernel.shape}, expected [L, {hyper_plan.width}, "
            f"{main.width}]."
        )
    rows = jnp.pad(kernel, [(0, 0), (0, hyper_plan.n_pad - h), (0, main.n_pad - n)])
    return rows.reshape(depth * hyper_plan.n_pad, main.n_pad).astype(dtype)


def ds_h_chunk(plan: PersistentPlan) -> tuple[int, int]:
    """(K chunk, pipeline stages) of the hyper cell's ds_h GEMM over the main units (K =
    n_pad): the largest of 64, 32, 16, 8 that divides n_pad, at most the main k_chunk."""
    chunk = next(k for k in (64, 32, 16, 8) if k <= plan.k_chunk and plan.n_pad % k == 0)
    return chunk, min(plan.stages, plan.n_pad // chunk)


def _hyper_group(hyper_plan: PersistentPlan, rows: int, has_mask: bool) -> list[int]:
    """Bytes of the hyper cell's per-phase shared memory inside the backward (its input
    tiles, accumulator, d_scaled pair, bias sums, mask): one `RefUnion` group beside the
    main cell's input tiles, which it shares (the main phase is over when it runs)."""
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
    """Shared memory per block (bytes) that `persistent_backward` allocates (defaults: with
    z and mask, ``depth`` L = 7, the paper's). Every allocation is rounded up to 1 KiB
    (Mosaic GPU)::

        pipeline   stages' * rows * k_chunk * itemsize  (A: d_mm rows)
                 + stages' * u * k_chunk * itemsize     (B: rows of W)   stages' = min(stages,
                                                                          2 n_pad / k_chunk)
        epi        n_in * rows * u * 4      (f32 inputs g, s_prev, h, tg, or with z g,
                                             s_prev, full_h, full_t, z, b_h, b_t; da_h and
                                             da_t are written over g and s_prev, dz over
                                             full_h)
        mask       rows * u                 (the uint8 keep decisions, with a mask)
        carry      rows * u * 4             (the carried state gradient, across phases)
        acc        rows * u * 4             (the accumulator, staged for the epilogue)
        dsc        2 * rows * u * itemsize  (d_scaled halves in the matmul dtype)
        bias       2 * group * u * 4        (the column sums of da's halves, `bias_row_group`)
        dz sums    L * group * u * 4        (with z: the column sums of dz, per layer)
        mbarriers  8 * (n_in [+ 1 mask] + stages')

    With z recomputed (``scales_plan``, `ScalesInside`'s plan): one more input tile (p_l),
    and z's GEMM pipeline (``scales_plan``'s k_chunk and stages, at most the K steps)
    reusing the main GEMM's buffers (run one after the other; the larger counts), with
    mbarriers of its own when its stage count differs (as `PersistentPlan.smem_bytes`).
    With the hyper cell inside (``hyper_plan``, ``hyper_mask``: `HyperBackward`): its input
    tiles, accumulator, d_scaled pair, bias sums and mask in a `RefUnion` with the main
    input tiles (`_hyper_group`; the larger counts), its own carry and mbarriers, and its
    GEMMs' pipelines (its cell's, K = 2 h_pad, and ds_h's, `ds_h_chunk`) sharing the main
    one's buffers, with mbarriers per stage count."""
    rows, u, item = plan.rows_per_block, plan.units_per_block, plan.itemsize
    stages = min(plan.stages, max(2 * plan.n_pad // plan.k_chunk, 1))
    n_in = len(input_names(has_z, scales_plan is not None))
    tile = rows * u * 4
    gemms = [(plan.k_chunk, stages, u)]  # (K chunk, stages, B rows) of each pipelined GEMM
    if scales_plan is not None:
        z_chunk = scales_plan.k_chunk  # the forward's z GEMM, the same K chunks
        gemms.append((z_chunk, min(scales_plan.stages, scales_plan.k_pad // z_chunk), u))
    epi = [_align(n_in * tile)]
    barriers = n_in + has_mask
    hyper_alloc = []
    if hyper_plan is not None:
        hu, h_chunk = hyper_plan.units_per_block, hyper_plan.k_chunk
        gemms.append((h_chunk, min(hyper_plan.stages, 2 * hyper_plan.n_pad // h_chunk), hu))
        gemms.append((*ds_h_chunk(plan), hu))
        epi.append(sum(map(_align, _hyper_group(hyper_plan, rows, hyper_mask))))
        hyper_alloc = [rows * hu * 4]  # its carry
        barriers += len(input_names(False, hyper=True)) + hyper_mask
    pipelines = [[s * rows * k * item, s * b * k * item] for k, s, b in gemms]
    pipeline = max(pipelines, key=lambda b: sum(map(_align, b)))
    # Scoped mbarriers are reserved per kind (their count): one set per distinct stage count.
    barriers += sum({s for _, s, _ in gemms})
    allocations = (
        *pipeline,
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
    """One-line `PlanError` unless the backward kernel can run ``plan`` co-resident: grid <=
    SMs, ``rows <= 256`` (a TMA box), ``u % 8 == 0`` (wgmma N, 16-byte TMA rows),
    ``2 * n_pad % k_chunk == 0`` (its K) and `backward_smem_bytes` within the per-block
    limit (with z recomputed at ``scales_plan``, the hyper cell inside at ``hyper_plan``:
    the same rows; the hyper plan at most the main plan's column blocks)."""
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


def backward_weights(plan: PersistentPlan, kernel_s: Array, dtype) -> Array:
    """W [L, n, 2n] -> wt [L * n_pad, 2 * n_pad] in ``dtype``: each W_l as it is, padded to
    [n_pad, 2 * n_pad] (gate column (h, i) at h * n_pad + i), stacked on rows, so rows
    ``(l * C + g) * u ..`` are the rows of W_l for units ``g * u ..``."""
    depth, n, n_pad = kernel_s.shape[0], plan.width, plan.n_pad
    if kernel_s.shape[1:] != (n, 2 * n):
        raise PlanError(f"kernel_s {kernel_s.shape} is not [L, {n}, {2 * n}] (plan width {n}).")
    w = kernel_s.reshape(depth, n, 2, n)
    w = jnp.pad(w, [(0, 0), (0, n_pad - n), (0, 0), (0, n_pad - n)])
    return w.reshape(depth * n_pad, 2 * n_pad).astype(dtype)


def check_operands(
    plan: PersistentPlan, wt, g, packed, z, mask, bias, s_mm, z_inside: bool = False
) -> int:
    """One-line `PlanError` unless the operands have the plan's padded shapes (``z_inside``:
    z recomputed, `ScalesInside`); returns L."""
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
    """One-line `PlanError` unless `HyperBackward`'s operands have its plan's shapes: the
    main cell's phases and depth, g for every phase, P's rows [L * h_pad, n_pad]."""
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
    """One-line `PlanError` unless `ScalesInside`'s operands have its shapes (and z is not
    given as well; the bias is, for the gates)."""
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
