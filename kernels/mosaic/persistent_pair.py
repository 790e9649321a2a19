"""A HyperRHN's two forward recurrences in one Mosaic GPU launch: the hyper cell on blocks of
its own beside the main cell's, two phases ahead, meeting at one grid barrier; the hyper
blocks write z from their state for the main blocks (`persistent_forward`'s kernels both).
Operands: each cell's as `persistent_forward` takes them (the main cell without z), proj
[L * n_pad, kh_pad] (P_l^T) and proj_bias [L, rows, n_pad]. Design: docs/persistent_design.md."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from rhhjax.kernels.layout import F32
from rhhjax.kernels.mosaic import gemm, grid_barrier, keep_mask, persistent_cell
from rhhjax.kernels.mosaic import persistent_forward as pf
from rhhjax.kernels.mosaic import persistent_slots as slots
from rhhjax.kernels.mosaic.plan import MBARRIER_BYTES, PersistentPlan, PlanError

Array = jax.Array
LEAD = 2  # the hyper cell's phases ahead of the main cell's: its phase, then z from it
ALIGNMENT_SLACK = 4096  # `smem_bytes`: the union's refs each start 1024-byte aligned


class CellOperands(NamedTuple):
    """One cell's `persistent_forward` operands (no z)."""

    w_blk: Array
    s0: Array
    xproj: Array
    bias: Array
    mask: Array | None = None


class PairOutputs(NamedTuple):
    """main and hyper: `persistent_forward`'s outputs of each (status apart), z [L, T, b_pad,
    z_width] the main cell read, status [R * (C + C_hyper)] int32."""

    main: tuple
    hyper: tuple
    z: Array
    status: Array


def projection_weights(plan: PersistentPlan, hyper_plan: PersistentPlan, kernel, dtype) -> Array:
    """P [L, h, n] -> [L * n_pad, kh_pad]: P_l^T zero-padded, the B operand of the z GEMM."""
    depth, h, n = kernel.shape
    if (h, n) != (hyper_plan.width, plan.width):
        raise PlanError(
            f"projection kernel has shape {kernel.shape}, expected [L, {hyper_plan.width}, "
            f"{plan.width}]."
        )
    pt = jnp.swapaxes(kernel, 1, 2)
    pt = jnp.pad(pt, [(0, 0), (0, plan.n_pad - n), (0, hyper_plan.k_pad - h)])
    return pt.reshape(depth * plan.n_pad, hyper_plan.k_pad).astype(dtype)


def projection_bias(plan: PersistentPlan, bias: Array) -> Array:
    """p [L, n] -> [L, rows_per_block, n_pad] f32: a block's rows of it."""
    bias = jnp.pad(bias.astype(F32), [(0, 0), (0, plan.n_pad - bias.shape[-1])])
    return jnp.broadcast_to(bias[:, None], (bias.shape[0], plan.rows_per_block, plan.n_pad))


def scales_stages(plan: PersistentPlan, hyper_plan: PersistentPlan) -> int:
    """The z GEMM's K pipeline: 2 stages where the block fits them, else 1."""
    k_steps = hyper_plan.k_pad // hyper_plan.k_chunk
    fits = smem_bytes(plan, hyper_plan, z_stages=2) <= plan.smem_limit
    return min(2 if fits else 1, k_steps)


def smem_bytes(
    plan: PersistentPlan, hyper_plan: PersistentPlan, save: bool = True, z_stages: int = 0
) -> int:
    """Shared memory of a block, at most (every option on): the larger of the cells' scratch
    (the hyper's with its z tiles and pipeline), the main cell's cast beside it, the larger
    of their K pipelines where those are `gemm.gemm_nt_to_smem`'s own, every mbarrier;
    ``z_stages`` 0: `scales_stages`."""
    rows, u, hp = plan.rows_per_block, plan.units_per_block, hyper_plan
    stages = z_stages or scales_stages(plan, hp)
    scales = 2 * rows * u * 4 + stages * (rows + u) * hp.k_chunk * hp.itemsize

    def own_pipeline(cell: PersistentPlan) -> int:
        rows_and_cols = cell.rows_per_block + cell.cols_per_block
        return 0 if cell.staged else cell.stages * rows_and_cols * cell.k_chunk * cell.itemsize

    cast = rows * u * plan.itemsize
    main = plan.smem_bytes(save=save) - own_pipeline(plan) - cast
    hyper = hp.smem_bytes(has_z=False, save=save) - own_pipeline(hp) + scales
    pipelines = max(own_pipeline(plan), own_pipeline(hp))
    barriers = MBARRIER_BYTES * (hp.pipeline_barriers(hp.stages) + 8)
    return max(main, hyper) + cast + pipelines + barriers + ALIGNMENT_SLACK


