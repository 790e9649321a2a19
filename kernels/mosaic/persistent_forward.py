"""The persistent whole-sequence highway forward as ONE Mosaic GPU kernel.

Every micro-layer phase ``p = t * L + l`` of a sequence (``T * L`` phases) runs inside one
launch of a ``row_blocks x col_blocks`` grid (`kernels/mosaic/plan.py`), with a grid
barrier (`kernels/mosaic/grid_barrier.py`) between phases. Block ``(r, g)`` owns rows
``r * rows ..`` and units ``g * u ..`` (the h- AND the t-columns of its units) and keeps
its f32 state slice ``[rows, u]`` in shared memory across phases. Per phase, exactly
`kernels/mosaic/forward.py`'s micro-layer (its `_epilogue` is the shared math)::

    acc  = s_mm[p][rows, :k_pad] @ w_blk[l, g]^T     [rows, 2u]  (K in k_chunk tiles through
           a stages-deep TMA pipeline, chunk 0 first, wgmma, f32 accumulation)
    full = acc (+ xproj[t] at l == 0);  a = full (* z[p]) + bias[l]
    h, tg = tanh(a_h), sigmoid(a_t);  s_new = h * tg (* mask[p] / keep) + s * (1 - tg)

then the block writes s_new (f32) to ``states[p]`` (with ``save`` at the last phase only:
the others are the next phase's input state, in ``packed`` or ``s_mm``) and its matmul-dtype
cast to row block
``slot(p + 1)`` (`persistent_slots`: layer-major) of the A buffer ``s_mm`` (the next
phase's matmul input, read by every block),
with ``save`` its saved rows, waits for its stores and meets the others at barrier
``p + 1``. A prologue copies each block's slice of s0 into its state and into ``s_mm``
row block 0, then barrier 0.

Operands (padded; matmul dtype = ``w_blk.dtype``, bf16 or f32; T steps, L layers,
P = T * L, C = col_blocks, R = row_blocks, u = units_per_block):

    w_blk  [L * 2 * n_pad, k_pad]  matmul dtype  rows (l * C + g) * 2u ..: the h- then the
                                   t-columns of W_l for units g * u .. (`forward_weights`)
    s0     [b_pad, n_pad]      f32
    xproj  [T, b_pad, 2, plan.z_width] f32  x U (no bias, unscaled), added at layer 0 only;
                               unpadded like z (units past z_width read as zero by TMA),
                               so the model's projection reaches the kernel with no copy
    bias   [L, b_pad, 2, n_pad] f32  b broadcast over rows (b_U already in layer 0)
    z      [L, T, b_pad, plan.z_width] f32  hyper scales, LAYER-major (`persistent_slots`),
                               units past z_width read as zero (TMA) | None
    mask   [P, b_pad, n_pad]   uint8 gate-dropout keep decisions (1 keep, 0 drop) | None;
                               the value is decision / ``keep`` (`kernels/mosaic/keep_mask.py`)

Outputs, in this order: ``states [P, b_pad, n_pad] f32`` (the state after every phase),
with ``save`` ``[1, b_pad, n_pad]``, the state after the last phase only (the state after
phase p < P - 1 is phase p + 1's input state: not written twice); with ``save`` ``packed
[P, b_pad, plan.packed_rows, n_pad] f32`` (the input state, except in f32, where ``s_mm``
holds it exactly (`plan.state_in_packed`); then h and tg, or with z the h and t halves of
``full``, the unscaled pre-activation, from which the backward recomputes the gates
(`plan.forward_saved_rows`)); ``s_mm [P * b_pad, k_pad]`` matmul dtype (the A
buffer: the input state of phase p at row block ``persistent_slots.slot(p)``, layer-major,
slot 0 s0; the state after the last phase is not in it; the K columns only: TMA
needs the array's minor extent a multiple of its swizzle tile, which ``k_pad`` is and
``n_pad`` need not be; blocks whose units lie past ``k_pad`` skip it); ``status [R * C]
int32`` (0 = fine, else the 1-based barrier index at which the block's grid barrier timed
out; `grid_barrier.check_status`).

Deviations from the micro-layer kernel, all exact: x U is loaded at layer 0 only and kept in
shared memory for the step's layers; every layer adds it times 1 (layer 0) or 0 (the
reference does the same); the mask is read as uint8 decisions into the buffer of the state's
cast (a RefUnion: the tile is read in the epilogue, before the cast is written, and the
cast's store has completed before the next phase loads the next tile). A warpgroup barrier
separates the epilogue's loads from the stores that overwrite the same shared memory (the
state, the reused input slots, the mask tile).

`persistent_forward_reference` computes the same outputs in pure JAX (a `lax.scan` over
phases of `mosaic_forward.highway_forward_reference`). The kernel runs on a Hopper GPU
only; it lowers and compiles for an H100 on a CPU host with the CUDA plugin
(tests/test_kernels_mosaic_persistent_forward.py).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from rhhjax.kernels.layout import F32
from rhhjax.kernels.mosaic import forward as mf
from rhhjax.kernels.mosaic import grid_barrier, keep_mask, rowgroup_layout
from rhhjax.kernels.mosaic import persistent_slots as slots
from rhhjax.kernels.mosaic.gemm import gemm_nt_to_smem
from rhhjax.kernels.mosaic.plan import (
    PersistentPlan,
    PlanError,
    forward_inputs,
    forward_saved_rows,
    forward_staging_slots,
)

Array = jax.Array


# ----------------------------------------------------------------------------- layout


def forward_weights(plan: PersistentPlan, kernel_s: Array, dtype) -> Array:
    """W [L, n, 2n] (n = plan.width) -> w_blk [L * 2 * n_pad, k_pad] in ``dtype``: layer l's
    `mosaic_forward.block_weight` of W_l zero-padded to [k_pad, 2 * n_pad], stacked on rows
    (rows ``(l * C + g) * 2u ..``: the h- then the t-columns of units ``g * u ..``)."""
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


# ----------------------------------------------------------------------------- kernel


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
):
    """All T * L forward phases in one Mosaic GPU launch; shapes in the module docstring
    (``keep``: the keep probability that scales the mask's decisions).

    Returns (states, s_mm, status) or, with ``save``, (s_last [1, b_pad, n_pad], packed, s_mm,
    status). Compiled, it runs on a Hopper GPU only; with ``interpret``
    (`gpu_interpret.params()`, jax >= 0.11.2) it runs in GPU interpret mode as one cluster with
    a cluster barrier (`grid_barrier.launch`; ``plan.check_interpretable``). ``layout``
    "rowgroup": one cluster per row group, a cluster barrier (`rowgroup_layout`).
    """
    steps, depth = check_operands(plan, w_blk, s0, xproj, bias, z, mask)
    rowgroup_layout.check(plan, layout, interpret)
    launch, block_index, make_barrier = rowgroup_layout.functions(layout, interpret)
    phases = steps * depth
    n_r, n_c = plan.row_blocks, plan.col_blocks
    rows, u, tk = plan.rows_per_block, plan.units_per_block, plan.k_chunk
    b_pad, n_pad, k_pad = plan.b_pad, plan.n_pad, plan.k_pad
    mm_dtype = w_blk.dtype
    has_z, has_mask = z is not None, mask is not None
    ins, outs = forward_inputs(has_z), forward_saved_rows(save, has_z)
    n_slots, out_slot = forward_staging_slots(has_z, save)
    optional = [a for a in (z, mask) if a is not None]
    mask_bar = len(ins)  # the mask tile's mbarrier, after the staged inputs'
    save_state = save and plan.state_in_packed  # f32: s_mm holds the input states exactly

    def kernel(*refs, state, pre, epi, cast_or_mask, bar, phase_bar=None):
        # The state's cast and the mask tile share one buffer (disjoint lifetimes).
        (cast,), (mask_tile,) = cast_or_mask
        w_g, s0_g, x_g, bias_g = refs[:4]
        z_g = refs[4] if has_z else None
        mask_g = refs[4 + has_z] if has_mask else None
        out_refs = refs[4 + len(optional) :]
        states_g, s_mm_g, status_g = out_refs[0], out_refs[-2], out_refs[-1]
        packed_g = out_refs[1] if save else None
        r, g = block_index((n_r, n_c), ("r", "g"), phase_bar)
        block = r * n_c + g
        row_sl, unit_sl = pl.ds(r * rows, rows), pl.ds(g * u, u)
        barrier = make_barrier(n_r * n_c, block == 0, spin_limit, phase_bar)

        # Prologue: the block's slice of s0 into its state and into s_mm row block 0.
        plgpu.copy_gmem_to_smem(s0_g.at[row_sl, unit_sl], state, bar.at[0])
        plgpu.barrier_wait(bar.at[0])
        in_a = g * u < k_pad  # the A buffer holds the K columns only

        cast[...] = state[...].astype(mm_dtype)
        plgpu.commit_smem()

        @pl.when(in_a)
        def _():
            plgpu.copy_smem_to_gmem(cast, s_mm_g.at[row_sl, unit_sl])

        plgpu.wait_smem_to_gmem(0)
        passed = barrier(jnp.int32(0))
        code0 = jnp.where(passed, jnp.int32(0), jnp.int32(1))

        def sources(p, t, layer):
            """Each staged input's global tile for phase p."""
            src = {
                "b_h": bias_g.at[layer, row_sl, 0, unit_sl],
                "b_t": bias_g.at[layer, row_sl, 1, unit_sl],
                "x_h": x_g.at[t, row_sl, 0, unit_sl],
                "x_t": x_g.at[t, row_sl, 1, unit_sl],
            }
            if has_z:
                src["z"] = z_g.at[layer, t, row_sl, unit_sl]  # units past z_width: 0
            return src

        def run_phase(p):
            t, layer = jax.lax.div(p, depth), jax.lax.rem(p, depth)
            first = layer == 0
            src = sources(p, t, layer)
            for slot, name in enumerate(ins):
                if name in ("x_h", "x_t"):

                    @pl.when(first)
                    def _(slot=slot, name=name):
                        plgpu.copy_gmem_to_smem(src[name], epi.at[slot], bar.at[slot])

                else:
                    plgpu.copy_gmem_to_smem(src[name], epi.at[slot], bar.at[slot])
            if has_mask:  # the cast's last store has completed (waited at the phase's end)
                mask_src = mask_g.at[p, row_sl, unit_sl]
                plgpu.copy_gmem_to_smem(mask_src, mask_tile, bar.at[mask_bar])
            if save_state:  # packed row 0: the phase's input state, before it is overwritten
                plgpu.copy_smem_to_gmem(state, packed_g.at[p, row_sl, 0, unit_sl])

            a_row, w_row = slots.slot(p, steps, depth) * n_r + r, layer * n_c + g
            k_steps = k_pad // tk
            gemm_nt_to_smem(
                pre, s_mm_g, w_g, a_row, w_row, tile_k=tk, k_steps=k_steps, stages=plan.stages
            )
            for slot, name in enumerate(ins):
                if name in ("x_h", "x_t"):

                    @pl.when(first)
                    def _(slot=slot):
                        plgpu.barrier_wait(bar.at[slot])

                else:
                    plgpu.barrier_wait(bar.at[slot])
            if has_mask:
                plgpu.barrier_wait(bar.at[mask_bar])
            x_scale = jnp.where(first, jnp.float32(1.0), jnp.float32(0.0))
            tiles_in = {name: keep_mask.load_strided(epi.at[slot]) for slot, name in enumerate(ins)}
            tiles_in["x_h"] = tiles_in["x_h"] * x_scale
            tiles_in["x_t"] = tiles_in["x_t"] * x_scale
            tiles_in["s"] = state[...]
            if has_mask:
                tiles_in["mask"] = keep_mask.load_values(mask_tile, keep)
            tiles = mf._epilogue(pre[:, pl.ds(0, u)], pre[:, pl.ds(u, u)], tiles_in)
            if save_state:  # the state's store to packed row 0 has read it
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)
            # Every thread has read the tiles that the stores below overwrite (the state,
            # the inputs whose slots the saved rows reuse, the mask tile under the cast).
            plgpu.commit_smem()
            state[...] = tiles["s_new"]
            cast[...] = tiles["s_new"].astype(mm_dtype)
            for name, slot in zip(outs, out_slot, strict=True):
                epi[slot] = tiles[name]
            plgpu.commit_smem()
            if save:  # the states are packed row 0 of the next phase: only the last one

                @pl.when(p == phases - 1)
                def _():
                    plgpu.copy_smem_to_gmem(state, states_g.at[0, row_sl, unit_sl])

            else:
                plgpu.copy_smem_to_gmem(state, states_g.at[p, row_sl, unit_sl])

            @pl.when(jnp.logical_and(in_a, p < phases - 1))  # no phase reads the last state
            def _():
                a_rows = pl.ds(slots.slot(p + 1, steps, depth) * b_pad + r * rows, rows)
                plgpu.copy_smem_to_gmem(cast, s_mm_g.at[a_rows, unit_sl])

            for i, slot in enumerate(out_slot):
                dst = packed_g.at[p, row_sl, save_state + i, unit_sl]
                plgpu.copy_smem_to_gmem(epi.at[slot], dst)
            plgpu.wait_smem_to_gmem(0)

        def phase(p, code):
            def work(code):
                run_phase(p)
                ok = barrier(p + 1)
                return jnp.where(ok, code, p + 2)

            return jax.lax.cond(code == 0, work, lambda c: c, code)

        code = jax.lax.fori_loop(0, phases, phase, code0)
        status_g[block] = code

    out_type = [jax.ShapeDtypeStruct((1 if save else phases, b_pad, n_pad), F32)]
    if save:
        out_type.append(jax.ShapeDtypeStruct((phases, b_pad, plan.packed_rows, n_pad), F32))
    out_type += [
        jax.ShapeDtypeStruct((phases * b_pad, k_pad), mm_dtype),
        jax.ShapeDtypeStruct((n_r * n_c,), jnp.int32),
    ]
    launch_args, phase_bar = launch((n_r, n_c), ("r", "g"), interpret)
    return plgpu.kernel(
        kernel,
        out_type=tuple(out_type),
        scratch_types=dict(
            state=plgpu.SMEM((rows, u), F32),
            pre=plgpu.SMEM((rows, 2 * u), F32),
            epi=plgpu.SMEM((n_slots, rows, u), F32),
            cast_or_mask=plgpu.RefUnion(
                (plgpu.SMEM((rows, u), mm_dtype),), (plgpu.SMEM((rows, u), keep_mask.DTYPE),)
            ),
            bar=plgpu.Barrier(num_barriers=len(ins) + has_mask),
            **phase_bar,
        ),
        **launch_args,
        kernel_name="persistent_highway_forward",
        interpret=interpret,
    )(w_blk, s0, xproj, bias, *optional)


# ----------------------------------------------------------------------------- reference


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
    """Pure-JAX `persistent_forward` (same operands and outputs; status all zeros): a
    `lax.scan` over the phases of `mosaic_forward.highway_forward_reference` (units u),
    the state's matmul-dtype cast as the A operand, xproj scaled by 1 at layer 0 and by 0
    elsewhere as the kernel does. ``spin_limit`` and ``interpret`` are unused."""
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
    inputs = jnp.concatenate([s0[None], states[:-1]], axis=0)  # every phase's input state
    s_mm = slots.inputs_to_a_buffer(inputs, steps, depth, k_pad).astype(mm_dtype)
    status = jnp.zeros((plan.grid,), jnp.int32)
    if save:
        return states[-1:], packed, s_mm, status
    return states, s_mm, status
