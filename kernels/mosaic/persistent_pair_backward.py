"""A HyperRHN's two backward recurrences in one Mosaic GPU launch: the hyper cell on blocks of
its own beside the main cell's, two phases behind, meeting at one grid barrier; each hyper block
adds dz @ P_l to its rows' cotangent before its phase (`persistent_backward`'s cells both).
Operands: each cell's `BackwardOperands`, the hyper's g every phase's; proj [L * nh_pad,
n_pad] f32 (P_l). Design: docs/persistent_design.md."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from rhhjax.kernels.layout import F32
from rhhjax.kernels.mosaic import gemm, grid_barrier, keep_mask, persistent_cell
from rhhjax.kernels.mosaic import persistent_backward as pb
from rhhjax.kernels.mosaic import persistent_backward_operands as operands
from rhhjax.kernels.mosaic import persistent_pair as pair
from rhhjax.kernels.mosaic import persistent_slots as slots
from rhhjax.kernels.mosaic.persistent_backward_cell import BackwardCell, input_names
from rhhjax.kernels.mosaic.plan import PersistentPlan, PlanError

Array = jax.Array
# The hyper cell's phases behind the main cell's: a main phase leaves its dz store in flight
# until the end of its next phase.
LAG = 2


class BackwardOperands(NamedTuple):
    """One cell's `persistent_backward` operands."""

    wt: Array
    g: Array
    packed: Array
    z: Array | None = None
    mask: Array | None = None
    bias: Array | None = None
    s_mm: Array | None = None


class PairGradients(NamedTuple):
    """`persistent_backward`'s outputs of each cell (status apart; the main's dz
    `dz_width` wide), g_hyper [P, b_pad, nh_pad] (the hyper cell's cotangent, dz @ P_l
    added), status [R * (C + C_hyper)]."""

    main: tuple
    hyper: tuple
    g_hyper: Array
    status: Array


