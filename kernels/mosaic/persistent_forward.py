"""The persistent highway forward as one Mosaic GPU kernel: all P = T * L micro-layer phases
in one launch, a grid barrier between phases.

Block (r, g) of the grid (plan.row_blocks, plan.col_blocks) owns rows and units and keeps
its f32 state slice in shared memory; per phase it runs `forward.py`'s micro-layer and
writes the next phase's GEMM input to the A buffer ``s_mm``. Operands: w_blk
[L * 2 * n_pad, k_pad], s0 [b_pad, n_pad], xproj [T, b_pad, 2, z_width], bias
[L, b_pad, 2, n_pad], z [L, T, b_pad, z_width] or None, mask [P, b_pad, n_pad] uint8 or
None. With `HyperInside` the hyper cell runs in the same launch, one phase ahead.
`persistent_forward_reference` is the same in JAX. Design: docs/design.md (module notes).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from rhhjax.kernels.layout import F32
from rhhjax.kernels.mosaic import forward as mf
from rhhjax.kernels.mosaic import grid_barrier, keep_mask, persistent_cell, rowgroup_layout
from rhhjax.kernels.mosaic import persistent_slots as slots
from rhhjax.kernels.mosaic.gemm import gemm_nt_to_smem
from rhhjax.kernels.mosaic.plan import PersistentPlan, PlanError, check_arrays

Array = jax.Array
HYPER_BLOCKS = ("shared", "own")  # where the hyper cell inside runs: `persistent_forward`


def forward_weights(plan: PersistentPlan, kernel_s: Array, dtype) -> Array:
    """W [L, n, 2n] -> w_blk [L * 2 * n_pad, k_pad]: per layer `block_weight`, stacked."""
    depth, n = kernel_s.shape[0], plan.width
    if kernel_s.shape[1:] != (n, 2 * n):
        raise PlanError(f"kernel_s has shape {kernel_s.shape}, expected [L, {n}, {2 * n}].")
    w = kernel_s.reshape(depth, n, 2, n)
    w = jnp.pad(w, [(0, 0), (0, 0), (0, 0), (0, plan.n_pad - n)])
    w = w.reshape(depth, n, 2 * plan.n_pad)
    blocks = [
        mf.block_weight(w[layer], dtype, plan.units_per_block, plan.k_pad) for layer in range(depth)
    ]
    return jnp.concatenate(blocks, axis=0)


def check_operands(plan, w_blk, s0, xproj, bias, z, mask) -> tuple[int, int]:
    """One-line PlanError unless the operands have the plan's padded shapes; (T, L)."""
    plan.check()
    if mask is not None:
        keep_mask.check_plan(plan, "forward")
    if (plan.units_per_block * plan.itemsize) % 16:
        raise PlanError(
            f"persistent forward needs units_per_block * itemsize a multiple of 16 B (TMA "
            f"stores of the state cast), got {plan.units_per_block} {plan.dtype} units: "
            "choose col_blocks so it is."
        )
    steps, depth = xproj.shape[0], bias.shape[0]
    b, n, k = plan.b_pad, plan.n_pad, plan.k_pad
    phases = steps * depth
    expected = {
        "w_blk": (w_blk, (depth * 2 * n, k), plan.dtype),
        "s0": (s0, (b, n), "float32"),
        "xproj": (xproj, (steps, b, 2, plan.z_width), "float32"),
        "bias": (bias, (depth, b, 2, n), "float32"),
        "z": (z, (depth, steps, b, plan.z_width), "float32"),
    }
    keep_mask.check_operand(mask, (phases, b, n), "forward")
    for name, (array, shape, dtype) in expected.items():
        if array is None:
            continue
        if tuple(array.shape) != shape or jnp.dtype(array.dtype).name != dtype:
            raise PlanError(
                f"persistent forward: {name} is {jnp.dtype(array.dtype).name}"
                f"{list(array.shape)}, expected {dtype}{list(shape)} for {plan}."
            )
    return steps, depth


class HyperInside(NamedTuple):
    """The hyper cell's operands when it runs inside `persistent_forward` (on blocks
    (r, g < plan.col_blocks)): as the main cell's for its own ``plan``, plus proj
    [L * n_pad, kh_pad] (P_l^T) and proj_bias [L, b_pad, n_pad]; z_p = s_hyper[p] P_l + p_l."""

    plan: PersistentPlan
    w_blk: Array
    s0: Array
    xproj: Array
    bias: Array
    mask: Array | None
    proj: Array
    proj_bias: Array


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


