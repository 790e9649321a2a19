"""The persistent highway backward as one Mosaic GPU kernel: all P = T * L micro-layer
phases in reverse in one launch, a grid barrier between them; block (r, g) runs
`backward.py`'s math on its rows and units (the GEMM of the layer above's d_scaled with W^T,
the gate backward, dz, the bias gradients' column sums). Operands: wt [L * n_pad, 2 *
n_pad], g [P, b_pad, n_pad] (or [T, ...]: layer L - 1 only), packed [P, b_pad, K, n_pad], z
[L, T, b_pad, z_width] or None, mask [P, b_pad, n_pad] uint8 or None. Design: docs/design.md."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from rhhjax.kernels.layout import F32
from rhhjax.kernels.mosaic import forward as mf
from rhhjax.kernels.mosaic import gemm, keep_mask, rowgroup_layout
from rhhjax.kernels.mosaic import grid_barrier as gb
from rhhjax.kernels.mosaic import persistent_backward_operands as operands
from rhhjax.kernels.mosaic import persistent_slots as slots
from rhhjax.kernels.mosaic import phase_timeline as timeline_
from rhhjax.kernels.mosaic.backward import highway_backward_reference
from rhhjax.kernels.mosaic.persistent_backward_cell import (
    BackwardCell,
    bias_row_group,
    bias_rows,
    input_names,
    register_halves,
)
from rhhjax.kernels.mosaic.persistent_cell import (
    WARPGROUPS,
    epilogue_tile,
    producer_of,
    stage_buffers,
    staged_operands,
    staged_scratch,
    warpgroups,
)
from rhhjax.kernels.mosaic.plan import BIAS_ROWS, PersistentPlan

Array = jax.Array
# Re-exported from `persistent_backward_operands`.
backward_weights = operands.backward_weights
backward_smem_bytes, check_plan = operands.backward_smem_bytes, operands.check_plan


class Gradients(NamedTuple):
    """`persistent_backward`'s outputs: d_x [T, b_pad, 2, z_width] f32, d_mm [P * b_pad, 2 *
    n_pad], ds_carry0 [b_pad, n_pad], bias_parts [P, R, 2, group, n_pad], status [R * C]
    int32."""

    d_x: Array
    d_mm: Array
    ds_carry0: Array
    bias_parts: Array
    status: Array


class GradientsZ(NamedTuple):
    """`Gradients` with z: also dz [L, T, b_pad, z_width]."""

    d_x: Array
    d_mm: Array
    ds_carry0: Array
    bias_parts: Array
    dz: Array
    status: Array


def bias_gradient(bias_parts: Array, depth: int) -> Array:
    """bias_parts [P, R, 2, group, n_pad] -> dbias [L, 2, n_pad]."""
    phases = bias_parts.shape[0]
    parts = bias_parts.reshape(phases // depth, depth, *bias_parts.shape[1:])
    return parts.sum(axis=(0, 2, 4))


def _bias_parts_reference(plan: PersistentPlan, da: Array) -> Array:
    """da [P, b_pad, (2,) n_pad] -> the kernel's partial column sums [P, R, (2,) group,
    n_pad]."""
    group, rows = bias_row_group(plan), plan.rows_per_block
    parts = da.reshape(da.shape[0], plan.row_blocks, rows // group, group, *da.shape[2:])
    parts = parts.sum(axis=2)
    return jnp.moveaxis(parts, 2, -2) if da.ndim == 4 else parts


def persistent_backward(
    plan: PersistentPlan,
    wt: Array,
    g: Array,
    packed: Array,
    z: Array | None = None,
    mask: Array | None = None,
    bias: Array | None = None,
    s_mm: Array | None = None,
    *,
    keep: float = 1.0,
    spin_limit: int = gb.DEFAULT_SPIN_LIMIT,
    interpret: Any = None,
    layout: str = "grid",
    timeline: bool = False,
):
    """All backward phases in one Mosaic GPU launch: `GradientsZ` with z, else `Gradients`;
    with ``timeline`` (gradients, `phase_timeline.Stamps`)."""
    depth = operands.check_operands(plan, wt, g, packed, z, mask, bias, s_mm)
    check_plan(plan, z is not None, mask is not None, layout)
    rowgroup_layout.check(plan, layout, interpret)
    launch, block_index, make_barrier = rowgroup_layout.functions(layout, interpret, plan)
    phases = packed.shape[0]
    steps = phases // depth
    g_last = g.shape[0] != phases  # layer L - 1's cotangent only: zero at the other layers
    n_r, n_c = plan.row_blocks, plan.col_blocks
    mm_dtype = wt.dtype
    has_z, has_mask = z is not None, mask is not None
    names = input_names(has_z, plan.in_registers)
    optional = (("z", z), ("mask", mask), ("bias", bias), ("s_mm", s_mm))
    extra_names = [name for name, x in optional if x is not None]
    extras = [x for _, x in optional if x is not None]
    n_time = 2 * timeline

    def kernel(wt_g, g_g, packed_g, *refs, phase_bar=None, **sc):
        extra_g = dict(zip(extra_names, refs[: len(extras)], strict=True))
        outs = refs[len(extras) : len(refs) - n_time]
        r, c = block_index((n_r, n_c), ("r", "g"), phase_bar)
        clocks = timeline_.OFF
        if timeline:
            clocks = timeline_.Timeline(sc["timeline_row"], *refs[-2:], r * n_c + c, interpret)
        named = dict(z=None, mask=None, bias=None, s_mm=None) | extra_g
        named |= dict(wt=wt_g, g=g_g, packed=packed_g, d_x=outs[0], d_mm=outs[1])
        named |= dict(bias_parts=outs[3], dz=outs[4] if has_z else None)
        split = split_operands(sc, plan, interpret)
        main = BackwardCell(
            plan=plan, steps=steps, depth=depth, keep=keep, names=names, g_last=g_last,
            refs=named, sc=sc, r=r, c=c, interpret=interpret, split=split, timeline=clocks,
            producer=producer_of(sc, plan, interpret),
        )  # fmt: skip
        run = functools.partial(_phases, main, r, c, phase_bar, outs)
        if split is None and main.producer is None:
            return run()
        warpgroup = jax.lax.axis_index(WARPGROUPS)
        pl.when(warpgroup == 0)(run)
        after_go = gb.fence_proxy_async_global if interpret is None else None
        pl.when(warpgroup == 1)(lambda: main.help(after_go))

    def _phases(main, r, c, phase_bar, outs) -> None:
        """The block's phases (warpgroup 0's where the block has two), its status."""
        status_g, split = outs[-1], main.split
        barrier = make_barrier(n_r * n_c, jnp.logical_and(r == 0, c == 0), spin_limit, phase_bar)
        main.timeline.start()
        main.prologue()
        fail_at = jnp.where(barrier(jnp.int32(0)), jnp.int32(0), jnp.int32(1))

        def body(i, fail_at):
            main_runs = fail_at == 0

            @pl.when(main_runs)
            def _():
                main.timeline.stamp("barrier_passed")
                main.phase(phases - 1 - i)
                main.timeline.stamp("barrier_arrived")
                main.timeline.flush(phases - 1 - i)

            skipped = jnp.logical_and(jnp.logical_not(main_runs), i >= 1)
            if split is not None:  # every phase's half but the last's
                pl.when(skipped)(lambda: gemm.skip_split(split))
            if main.producer is not None:  # every phase's loads but the last's
                k_steps = main.k_steps
                pl.when(skipped)(lambda: gemm.skip_gemm(main.producer, gemm=i - 1, k_steps=k_steps))
            passed = jax.lax.cond(
                jnp.logical_and(main_runs, i < phases - 1),
                lambda: barrier(i + 1),
                lambda: jnp.bool_(True),
            )
            return jnp.where(passed, fail_at, i + 2)

        fail_at = jax.lax.fori_loop(0, phases, body, fail_at)
        main.finish(outs[2])
        status_g[r * n_c + c] = fail_at

    out_type = (
        *out_types(plan, steps, depth, has_z, mm_dtype),
        jax.ShapeDtypeStruct((n_r * n_c,), jnp.int32),
        *(timeline_.out_types(phases, n_r * n_c) if timeline else []),
    )
    launch_args, phase_bar = launch((n_r, n_c), ("r", "g"), interpret)
    outs = plgpu.kernel(
        kernel,
        out_type=out_type,
        scratch_types=dict(
            **scratch(plan, has_z, has_mask, mm_dtype, interpret),
            **phase_bar,
            **(timeline_.scratch() if timeline else {}),
        ),
        **launch_args,
        **warpgroups(plan.producer or plan.split_k),
        kernel_name="persistent_highway_backward",
        interpret=interpret,
    )(wt, g, packed, *extras)
    stamps = timeline_.Stamps(*outs[len(outs) - n_time :]) if timeline else None
    outs = outs[: len(outs) - n_time]
    outs = GradientsZ(*outs) if has_z else Gradients(*outs)
    return (outs, stamps) if timeline else outs


def scratch(plan: PersistentPlan, has_z: bool, has_mask: bool, mm_dtype, interpret) -> dict:
    """A backward block's shared memory and mbarriers (`BackwardCell.sc`)."""
    rows, u, n_pad = plan.rows_per_block, plan.units_per_block, plan.n_pad
    names, group = input_names(has_z, plan.in_registers), bias_row_group(plan)
    tile = functools.partial(epilogue_tile, plan, halves=register_halves(plan))
    return dict(
        epi=tile((len(names), rows, u), F32),
        carry=tile((rows, u), F32),
        **({} if plan.in_registers else {"acc": plgpu.SMEM((rows, u), F32)}),
        dsc=tile((2, rows, u), mm_dtype),
        bias_part=plgpu.SMEM((2, group, u), F32),
        bar=plgpu.Barrier(num_barriers=len(names) + has_mask + bias_rows(plan, has_z)),
        **({"bias_rows": plgpu.SMEM((BIAS_ROWS, u), F32)} if bias_rows(plan, has_z) else {}),
        **({"mask_tile": tile((rows, u), keep_mask.DTYPE)} if has_mask else {}),
        **staged_scratch(plan, u, 2 * n_pad // plan.k_chunk, mm_dtype, interpret),
        **_split_scratch(plan, u, 2 * n_pad // plan.k_chunk, mm_dtype, interpret),
    )


def out_types(plan: PersistentPlan, steps: int, depth: int, has_z: bool, mm_dtype) -> list:
    """`Gradients` (with z `GradientsZ`) but status: d_x, d_mm, ds_carry0, bias_parts(, dz)."""
    phases, b_pad, n_pad = steps * depth, plan.b_pad, plan.n_pad
    return [
        jax.ShapeDtypeStruct((steps, b_pad, 2, plan.z_width), F32),
        jax.ShapeDtypeStruct((phases * b_pad, 2 * n_pad), mm_dtype),
        jax.ShapeDtypeStruct((b_pad, n_pad), F32),
        jax.ShapeDtypeStruct((phases, plan.row_blocks, 2, bias_row_group(plan), n_pad), F32),
        *[jax.ShapeDtypeStruct((depth, steps, b_pad, plan.z_width), F32)] * has_z,
    ]


def _split_scratch(plan: PersistentPlan, u: int, k_steps: int, mm_dtype, interpret) -> dict:
    """``plan.split_k``'s scratch: the lead's stages, the helper's, `gemm.split_scratch`."""
    if not plan.split_k:
        return {}
    lead, rest = gemm.SplitK.halves(k_steps)
    split = {f"split_{name}": t for name, t in gemm.split_scratch(plan.rows_per_block, u).items()}
    helper = stage_buffers(plan, u, rest, mm_dtype, interpret, "split_stage_")
    return stage_buffers(plan, u, lead, mm_dtype, interpret) | helper | split


def split_operands(sc: dict, plan: PersistentPlan, interpret) -> gemm.SplitK | None:
    """`_split_scratch`'s buffers as a `gemm.SplitK`, or None."""
    if "split_go" not in sc:
        return None
    helper = staged_operands(sc, plan, interpret, "split_stage_")
    return gemm.SplitK(helper, sc["split_partial"], sc["split_go"], sc["split_done"])


def persistent_backward_reference(
    plan: PersistentPlan,
    wt: Array,
    g: Array,
    packed: Array,
    z: Array | None = None,
    mask: Array | None = None,
    bias: Array | None = None,
    s_mm: Array | None = None,
    *,
    keep: float = 1.0,
    spin_limit: int = gb.DEFAULT_SPIN_LIMIT,
    interpret: Any = None,
    layout: str = "grid",
):
    """Pure-JAX `persistent_backward` (status all zeros): a reverse scan of
    `highway_backward_reference` over the phases."""
    del spin_limit, interpret, layout
    depth = operands.check_operands(plan, wt, g, packed, z, mask, bias, s_mm)
    phases, b_pad, n_pad = packed.shape[0], g.shape[1], g.shape[2]
    if g.shape[0] != phases:
        g = jnp.zeros((phases, b_pad, n_pad), g.dtype).at[depth - 1 :: depth].set(g)
    w_layers = wt.reshape(depth, n_pad, 2 * n_pad)
    if s_mm is not None:  # f32: each phase's input state from the A buffer, as packed row 0
        inputs = slots.a_buffer_to_inputs(s_mm, phases // depth, depth, n_pad)
        packed = jnp.concatenate([inputs[:, :, None], packed], axis=2)

    def body(carry, xs):
        d_above, ds_carry = carry
        p, g_p, packed_p, z_p, mask_p = xs
        w_above = w_layers[jax.lax.rem(p + 1, depth)]
        s_prev, h, t = packed_p[:, 0], packed_p[:, 1], packed_p[:, 2]
        if z is not None:  # rows 1-2 are full's halves: the gates as the forward made them
            b = bias[jax.lax.rem(p, depth)]
            h, t = mf.gates(h, t, dict(z=z_p, b_h=b[:, 0], b_t=b[:, 1]))
        d_scaled, ds_carry, da = highway_backward_reference(
            d_above, w_above, ds_carry, g_p, s_prev, h, t, z_p, mask_p
        )
        d_scaled = d_scaled.reshape(b_pad, 2 * n_pad)
        return (d_scaled, ds_carry), (da, d_scaled)

    init = (jnp.zeros((b_pad, 2 * n_pad), wt.dtype), jnp.zeros((b_pad, n_pad), F32))
    z_pm = None if z is None else slots.scales_to_phase_major(z, n_pad)
    xs = (jnp.arange(phases), g, packed, z_pm, keep_mask.mask_values(mask, keep))
    (_, ds_carry0), (da, d_scaled) = jax.lax.scan(body, init, xs, reverse=True)
    d_x = da[::depth]  # layer 0: d_scaled in f32, da * z as the kernel's epilogue computes it
    if z is not None:
        d_x = d_x * z_pm[::depth][:, :, None]
    d_x = d_x[..., : plan.z_width]
    bias_parts = _bias_parts_reference(plan, da)
    d_mm = slots.to_slots(d_scaled, phases // depth, depth).reshape(-1, 2 * n_pad)
    status = jnp.zeros((plan.grid,), jnp.int32)
    if z is None:
        return Gradients(d_x, d_mm, ds_carry0, bias_parts, status)
    dz_pm = jnp.sum(da * packed[:, :, 1:3], axis=2)  # [P, b_pad, n_pad]
    dz = dz_pm.reshape(phases // depth, depth, b_pad, n_pad)
    dz = jnp.swapaxes(dz, 0, 1)[..., : plan.z_width]
    return GradientsZ(d_x, d_mm, ds_carry0, bias_parts, dz, status)