def fit_plans(plan: PersistentPlan, hyper_plan: PersistentPlan, count=None) -> tuple:
    """(main, hyper) plans whose pair fits a block by ``count`` (the forward's `smem_bytes`,
    its z pipeline at 1 stage): the main cell's stages kept while some hyper depth fits (the
    deepest), else one fewer; PlanError where none fits."""
    count = count or functools.partial(smem_bytes, z_stages=1)
    for main_stages in range(plan.stages, 0, -1):
        main = dataclasses.replace(plan, stages=main_stages)
        for stages in range(hyper_plan.stages, 0, -1):
            hyper = dataclasses.replace(hyper_plan, stages=stages)
            if count(main, hyper) <= plan.smem_limit:
                return main, hyper
    raise PlanError(
        f"persistent pair: the hyper cell's blocks do not fit {plan.smem_limit} B of shared "
        f"memory beside the main cell's ({plan}, {hyper_plan})."
    )


def check_pair(plan: PersistentPlan, hyper_plan: PersistentPlan, interpret: Any) -> None:
    """PlanError (one line) unless both plans run as one grid's blocks, in a block's shared
    memory (the forward's; `check_blocks` for either direction's blocks)."""
    check_blocks(plan, hyper_plan, interpret)
    need = smem_bytes(plan, hyper_plan)
    if need > plan.smem_limit:
        raise PlanError(
            f"persistent pair: {need} B of shared memory a block exceed {plan.smem_limit} B: "
            "use fit_plans."
        )


def check_blocks(plan: PersistentPlan, hyper_plan: PersistentPlan, interpret: Any) -> None:
    """PlanError (one line) unless the plans' blocks can share one grid and its barrier."""
    hp = hyper_plan
    if (hp.rows_per_block, hp.row_blocks, hp.dtype) != (
        plan.rows_per_block, plan.row_blocks, plan.dtype,
    ):  # fmt: skip
        raise PlanError(
            f"persistent pair: the hyper plan {hp} needs the main plan's rows per block, row "
            f"blocks and dtype ({plan})."
        )
    if (hp.producer, hp.split_k) != (plan.producer, plan.split_k):
        raise PlanError("persistent pair: both cells' plans need the same sharing.")
    if plan.multicast or hp.multicast:
        raise PlanError("persistent pair: sharing=multicast runs in layouts 'rowgroup', 'grid'.")
    blocks = plan.row_blocks * (plan.col_blocks + hp.col_blocks)
    if blocks > plan.sm_count:
        raise PlanError(
            f"persistent pair: {blocks} blocks exceed the {plan.sm_count} SMs (the grid "
            "barrier needs every block resident): use layout 'rowgroup' or 'grid'."
        )
    if interpret is not None:
        from rhhjax.kernels.mosaic import interpret as gpu_interpret

        reason = gpu_interpret.cluster_too_large(blocks)
        if reason is not None:
            raise PlanError(f"persistent pair of {blocks} blocks: {reason}")


def _check_operands(plan, hyper_plan, main, hyper, proj, proj_bias) -> tuple[int, int]:
    steps, depth = pf.check_operands(plan, *main[:4], None, main.mask)
    if pf.check_operands(hyper_plan, *hyper[:4], None, hyper.mask) != (steps, depth):
        raise PlanError("persistent pair: the cells' operands differ in steps or layers.")
    expected = {
        "proj": (proj, (depth * plan.n_pad, hyper_plan.k_pad), plan.dtype),
        "proj_bias": (proj_bias, (depth, plan.rows_per_block, plan.n_pad), "float32"),
    }
    for name, (array, shape, dtype) in expected.items():
        if tuple(array.shape) != shape or jnp.dtype(array.dtype).name != dtype:
            raise PlanError(
                f"persistent pair: {name} is {jnp.dtype(array.dtype).name}{list(array.shape)}, "
                f"expected {dtype}{list(shape)}."
            )
    return steps, depth