def check_hyper(plan: PersistentPlan, hyper: HyperInside, steps: int, depth: int) -> None:
    """PlanError unless the hyper plan and operands suit the main plan."""
    hp = hyper.plan
    same = (hp.rows_per_block, hp.row_blocks, hp.dtype) == (
        plan.rows_per_block, plan.row_blocks, plan.dtype,
    )  # fmt: skip
    if not same or hp.col_blocks > plan.col_blocks:
        raise PlanError(
            f"hyper plan {hp} does not fit inside {plan}: it needs the same rows per block, "
            "row blocks and dtype, and at most as many column blocks."
        )
    h_steps, h_depth = check_operands(
        hp, hyper.w_blk, hyper.s0, hyper.xproj, hyper.bias, None, hyper.mask
    )
    if (h_steps, h_depth) != (steps, depth):
        raise PlanError(
            f"hyper operands have {h_steps} steps x {h_depth} layers, the main {steps} x {depth}."
        )
    expected = {
        "proj": (hyper.proj, (depth * plan.n_pad, hp.k_pad), plan.dtype),
        "proj_bias": (hyper.proj_bias, (depth, plan.b_pad, plan.n_pad), "float32"),
    }
    check_arrays(expected, "persistent forward: hyper")


def check_hyper_blocks(
    plan: PersistentPlan, hyper_plan: PersistentPlan | None, hyper_blocks: str, layout: str,
    interpret,
) -> bool:  # fmt: skip
    """Whether the hyper cell runs on blocks of its own; PlanError unless it can."""
    if hyper_blocks not in HYPER_BLOCKS:
        raise PlanError(f"persistent forward: hyper_blocks {hyper_blocks!r} not in {HYPER_BLOCKS}.")
    if hyper_plan is None or hyper_blocks == "shared":
        return False
    blocks = plan.row_blocks * (plan.col_blocks + hyper_plan.col_blocks)
    if layout != "grid" or blocks > plan.sm_count:
        raise PlanError(
            f"persistent forward: the hyper cell on blocks of its own needs the grid layout and "
            f"{blocks} blocks <= {plan.sm_count} SMs (layout {layout!r})."
        )
    if interpret is not None:
        dataclasses.replace(plan, col_blocks=blocks // plan.row_blocks).check_interpretable()
    return True


def scales_to_smem(
    hyper_plan: PersistentPlan,
    s_mm,
    tail,
    proj,
    r,
    g,
    steps: int,
    depth: int,
    p,
    layer,
    z_slot,
) -> None:
    """z_slot [rows, u] f32 = s_hyper[p] @ P_l[:, units g], no bias; the backward calls it
    too, so the recomputed z equals the forward's."""
    rows = z_slot.shape[0]
    n_r, n_c = s_mm.shape[0] // (steps * depth * rows), proj.shape[0] // (depth * z_slot.shape[1])
    k_chunk = hyper_plan.k_chunk
    gemm = functools.partial(
        gemm_nt_to_smem, z_slot, tile_k=k_chunk, k_steps=hyper_plan.k_pad // k_chunk,
        stages=hyper_plan.stages,
    )  # fmt: skip
    b_block, last = layer * n_c + g, p == steps * depth - 1

    @pl.when(jnp.logical_not(last))
    def _():
        gemm(s_mm, proj, slots.slot(p + 1, steps, depth) * n_r + r, b_block)

    @pl.when(last)
    def _():
        gemm(tail, proj, r, b_block)


def persistent_forward(
    plan: PersistentPlan,
    w_blk: Array,
    s0: Array,
    xproj: Array,
    bias: Array,
    z: Array | None = None,
    mask: Array | None = None,
    *,
    save: bool,
    keep: float = 1.0,
    spin_limit: int = grid_barrier.DEFAULT_SPIN_LIMIT,
    interpret: Any = None,
    layout: str = "grid",
    hyper: HyperInside | None = None,
    save_scales: bool = True,
    hyper_blocks: str = "shared",
):
    """All T * L forward phases in one Mosaic GPU launch.

    Returns (states [P, b_pad, n_pad], s_mm, status) or with ``save`` (s_last
    [1, b_pad, n_pad], packed [P, b_pad, K, n_pad], s_mm [P * b_pad, k_pad], status).
    With ``hyper`` the hyper cell's outputs follow the main cell's, then z (with
    ``save_scales``) and ``tail`` [b_pad, kh_pad], then status. ``hyper_blocks``
    "shared": the hyper cell's phases run on main blocks (r, g < hyper col_blocks) after
    theirs; "own": on blocks of their own, the grid's columns after the main ones, at the
    same time as the main phases (status has a block more per hyper column).
    """
    steps, depth = check_operands(plan, w_blk, s0, xproj, bias, z, mask)
    if hyper is not None:
        if z is not None:
            raise PlanError("persistent forward: pass z or the hyper cell, not both.")
        check_hyper(plan, hyper, steps, depth)
        if plan.staged or hyper.plan.staged:
            levers = (plan if plan.staged else hyper.plan).staged_levers()
            raise PlanError(f"persistent forward: {levers} runs the hyper cell apart.")
    hyper_plan = None if hyper is None else hyper.plan
    own = check_hyper_blocks(plan, hyper_plan, hyper_blocks, layout, interpret)
    rowgroup_layout.check(plan, layout, interpret)
    launch, block_index, make_barrier = rowgroup_layout.functions(layout, interpret, plan)
    phases = steps * depth
    n_r, n_main = plan.row_blocks, plan.col_blocks
    n_c = n_main + (hyper.plan.col_blocks if own else 0)  # the grid's columns
    mm_dtype = w_blk.dtype
    z_inside = hyper is not None
    has_z = z is not None or z_inside
    operands = [w_blk, s0, xproj, bias, *(a for a in (z, mask) if a is not None)]
    if z_inside:
        operands += [hyper.w_blk, hyper.s0, hyper.xproj, hyper.bias, hyper.proj, hyper.proj_bias]
        operands += [hyper.mask] if hyper.mask is not None else []
    out_type = persistent_cell.out_types(plan, phases, save, mm_dtype)
    if z_inside:
        hp = hyper.plan
        out_type += persistent_cell.out_types(hp, phases, save, mm_dtype)
        if save and save_scales:
            out_type.append(jax.ShapeDtypeStruct((depth, steps, plan.b_pad, plan.z_width), F32))
        out_type.append(jax.ShapeDtypeStruct((plan.b_pad, hp.k_pad), mm_dtype))
    out_type.append(jax.ShapeDtypeStruct((n_r * n_c,), jnp.int32))

    def cell_refs(refs, outs, has_own_z, has_mask):
        """A cell's refs by name from its operand and output refs."""
        named = dict(w=refs[0], s0=refs[1], x=refs[2], bias=refs[3], z=None, mask=None)
        rest = list(refs[4:])
        if has_own_z:
            named["z"] = rest.pop(0)
        if has_mask:
            named["mask"] = rest.pop(0)
        named["states"], named["packed"] = outs[0], outs[1] if save else None
        named["s_mm"] = outs[1 + save]
        return named

    def kernel(*refs, phase_bar=None, **scratch):
        n_in = len(operands)
        ins_g, outs_g = refs[:n_in], refs[n_in:]
        status_g = outs_g[-1]
        r, g = block_index((n_r, n_c), ("r", "g"), phase_bar)
        block = r * n_c + g
        barrier = make_barrier(n_r * n_c, block == 0, spin_limit, phase_bar)
        n_main_in = 4 + (z is not None) + (mask is not None)
        n_main_out = 2 + save
        main_refs = cell_refs(
            ins_g[:n_main_in], outs_g[:n_main_out], z is not None, mask is not None
        )

        def make_cell(cell_plan, named, sc, pre, cell_has_z, cell_z_inside, fill_z=None, col=g):
            (cast,), (mask_tile,) = sc["cast_or_mask"]
            return persistent_cell.Cell(
                cell_plan, steps, depth, keep, save, cell_has_z, cell_z_inside, named,
                sc["state"], pre, sc["epi"], cast, mask_tile, sc["bar"], r, col, fill_z,
                persistent_cell.staged_operands(sc, cell_plan, interpret),
            )  # fmt: skip

        main_sc = {k[2:]: v for k, v in scratch.items() if k.startswith("m_")}
        hyper_cell = None
        if z_inside:
            (main_pre,), (hyper_pre,) = scratch["pre"]
            h_in = ins_g[n_main_in:]
            h_outs = outs_g[n_main_out : n_main_out + 2 + save]
            hyper_refs = cell_refs(
                (*h_in[:4], *h_in[6:]), h_outs, False, hyper.mask is not None
            )  # fmt: skip
            proj_g, pbias_g = h_in[4], h_in[5]
            tail_g = outs_g[-2]
            hyper_refs["tail"] = tail_g
            main_refs["proj_bias"] = pbias_g
            if save and save_scales:
                main_refs["z"] = outs_g[-3]
            hyper_sc = {k[2:]: v for k, v in scratch.items() if k.startswith("h_")}
            hyper_col = g - n_main if own else g
            hyper_cell = make_cell(hp, hyper_refs, hyper_sc, hyper_pre, False, False, col=hyper_col)
            fill_z = functools.partial(
                scales_to_smem, hp, hyper_refs["s_mm"], tail_g, proj_g, r, g, steps, depth
            )
            main = make_cell(plan, main_refs, main_sc, main_pre, True, True, fill_z)
        else:
            main = make_cell(plan, main_refs, main_sc, scratch["pre"], z is not None, False)
        is_hyper_block = g >= n_main if own else g < (hyper.plan.col_blocks if z_inside else 0)
        on_main = (lambda f: pl.when(g < n_main)(f)) if own else (lambda f: f())

        on_main(main.prologue)
        if z_inside:
            pl.when(is_hyper_block)(hyper_cell.prologue)
        code = jnp.where(barrier(jnp.int32(0)), jnp.int32(0), jnp.int32(1))
        first_barrier = 1
        if z_inside:  # hyper phase 0, so that main phase 0's z can read its state

            def hyper_first(code):
                pl.when(is_hyper_block)(lambda: hyper_cell.phase(jnp.int32(0)))
                return jnp.where(barrier(jnp.int32(1)), code, jnp.int32(2))

            code = jax.lax.cond(code == 0, hyper_first, lambda c: c, code)
            first_barrier = 2

        def phase(p, code):
            def work(code):
                on_main(lambda: main.phase(p))
                if z_inside:
                    ahead = jnp.logical_and(is_hyper_block, p + 1 < phases)
                    pl.when(ahead)(lambda: hyper_cell.phase(p + 1))
                ok = barrier(p + first_barrier)
                return jnp.where(ok, code, p + first_barrier + 1)

            return jax.lax.cond(code == 0, work, lambda c: c, code)

        code = jax.lax.fori_loop(0, phases, phase, code)
        main.abandon(code, first_barrier)
        persistent_cell.wait_for_every_store()
        status_g[block] = code

    main_scratch = persistent_cell.scratch(
        plan, mm_dtype, has_z, mask is not None, save, z_inside, interpret
    )
    scratch_types = {f"m_{k}": v for k, v in main_scratch.items()}
    if z_inside:
        rows = plan.rows_per_block
        hyper_scratch = persistent_cell.scratch(
            hp, mm_dtype, False, hyper.mask is not None, save, False, interpret
        )
        scratch_types |= {f"h_{k}": v for k, v in hyper_scratch.items()}
        # The hyper cell's GEMM runs after the main epilogue has read `pre`: one buffer.
        scratch_types["pre"] = plgpu.RefUnion(
            (plgpu.SMEM((rows, plan.cols_per_block), F32),),
            (plgpu.SMEM((rows, hp.cols_per_block), F32),),
        )
    else:
        scratch_types["pre"] = plgpu.SMEM((plan.rows_per_block, plan.cols_per_block), F32)
    launch_args, phase_bar = launch((n_r, n_c), ("r", "g"), interpret)
    return plgpu.kernel(
        kernel,
        out_type=tuple(out_type),
        scratch_types=dict(**scratch_types, **phase_bar),
        **launch_args,
        kernel_name="persistent_hyper_highway_forward"
        if z_inside
        else "persistent_highway_forward",
        interpret=interpret,
    )(*operands)


def persistent_forward_reference(
    plan: PersistentPlan,
    w_blk: Array,
    s0: Array,
    xproj: Array,
    bias: Array,
    z: Array | None = None,
    mask: Array | None = None,
    *,
    save: bool,
    keep: float = 1.0,
    spin_limit: int = grid_barrier.DEFAULT_SPIN_LIMIT,
    interpret: Any = None,
    layout: str = "grid",
    hyper: HyperInside | None = None,
    save_scales: bool = True,
    hyper_blocks: str = "shared",
):
    """Pure-JAX `persistent_forward` (status all zeros, one per main block): a scan of
    `highway_forward_reference` over the phases."""
    del spin_limit, interpret, layout, hyper_blocks
    steps, depth = check_operands(plan, w_blk, s0, xproj, bias, z, mask)
    if hyper is not None:
        if z is not None:
            raise PlanError("persistent forward: pass z or the hyper cell, not both.")
        check_hyper(plan, hyper, steps, depth)
        hp = hyper.plan
        h_args = (hp, hyper.w_blk, hyper.s0, hyper.xproj, hyper.bias, None, hyper.mask)
        h_outs = persistent_forward_reference(*h_args, save=save, keep=keep)
        h_states = persistent_forward_reference(*h_args, save=False, keep=keep)[0]
        z = hyper_scales_reference(plan, hp, h_states, hyper.proj, hyper.proj_bias, steps)
        main = persistent_forward_reference(
            plan, w_blk, s0, xproj, bias, z, mask, save=save, keep=keep
        )
        tail = h_states[-1, :, : hp.k_pad].astype(w_blk.dtype)
        z_out = (z,) if save and save_scales else ()
        return (*main[:-1], *h_outs[:-1], *z_out, tail, main[-1])
    xproj = jnp.pad(xproj, [(0, 0)] * 3 + [(0, plan.n_pad - plan.z_width)])  # as TMA reads it
    mm_dtype = w_blk.dtype
    k_pad, rows_w = plan.k_pad, 2 * plan.n_pad
    w_layers = w_blk.reshape(depth, rows_w, k_pad)
    phases = jnp.arange(steps * depth)

    def body(s, xs):
        p, z_p, mask_p = xs
        t, layer = p // depth, p % depth
        x_scale = jnp.where(layer == 0, 1.0, 0.0).astype(F32)
        s_mm = s[:, :k_pad].astype(mm_dtype)
        out = mf.highway_forward_reference(
            s_mm, w_layers[layer], s, bias[layer], z_p, xproj[t] * x_scale, mask_p,
            save=save, units=plan.units_per_block,
        )  # fmt: skip
        s_new = out[0] if save else out
        saved = None
        if save:
            gates = [out[1][:, None], out[2][:, None]]  # h, tg
            rows = [out[3]] if z is not None else gates
            saved = jnp.concatenate([s[:, None]] * plan.state_in_packed + rows, axis=1)
        return s_new, (s_new, saved)

    mask_f32 = keep_mask.mask_values(mask, keep)
    z_pm = None if z is None else slots.scales_to_phase_major(z, plan.n_pad)
    _, (states, packed) = jax.lax.scan(body, s0, (phases, z_pm, mask_f32))
    inputs = jnp.concatenate([s0[None], states[:-1]], axis=0)  # every phase's input state
    s_mm = slots.inputs_to_a_buffer(inputs, steps, depth, k_pad).astype(mm_dtype)
    status = jnp.zeros((plan.grid,), jnp.int32)
    if save:
        return states[-1:], packed, s_mm, status
    return states, s_mm, status


def hyper_scales_reference(
    plan: PersistentPlan, hyper_plan: PersistentPlan, h_states, proj, proj_bias, steps: int
) -> Array:
    """z [L, T, b_pad, z_width] from the hyper states [P, b_pad, h_pad], as the kernel."""
    depth = proj_bias.shape[0]
    s = h_states[..., : hyper_plan.k_pad].astype(proj.dtype).reshape(steps, depth, plan.b_pad, -1)
    p_t = proj.reshape(depth, plan.n_pad, hyper_plan.k_pad)
    z = jnp.einsum("tlbk,lnk->tlbn", s, p_t, preferred_element_type=F32)
    z = z + proj_bias[None]
    z_pm = z.reshape(steps * depth, plan.b_pad, plan.n_pad)
    return slots.scales_to_layer_major(z_pm, steps, depth, plan.z_width)


def scales_from_a_buffer_reference(
    plan: PersistentPlan, hyper_plan: PersistentPlan, s_mm, tail, proj, proj_bias, steps: int
) -> Array:
    """`hyper_scales_reference` from the hyper A buffer ``s_mm`` and ``tail``."""
    depth = proj_bias.shape[0]
    inputs = slots.a_buffer_to_inputs(s_mm, steps, depth, hyper_plan.k_pad)
    after = jnp.concatenate([inputs[1:], tail[None]], axis=0)
    return hyper_scales_reference(plan, hyper_plan, after, proj, proj_bias, steps)
