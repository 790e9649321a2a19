"""The persistent highway forward as one Mosaic GPU kernel: all P = T * L micro-layer phases
in one launch, a grid barrier between them; block (r, g) keeps its rows' and units' f32 state
in shared memory and runs `forward.py`'s micro-layer. Operands: w_blk [L * 2 * n_pad, k_pad],
s0 [b_pad, n_pad], xproj [T, b_pad, 2, z_width], bias [L, b_pad, 2, n_pad], z [L, T, b_pad,
z_width] or None, mask [P, b_pad, n_pad] uint8 or None. Design: docs/design.md."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from rhhjax.kernels.layout import F32
from rhhjax.kernels.mosaic import forward as mf
from rhhjax.kernels.mosaic import gemm, grid_barrier, keep_mask, persistent_cell, rowgroup_layout
from rhhjax.kernels.mosaic import persistent_slots as slots
from rhhjax.kernels.mosaic import phase_timeline as timeline_
from rhhjax.kernels.mosaic.plan import PersistentPlan, PlanError

Array = jax.Array


class Saved(NamedTuple):
    """`persistent_forward`'s outputs with ``save``: s_last [1, b_pad, n_pad], packed [P,
    b_pad, K, n_pad], s_mm [P * b_pad, k_pad], status [R * C] int32."""

    s_last: Array
    packed: Array
    s_mm: Array
    status: Array


class States(NamedTuple):
    """`persistent_forward`'s outputs without ``save``: states [P, b_pad, n_pad], s_mm,
    status."""

    states: Array
    s_mm: Array
    status: Array


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


def check_operands(plan, w_blk, s0, xproj, bias, z, mask, layout="grid") -> tuple[int, int]:
    """One-line PlanError unless the operands have the plan's padded shapes; (T, L)."""
    plan.check(layout)
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
    timeline: bool = False,
):
    """All T * L forward phases in one Mosaic GPU launch: `Saved` with ``save``, else
    `States`; with ``timeline`` (outputs, `phase_timeline.Stamps`)."""
    steps, depth = check_operands(plan, w_blk, s0, xproj, bias, z, mask, layout)
    rowgroup_layout.check(plan, layout, interpret)
    launch, block_index, make_barrier = rowgroup_layout.functions(layout, interpret, plan)
    phases = steps * depth
    n_r, n_c = plan.row_blocks, plan.col_blocks
    mm_dtype = w_blk.dtype
    has_z = z is not None
    operands = [w_blk, s0, xproj, bias, *(a for a in (z, mask) if a is not None)]
    out_type = persistent_cell.out_types(plan, phases, save, mm_dtype)
    out_type.append(jax.ShapeDtypeStruct((n_r * n_c,), jnp.int32))
    n_time = 2 * timeline
    out_type += timeline_.out_types(phases, n_r * n_c) if timeline else []

    def cell_refs(refs, outs):
        """The cell's refs by name from its operand and output refs."""
        named = dict(w=refs[0], s0=refs[1], x=refs[2], bias=refs[3], z=None, mask=None)
        rest = list(refs[4:])
        if has_z:
            named["z"] = rest.pop(0)
        if mask is not None:
            named["mask"] = rest.pop(0)
        named["states"], named["packed"] = outs[0], outs[1] if save else None
        named["s_mm"] = outs[1 + save]
        return named

    def kernel(*refs, phase_bar=None, **sc):
        n_in = len(operands)
        ins_g, outs_g = refs[:n_in], refs[n_in : len(refs) - n_time]
        status_g = outs_g[-1]
        r, g = block_index((n_r, n_c), ("r", "g"), phase_bar)
        block = r * n_c + g
        clocks = timeline_.OFF
        if timeline:
            clocks = timeline_.Timeline(sc["timeline_row"], *refs[-2:], block, interpret)
        barrier = make_barrier(n_r * n_c, block == 0, spin_limit, phase_bar)
        (cast,), (mask_tile,) = sc["cast_or_mask"]
        main = persistent_cell.Cell(
            plan=plan, steps=steps, depth=depth, keep=keep, save=save, has_z=has_z,
            refs=cell_refs(ins_g, outs_g[:-1]), state=sc["state"], pre=sc.get("pre"), epi=sc["epi"],
            cast=cast, mask_tile=mask_tile, bar=sc["bar"], r=r, g=g, bias_rows=sc.get("bias_rows"),
            staged=persistent_cell.staged_operands(sc, plan, interpret), timeline=clocks,
            producer=persistent_cell.producer_of(sc, plan, interpret),
        )  # fmt: skip
        run = functools.partial(_phases, main, barrier, status_g, block)
        if main.producer is None:
            return run()
        warpgroup = jax.lax.axis_index(persistent_cell.WARPGROUPS)
        pl.when(warpgroup == 0)(run)
        after_go = grid_barrier.fence_proxy_async_global if interpret is None else None
        pl.when(warpgroup == 1)(lambda: main.produce(after_go))

    has_mask = mask is not None
    scratch_types = persistent_cell.scratch(plan, mm_dtype, has_z, has_mask, save, interpret)
    if not plan.in_registers:
        scratch_types["pre"] = plgpu.SMEM((plan.rows_per_block, plan.cols_per_block), F32)
    scratch_types |= timeline_.scratch() if timeline else {}
    launch_args, phase_bar = launch((n_r, n_c), ("r", "g"), interpret)
    outs = plgpu.kernel(
        kernel,
        out_type=tuple(out_type),
        scratch_types=dict(**scratch_types, **phase_bar),
        **launch_args,
        **persistent_cell.warpgroups(plan.producer),
        kernel_name="persistent_highway_forward",
        interpret=interpret,
    )(*operands)
    stamps = timeline_.Stamps(*outs[len(outs) - n_time :]) if timeline else None
    outs = Saved(*outs[: len(outs) - n_time]) if save else States(*outs[: len(outs) - n_time])
    return (outs, stamps) if timeline else outs


def _phases(main: persistent_cell.Cell, barrier, status_g, block) -> None:
    """The block's phases (warpgroup 0's with a `gemm.Producer`) and its status."""
    clocks = main.timeline
    clocks.start()
    main.prologue()
    code = jnp.where(barrier(jnp.int32(0)), jnp.int32(0), jnp.int32(1))

    def phase(p, code):
        def work(code):
            clocks.stamp("barrier_passed")
            main.phase(p)
            clocks.stamp("barrier_arrived")
            clocks.flush(p)
            return jnp.where(barrier(p + 1), code, p + 2)

        def skip(code):  # a grid barrier gave up: the producer's loads are taken all the same
            if main.producer is not None:
                gemm.skip_gemm(main.producer, gemm=p, k_steps=main.k_steps)
            return code

        return jax.lax.cond(code == 0, work, skip, code)

    code = jax.lax.fori_loop(0, main.phases, phase, code)
    persistent_cell.wait_for_every_store()
    status_g[block] = code


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
):
    """Pure-JAX `persistent_forward` (status all zeros, one per block): a scan of
    `highway_forward_reference` over the phases."""
    del spin_limit, interpret, layout
    steps, depth = check_operands(plan, w_blk, s0, xproj, bias, z, mask)
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
    inputs = jnp.concatenate([s0[None], states[:-1]], axis=0)
    s_mm = slots.inputs_to_a_buffer(inputs, steps, depth, k_pad).astype(mm_dtype)
    status = jnp.zeros((plan.grid,), jnp.int32)
    if save:
        return Saved(states[-1:], packed, s_mm, status)
    return States(states, s_mm, status)