def _union_part(types: dict, flatten: bool) -> tuple[dict, dict]:
    """Scratch types -> (the shared memory for a union, the rest): barriers, and unions unless
    ``flatten`` (then their refs apart, the same tree)."""
    group, rest = {}, {}
    for name, value in types.items():
        if isinstance(value, plgpu.RefUnion) and flatten:
            group[name] = value.refs
        elif isinstance(value, (plgpu.Barrier, plgpu.ClusterBarrier, plgpu.RefUnion)):
            rest[name] = value
        else:
            group[name] = value
    return group, rest


def launch(kernel, grid: tuple[int, int], scratch: tuple[dict, dict], *, interpret, **options):
    """``plgpu.kernel`` of ``kernel`` over the pair's grid (R, C + C_hyper) with the two cells'
    ``scratch`` (main, hyper) as one shared-memory union; in the body `cell_scratch` splits
    it again. ``options``: out_type, kernel_name and the warpgroups."""
    (smem_m, bars_m), (smem_h, bars_h) = (
        _union_part(scratch[0], False),
        _union_part(scratch[1], True),
    )
    types = dict(cells=plgpu.RefUnion(smem_m, smem_h))
    types |= {f"m_{k}": v for k, v in bars_m.items()} | {f"h_{k}": v for k, v in bars_h.items()}
    launch_args, phase_bar = grid_barrier.launch(grid, ("r", "g"), interpret)
    return plgpu.kernel(
        kernel, scratch_types=types | phase_bar, **launch_args, interpret=interpret, **options
    )


def cell_scratch(sc: dict) -> tuple[dict, dict]:
    """The kernel body's scratch (`launch`'s) -> (main's, hyper's), by the cells' names."""
    smem_m, smem_h = sc.pop("cells")
    main = smem_m | {k[2:]: v for k, v in sc.items() if k.startswith("m_")}
    return main, smem_h | {k[2:]: v for k, v in sc.items() if k.startswith("h_")}


def _cell_scratch(plan, mm_dtype, has_z, has_mask, save, interpret) -> dict:
    types = persistent_cell.scratch(plan, mm_dtype, has_z, has_mask, save, interpret)
    if not plan.in_registers:
        types["pre"] = plgpu.SMEM((plan.rows_per_block, plan.cols_per_block), F32)
    return types