def dz_width(plan: PersistentPlan) -> int:
    """dz's units: z_width in 32s, the hyper blocks' swizzled f32 chunks of it (past z_width
    0, the main cell's padded units)."""
    return -(-plan.z_width // 32) * 32


def projection(plan: PersistentPlan, hyper_plan: PersistentPlan, kernel: Array) -> Array:
    """P [L, h, n] -> [L * nh_pad, n_pad] f32: the B operand of dz @ P_l^T."""
    depth, h, n = kernel.shape
    if (h, n) != (hyper_plan.width, plan.width):
        raise PlanError(f"projection kernel {kernel.shape} is not [L, {h}, {plan.width}].")
    pads = [(0, 0), (0, hyper_plan.n_pad - h), (0, plan.n_pad - n)]
    return jnp.pad(kernel.astype(F32), pads).reshape(depth * hyper_plan.n_pad, plan.n_pad)


def own_pipeline_bytes(plan: PersistentPlan) -> int:
    """The backward GEMM's K pipeline where it is `gemm.gemm_nt_to_smem`'s own, else 0."""
    if plan.staged or plan.split_k:
        return 0
    stages = min(plan.stages, 2 * plan.n_pad // plan.k_chunk)
    return stages * (plan.rows_per_block + plan.units_per_block) * plan.k_chunk * plan.itemsize


def smem_bytes(plan: PersistentPlan, hyper_plan: PersistentPlan) -> int:
    """Shared memory of a block, at most (z and masks on): the larger of the cells' scratch
    (the hyper's with its dz @ P_l tiles and pipeline), the larger own K pipeline."""
    rows, hu = plan.rows_per_block, hyper_plan.units_per_block
    cotangent = 2 * rows * hu * 4 + 2 * (rows + hu) * cotangent_chunk(plan) * 4
    main = pb.backward_smem_bytes(plan) - own_pipeline_bytes(plan)
    hyper = pb.backward_smem_bytes(hyper_plan, False) - own_pipeline_bytes(hyper_plan) + cotangent
    pipelines = max(own_pipeline_bytes(plan), own_pipeline_bytes(hyper_plan))
    return max(main, hyper) + pipelines + pair.ALIGNMENT_SLACK


def fit_plans(plan: PersistentPlan, hyper_plan: PersistentPlan) -> tuple:
    """`persistent_pair.fit_plans` by the backward's `smem_bytes`."""
    return pair.fit_plans(plan, hyper_plan, smem_bytes)


def _check(plan, hyper_plan, main, hyper, proj, interpret) -> int:
    pair.check_blocks(plan, hyper_plan, interpret)
    if smem_bytes(plan, hyper_plan) > plan.smem_limit:
        raise PlanError(f"persistent pair backward: {smem_bytes(plan, hyper_plan)} B of shared "
                        f"memory a block exceed {plan.smem_limit} B: use fit_plans.")  # fmt: skip
    depth = operands.check_operands(plan, *main)
    if main.z is None or hyper.z is not None or hyper.g.shape[0] != main.packed.shape[0]:
        raise PlanError("persistent pair backward: the main cell with z, the hyper's g per phase.")
    if operands.check_operands(hyper_plan, *hyper) != depth or hyper.packed.shape != (
        main.packed.shape[0], plan.b_pad, hyper_plan.packed_rows, hyper_plan.n_pad,
    ):  # fmt: skip
        raise PlanError("persistent pair backward: the cells' operands differ in phases.")
    if proj.shape != (depth * hyper_plan.n_pad, plan.n_pad) or proj.dtype != F32:
        raise PlanError(f"persistent pair backward: proj {proj.shape} is not float32 "
                        f"[{depth * hyper_plan.n_pad}, {plan.n_pad}].")  # fmt: skip
    pb.check_plan(plan, True, main.mask is not None, "grid")
    pb.check_plan(hyper_plan, False, hyper.mask is not None, "grid")
    return depth


def cotangent_chunk(plan: PersistentPlan) -> int:
    """The K chunk of the hyper blocks' dz @ P_l (f32 operands, 2 stages)."""
    return 32 if plan.n_pad % 32 == 0 else 16


def _cotangent_scratch(plan: PersistentPlan, hyper_plan: PersistentPlan) -> dict:
    """The hyper blocks' dz @ P_l: an f32 tile, its K pipeline (dz rows, P_l rows)."""
    rows, hu = plan.rows_per_block, hyper_plan.units_per_block
    staged = gemm.staged_scratch(rows, hu, cotangent_chunk(plan), 2, F32)
    types = dict(dz_proj=plgpu.SMEM((rows, hu), F32), dz_proj_g=plgpu.SMEM((rows, hu), F32))
    types["dz_proj_bar"] = plgpu.Barrier(num_barriers=1)
    return types | {f"dz_proj_{name}": value for name, value in staged.items()}


def persistent_pair_backward(
    plan: PersistentPlan,
    hyper_plan: PersistentPlan,
    main: BackwardOperands,
    hyper: BackwardOperands,
    proj: Array,
    *,
    keep: float = 1.0,
    spin_limit: int = grid_barrier.DEFAULT_SPIN_LIMIT,
    interpret: Any = None,
) -> PairGradients:
    """Both cells' backward phases in one launch: iteration i runs main phase P - 1 - i, and
    hyper phase P + 1 - i after its cotangent's dz @ P_l, then the barrier."""
    depth = _check(plan, hyper_plan, main, hyper, proj, interpret)
    phases = main.packed.shape[0]
    steps = phases // depth
    n_r, n_main = plan.row_blocks, plan.col_blocks
    n_c = n_main + hyper_plan.col_blocks
    mm_dtype = main.wt.dtype
    cells_in = [
        [(k, v) for k, v in cell._asdict().items() if v is not None] for cell in (main, hyper)
    ]
    operands = [v for cell in cells_in for _, v in cell] + [proj]
    out_m = pb.out_types(plan, steps, depth, True, mm_dtype)
    out_m[4] = jax.ShapeDtypeStruct((*out_m[4].shape[:3], dz_width(plan)), F32)
    out_h = pb.out_types(hyper_plan, steps, depth, False, mm_dtype)
    g_type = jax.ShapeDtypeStruct(hyper.g.shape, F32)
    out_type = [*out_m, *out_h, g_type, jax.ShapeDtypeStruct((n_r * n_c,), jnp.int32)]

    def cell_refs(names, ins, outs, has_z):
        named = dict(z=None, mask=None, bias=None, s_mm=None) | dict(zip(names, ins, strict=True))
        named |= dict(d_x=outs[0], d_mm=outs[1], bias_parts=outs[3])
        return named | dict(dz=outs[4] if has_z else None)

    def make_cell(cell_plan, refs, sc, r, c, has_z, g_last=False):
        return BackwardCell(
            plan=cell_plan, steps=steps, depth=depth, keep=keep, g_last=g_last,
            names=input_names(has_z, cell_plan.in_registers), refs=refs, sc=sc, r=r, c=c,
            interpret=interpret, split=pb.split_operands(sc, cell_plan, interpret),
            producer=persistent_cell.producer_of(sc, cell_plan, interpret),
        )  # fmt: skip

    def kernel(*refs, phase_bar=None, **sc):
        n_m, n_h = len(cells_in[0]), len(cells_in[1])
        outs = refs[len(operands) :]
        outs_m, outs_h = outs[: len(out_m)], outs[len(out_m) : len(out_m) + len(out_h)]
        g_total, status_g = outs[-2:]
        r, g = grid_barrier.block_index((n_r, n_c), ("r", "g"), phase_bar)
        block = r * n_c + g
        barrier = grid_barrier.make_barrier(n_r * n_c, block == 0, spin_limit, phase_bar)
        sc_m, sc_h = pair.cell_scratch(sc)
        names_m, names_h = ([k for k, _ in cell] for cell in cells_in)
        refs_m = cell_refs(names_m, refs[:n_m], outs_m, True)
        refs_h = cell_refs(names_h, refs[n_m : n_m + n_h], outs_h, False)
        g_direct, refs_h["g"] = refs_h["g"], g_total
        g_last = main.g.shape[0] != phases  # layer L - 1's cotangent only
        main_cell = make_cell(plan, refs_m, sc_m, r, jnp.minimum(g, n_main - 1), True, g_last)
        hyper_cell = make_cell(hyper_plan, refs_h, sc_h, r, jnp.maximum(g - n_main, 0), False)
        proj_g = refs[len(operands) - 1]
        cotangent = _Cotangent(hyper_cell, refs_m["dz"], proj_g, g_direct, g_total, sc_h)
        is_main = g < n_main

        def run():
            @pl.when(is_main)
            def _():
                status_g[block] = _iterations(main_cell, barrier, 0, outs_m[2])

            @pl.when(jnp.logical_not(is_main))
            def _():
                before = cotangent.write
                status_g[block] = _iterations(hyper_cell, barrier, LAG, outs_h[2], before)

        if main_cell.split is None and main_cell.producer is None:
            return run()
        warpgroup = jax.lax.axis_index(persistent_cell.WARPGROUPS)
        pl.when(warpgroup == 0)(run)
        after_go = grid_barrier.fence_proxy_async_global if interpret is None else None
        pl.when(jnp.logical_and(warpgroup == 1, is_main))(lambda: main_cell.help(after_go))
        hyper_blocks = jnp.logical_and(warpgroup == 1, jnp.logical_not(is_main))
        pl.when(hyper_blocks)(lambda: hyper_cell.help(after_go))

    has_masks = (main.mask is not None, hyper.mask is not None)
    types_m = pb.scratch(plan, True, has_masks[0], mm_dtype, interpret)
    types_h = pb.scratch(hyper_plan, False, has_masks[1], mm_dtype, interpret)
    types_h |= _cotangent_scratch(plan, hyper_plan)
    outs = pair.launch(
        kernel, (n_r, n_c), (types_m, types_h), interpret=interpret, out_type=tuple(out_type),
        kernel_name="persistent_pair_backward",
        **persistent_cell.warpgroups(plan.producer or plan.split_k),
    )(*operands)  # fmt: skip
    status = outs[-1]
    main_out = pb.GradientsZ(*outs[: len(out_m)], status)
    hyper_out = pb.Gradients(*outs[len(out_m) : len(out_m) + len(out_h)], status)
    return PairGradients(main_out, hyper_out, outs[-2], status)


class _Cotangent:
    """A hyper block's cotangent of phase q: g_direct[q] + dz(q) @ P_l[block's units]^T
    (K = the main cell's units), written to g_total[q] for its phase to read."""

    def __init__(self, cell, dz_g, proj_g, g_direct, g_total, sc_h):
        self.cell, self.dz, self.proj = cell, dz_g, proj_g
        self.g_direct, self.g_total = g_direct, g_total
        self.tile, self.direct = sc_h["dz_proj"], sc_h["dz_proj_g"]
        self.bar = sc_h["dz_proj_bar"]
        self.staged = gemm.StagedOperands(
            **{name: sc_h[f"dz_proj_{name}"] for name in ("a", "b", "a_bar", "b_bar")}
        )

    def write(self, q) -> None:
        cell = self.cell
        t, layer = jax.lax.div(q, cell.depth), jax.lax.rem(q, cell.depth)
        row_sl, unit_sl = cell.slices()
        plgpu.copy_gmem_to_smem(self.g_direct.at[q, row_sl, unit_sl], self.direct, self.bar)
        b_block = layer * cell.plan.col_blocks + cell.c
        k_steps = self.proj.shape[1] // self.staged.a.shape[-1]  # units past z_width read 0
        dz = self.dz.at[layer, t]
        # A traced first chunk: dz's last chunk may pass z_width (TMA reads zeros there).
        gemm.gemm_nt_staged(
            self.tile, self.staged, dz, self.proj, cell.r, b_block, k_steps=k_steps,
            k_first=jnp.int32(0),
        )  # fmt: skip
        plgpu.barrier_wait(self.bar)
        total = keep_mask.load_strided(self.tile) + keep_mask.load_strided(self.direct)
        plgpu.commit_smem()
        self.tile[...] = total
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(self.tile, self.g_total.at[q, row_sl, unit_sl])
        plgpu.wait_smem_to_gmem(0)  # written before the phase's load of it


def _iterations(cell: BackwardCell, barrier, lag: int, ds_carry0, before=None) -> jax.Array:
    """``cell``'s phases P - 1 - (i - lag) for i < P + LAG (``before(p)`` first), barrier
    i + 1 after each i < P + LAG - 1; the status: 0, or 1 + the barrier it gave up at."""
    phases = cell.phases
    cell.prologue()
    fail_at = jnp.where(barrier(jnp.int32(0)), jnp.int32(0), jnp.int32(1))

    def body(i, fail_at):
        p = phases - 1 - (i - lag)
        runs = jnp.logical_and(fail_at == 0, jnp.logical_and(p >= 0, p < phases))

        @pl.when(runs)
        def _():
            if before is not None:
                before(p)
            cell.phase(p)

        pl.when(p < 0)(lambda: plgpu.wait_smem_to_gmem(0))  # the last phase's dz, written

        has_gemm = jnp.logical_and(p >= 0, p < phases - 1)
        skipped = jnp.logical_and(fail_at != 0, has_gemm)
        if cell.split is not None:
            pl.when(skipped)(lambda: gemm.skip_split(cell.split))
        if cell.producer is not None:
            skip = functools.partial(
                gemm.skip_gemm, cell.producer, gemm=phases - 2 - p, k_steps=cell.k_steps
            )
            pl.when(skipped)(skip)
        passed = jax.lax.cond(  # every block meets barriers 1 .. P
            jnp.logical_and(fail_at == 0, i < phases + LAG - 1),
            lambda: barrier(i + 1),
            lambda: jnp.bool_(True),
        )
        return jnp.where(passed, fail_at, i + 2)

    fail_at = jax.lax.fori_loop(0, phases + LAG, body, fail_at)
    cell.finish(ds_carry0)
    return fail_at


def persistent_pair_backward_reference(
    plan: PersistentPlan,
    hyper_plan: PersistentPlan,
    main: BackwardOperands,
    hyper: BackwardOperands,
    proj: Array,
    *,
    keep: float = 1.0,
    spin_limit: int = grid_barrier.DEFAULT_SPIN_LIMIT,
    interpret: Any = None,
) -> PairGradients:
    """Pure-JAX `persistent_pair_backward`: the main cell's reference, its dz @ P_l added to
    the hyper cell's g, the hyper cell's reference."""
    del spin_limit, interpret
    depth = operands.check_operands(plan, *main)
    main_out = pb.persistent_backward_reference(plan, *main, keep=keep)
    dz = slots.scales_to_phase_major(main_out.dz, plan.n_pad)  # [P, b_pad, n_pad]
    pads = [(0, 0)] * 3 + [(0, dz_width(plan) - plan.z_width)]
    main_out = main_out._replace(dz=jnp.pad(main_out.dz, pads))
    proj_l = proj.reshape(depth, hyper_plan.n_pad, plan.n_pad)
    layers = jnp.arange(dz.shape[0]) % depth
    g_total = hyper.g + jnp.einsum("pbn,phn->pbh", dz, proj_l[layers], preferred_element_type=F32)
    hyper_out = pb.persistent_backward_reference(hyper_plan, *hyper._replace(g=g_total), keep=keep)
    status = jnp.zeros((plan.row_blocks * (plan.col_blocks + hyper_plan.col_blocks),), jnp.int32)
    return PairGradients(
        main_out._replace(status=status), hyper_out._replace(status=status), g_total, status
    )