def persistent_pair_forward(
    plan: PersistentPlan,
    hyper_plan: PersistentPlan,
    main: CellOperands,
    hyper: CellOperands,
    proj: Array,
    proj_bias: Array,
    *,
    save: bool,
    keep: float = 1.0,
    spin_limit: int = grid_barrier.DEFAULT_SPIN_LIMIT,
    interpret: Any = None,
) -> PairOutputs:
    """Both cells' T * L forward phases in one launch of R x (C + C_hyper) blocks: iteration
    i runs hyper phase i, z of hyper phase i - 1 and main phase i - 2, then the barrier."""
    steps, depth = _check_operands(plan, hyper_plan, main, hyper, proj, proj_bias)
    check_pair(plan, hyper_plan, interpret)
    phases = steps * depth
    n_r, n_main, n_hyper = plan.row_blocks, plan.col_blocks, hyper_plan.col_blocks
    n_c = n_main + n_hyper
    mm_dtype = main.w_blk.dtype
    cells_in = [[a for a in cell if a is not None] for cell in (main, hyper)]
    operands = [*cells_in[0], *cells_in[1], proj, proj_bias]
    out_type = persistent_cell.out_types(plan, phases, save, mm_dtype)
    out_type += persistent_cell.out_types(hyper_plan, phases, save, mm_dtype)
    z_type = jax.ShapeDtypeStruct((depth, steps, plan.b_pad, plan.z_width), F32)
    tail_type = jax.ShapeDtypeStruct((plan.b_pad, hyper_plan.k_pad), mm_dtype)
    out_type += [z_type, tail_type, jax.ShapeDtypeStruct((n_r * n_c,), jnp.int32)]
    n_cell_out = 2 + save

    def cell_refs(ins, outs, z=None, has_mask=False):
        named = dict(w=ins[0], s0=ins[1], x=ins[2], bias=ins[3], z=z, mask=None)
        if has_mask:
            named["mask"] = ins[4]
        named["states"], named["packed"] = outs[0], outs[1] if save else None
        named["s_mm"] = outs[1 + save]
        return named

    def make_cell(cell_plan, refs, sc, r, g, has_z):
        (cast,), (mask_tile,) = sc["cast_or_mask"]
        return persistent_cell.Cell(
            plan=cell_plan, steps=steps, depth=depth, keep=keep, save=save, has_z=has_z,
            refs=refs, state=sc["state"], pre=sc.get("pre"), epi=sc["epi"], cast=cast,
            mask_tile=mask_tile, bar=sc["bar"], r=r, g=g, bias_rows=sc.get("bias_rows"),
            staged=persistent_cell.staged_operands(sc, cell_plan, interpret),
            producer=persistent_cell.producer_of(sc, cell_plan, interpret),
        )  # fmt: skip

    def kernel(*refs, phase_bar=None, **sc):
        n_m, n_h = len(cells_in[0]), len(cells_in[1])
        ins_m, ins_h = refs[:n_m], refs[n_m : n_m + n_h]
        proj_g, pbias_g = refs[n_m + n_h : n_m + n_h + 2]
        outs = refs[len(operands) :]
        z_g, tail_g, status_g = outs[2 * n_cell_out :]
        r, g = grid_barrier.block_index((n_r, n_c), ("r", "g"), phase_bar)
        block = r * n_c + g
        barrier = grid_barrier.make_barrier(n_r * n_c, block == 0, spin_limit, phase_bar)
        sc_m, sc_h = cell_scratch(sc)
        main_cell = make_cell(
            plan, cell_refs(ins_m, outs[:n_cell_out], z_g, main.mask is not None), sc_m, r,
            jnp.minimum(g, n_main - 1), True,
        )  # fmt: skip
        h_refs = cell_refs(ins_h, outs[n_cell_out : 2 * n_cell_out], None, hyper.mask is not None)
        hyper_cell = make_cell(hyper_plan, h_refs, sc_h, r, jnp.maximum(g - n_main, 0), False)
        scales = _Scales(hyper_cell, proj_g, pbias_g, z_g, tail_g, sc_h)
        is_main = g < n_main

        def run():
            @pl.when(is_main)
            def _():
                status_g[block] = _main_iterations(main_cell, barrier)

            @pl.when(jnp.logical_not(is_main))
            def _():
                status_g[block] = _hyper_iterations(hyper_cell, scales, barrier, n_main)

        if main_cell.producer is None:
            return run()
        warpgroup = jax.lax.axis_index(persistent_cell.WARPGROUPS)
        pl.when(warpgroup == 0)(run)
        after_go = grid_barrier.fence_proxy_async_global if interpret is None else None
        pl.when(jnp.logical_and(warpgroup == 1, is_main))(lambda: main_cell.produce(after_go))
        hyper_blocks = jnp.logical_and(warpgroup == 1, jnp.logical_not(is_main))
        pl.when(hyper_blocks)(lambda: hyper_cell.produce(after_go))

    has_masks = (main.mask is not None, hyper.mask is not None)
    types_m = _cell_scratch(plan, mm_dtype, True, has_masks[0], save, interpret)
    types_h = _cell_scratch(hyper_plan, mm_dtype, False, has_masks[1], save, interpret)
    types_h |= _scales_scratch(plan, hyper_plan, mm_dtype)
    outs = launch(
        kernel, (n_r, n_c), (types_m, types_h), interpret=interpret, out_type=tuple(out_type),
        kernel_name="persistent_pair_forward", **persistent_cell.warpgroups(plan.producer),
    )(*operands)  # fmt: skip
    return _pair_outputs(outs, save, n_cell_out)


def _pair_outputs(outs, save: bool, n_cell_out: int) -> PairOutputs:
    kind = pf.Saved if save else pf.States
    status = outs[-1]
    cells = [kind(*outs[i * n_cell_out : (i + 1) * n_cell_out], status) for i in range(2)]
    return PairOutputs(cells[0], cells[1], outs[2 * n_cell_out], status)


def _scales_scratch(plan: PersistentPlan, hyper_plan: PersistentPlan, mm_dtype) -> dict:
    """The hyper blocks' z: an f32 tile, its bias tile, its K pipeline (`gemm.staged_scratch`)."""
    rows, u, hp = plan.rows_per_block, plan.units_per_block, hyper_plan
    tile = plgpu.SMEM((rows, u), F32)
    pipeline = gemm.staged_scratch(rows, u, hp.k_chunk, scales_stages(plan, hp), mm_dtype)
    types = dict(project=tile, project_bias=tile, project_bar=plgpu.Barrier(num_barriers=1))
    return types | {f"project_{name}": value for name, value in pipeline.items()}


class _Scales:
    """The hyper blocks' z: z_q [rows, main units c] = s_hyper(q) @ P_l[:, c] + p_l for each
    main column block c = g_h, g_h + C_hyper, ... (one f32 tile at a time)."""

    def __init__(self, hyper_cell, proj_g, pbias_g, z_g, tail_g, sc_h):
        self.cell, self.proj, self.pbias = hyper_cell, proj_g, pbias_g
        self.z, self.tail = z_g, tail_g
        self.tile, self.bias_tile = sc_h["project"], sc_h["project_bias"]
        self.bar = sc_h["project_bar"]
        self.staged = gemm.StagedOperands(
            **{name: sc_h[f"project_{name}"] for name in ("a", "b", "a_bar", "b_bar")}
        )

    def keep_tail(self, p) -> None:
        """After the last hyper phase: its state's cast, the A rows of the last z."""
        cell = self.cell
        row_sl, unit_sl = cell.slices()

        @pl.when(jnp.logical_and(cell.in_a(), p == cell.phases - 1))
        def _():
            plgpu.copy_smem_to_gmem(cell.cast, self.tail.at[row_sl, unit_sl])

    def write(self, q, main_cols: int) -> None:
        """z of hyper phase ``q`` (its state complete: after the barrier that ended it)."""
        cell, hp = self.cell, self.cell.plan
        steps, depth = cell.steps, cell.depth
        t, layer = jax.lax.div(q, depth), jax.lax.rem(q, depth)
        rows, u = self.tile.shape
        row_sl = pl.ds(cell.r * rows, rows)
        last = q == cell.phases - 1
        a_block = slots.slot(jnp.minimum(q + 1, cell.phases - 1), steps, depth) * hp.row_blocks
        project = functools.partial(
            gemm.gemm_nt_staged, self.tile, self.staged, k_steps=hp.k_pad // hp.k_chunk
        )

        def column(j, carry):
            c = cell.g + j * hp.col_blocks
            unit_sl = pl.ds(c * u, u)

            @pl.when(c < main_cols)
            def _():
                plgpu.copy_gmem_to_smem(self.pbias.at[layer, :, unit_sl], self.bias_tile, self.bar)
                b_block = layer * main_cols + c
                pl.when(jnp.logical_not(last))(
                    lambda: project(cell.refs["s_mm"], self.proj, a_block + cell.r, b_block)
                )
                pl.when(last)(lambda: project(self.tail, self.proj, cell.r, b_block))
                plgpu.barrier_wait(self.bar)
                z = keep_mask.load_strided(self.tile) + keep_mask.load_strided(self.bias_tile)
                plgpu.commit_smem()  # every thread read both tiles before they are rewritten
                self.tile[...] = z
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(self.tile, self.z.at[layer, t, row_sl, unit_sl])
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)

            return carry

        jax.lax.fori_loop(0, -(-main_cols // hp.col_blocks), column, None)


def _main_iterations(cell, barrier) -> jax.Array:
    """A main block's P + LEAD iterations (phase i - LEAD); its status (`_iterations`)."""

    def work(i):
        pl.when(i >= LEAD)(lambda: cell.phase(i - LEAD))

    return _iterations(cell, barrier, work, lambda i: i - LEAD)


def _hyper_iterations(cell, scales: _Scales, barrier, main_cols: int) -> jax.Array:
    """A hyper block's P + LEAD iterations (phase i, then z of phase i - 1); its status."""

    def work(i):
        @pl.when(i < cell.phases)
        def _():
            cell.phase(i)
            scales.keep_tail(i)

        pl.when(jnp.logical_and(i >= 1, i <= cell.phases))(lambda: scales.write(i - 1, main_cols))
        plgpu.wait_smem_to_gmem(0)  # z and the tail written before the barrier

    return _iterations(cell, barrier, work, lambda i: i)


def _iterations(cell, barrier, work, phase_of) -> jax.Array:
    """``cell``'s prologue, then ``work(i)`` and barrier i + 1 for i < P + LEAD; the status:
    0, or 1 + the barrier the block gave up at (the producer's loads taken all the same)."""
    cell.prologue()
    code = jnp.where(barrier(jnp.int32(0)), jnp.int32(0), jnp.int32(1))

    def iteration(i, code):
        def run(code):
            work(i)
            return jnp.where(barrier(i + 1), code, i + 2)

        def skip(code):
            p = phase_of(i)
            if cell.producer is not None:
                taken = functools.partial(
                    gemm.skip_gemm, cell.producer, gemm=p, k_steps=cell.k_steps
                )
                pl.when(jnp.logical_and(p >= 0, p < cell.phases))(taken)
            return code

        return jax.lax.cond(code == 0, run, skip, code)

    code = jax.lax.fori_loop(0, cell.phases + LEAD, iteration, code)
    persistent_cell.wait_for_every_store()
    return code


def scales_reference(plan, hyper_plan, hyper_states, proj, proj_bias, steps: int) -> Array:
    """z [L, T, b_pad, z_width] from the hyper states [P, b_pad, nh_pad], as the kernel."""
    depth = proj_bias.shape[0]
    s_mm = hyper_states[..., : hyper_plan.k_pad].astype(proj.dtype)
    proj_l = proj.reshape(depth, plan.n_pad, hyper_plan.k_pad)
    layers = jnp.arange(steps * depth) % depth
    z = jnp.einsum("pbk,pnk->pbn", s_mm, proj_l[layers], preferred_element_type=F32)
    z = z + proj_bias[layers, :1]
    return slots.scales_to_layer_major(z, steps, depth, plan.z_width)


def persistent_pair_forward_reference(
    plan: PersistentPlan,
    hyper_plan: PersistentPlan,
    main: CellOperands,
    hyper: CellOperands,
    proj: Array,
    proj_bias: Array,
    *,
    save: bool,
    keep: float = 1.0,
    spin_limit: int = grid_barrier.DEFAULT_SPIN_LIMIT,
    interpret: Any = None,
) -> PairOutputs:
    """Pure-JAX `persistent_pair_forward`: the hyper cell's reference, z, the main cell's."""
    del spin_limit, interpret
    steps, _ = _check_operands(plan, hyper_plan, main, hyper, proj, proj_bias)
    h_args = (hyper_plan, *hyper[:4], None, hyper.mask)
    h_out = pf.persistent_forward_reference(*h_args, save=save, keep=keep)
    h_states = pf.persistent_forward_reference(*h_args, save=False, keep=keep).states
    z = scales_reference(plan, hyper_plan, h_states, proj, proj_bias, steps)
    m_out = pf.persistent_forward_reference(
        plan, *main[:4], z, main.mask, save=save, keep=keep
    )  # fmt: skip
    status = jnp.zeros((plan.row_blocks * (plan.col_blocks + hyper_plan.col_blocks),), jnp.int32)
    return PairOutputs(m_out._replace(status=status), h_out._replace(status=status), z, status)
