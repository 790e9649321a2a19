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

With `HyperInside` the HyperRHN's hyper cell runs in the same launch, one phase ahead of
the main cell on blocks of its own plan, and z comes from the kernel's own GEMM
(`persistent_forward`'s docstring; docs/persistent_design.md section 3).

`persistent_forward_reference` computes the same outputs in pure JAX (a `lax.scan` over
phases of `mosaic_forward.highway_forward_reference`). The kernel runs on a Hopper GPU
only; it lowers and compiles for an H100 on a CPU host with the CUDA plugin
(tests/test_kernels_mosaic_persistent_forward.py).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

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


class HyperInside(NamedTuple):
    """The hyper cell's operands for `persistent_forward` with the hyper cell INSIDE the
    kernel's phases (``hyper_input="x"``: it reads x, not the main state). Its blocks are
    the main grid's blocks ``(r, g < plan.col_blocks)``: the same rows, ``plan`` its own
    units (a multiple of 16: uint8 mask rows). Operands as the main cell's, for ``plan``:

        w_blk  [L * 2 * h_pad, kh_pad]  matmul dtype (`forward_weights(plan, ...)`)
        s0     [b_pad, h_pad] f32;  xproj [T, b_pad, 2, plan.z_width] f32 (x U_hyper)
        bias   [L, b_pad, 2, h_pad] f32;  mask [P, b_pad, h_pad] uint8 | None
        proj   [L * n_pad, kh_pad] matmul dtype: P_l^T, rows l * n_pad + j (`projection_weights`)
        proj_bias [L, b_pad, n_pad] f32: p_l broadcast over rows

    and z_p = s_hyper[p] P_l + p_l (s_hyper[p] the hyper state after phase p, cast to the
    matmul dtype, f32 accumulation, then p_l added: `ops.cells.hyper_scales`)."""

    plan: PersistentPlan
    w_blk: Array
    s0: Array
    xproj: Array
    bias: Array
    mask: Array | None
    proj: Array
    proj_bias: Array


def projection_weights(plan: PersistentPlan, hyper_plan: PersistentPlan, kernel, dtype) -> Array:
    """The hyper projection P [L, h, n] -> [L * n_pad, kh_pad] in ``dtype``: P_l^T zero-padded
    (rows l * n_pad + j hold unit j's column of P_l), the B operand of the kernel's z GEMM."""
    depth, h, n = kernel.shape
    if (h, n) != (hyper_plan.width, plan.width):
        raise PlanError(
            f"projection kernel has shape {kernel.shape}, expected [L, {hyper_plan.width}, "
            f"{plan.width}]."
        )
    pt = jnp.swapaxes(kernel, 1, 2)  # [L, n, h]
    pt = jnp.pad(pt, [(0, 0), (0, plan.n_pad - n), (0, hyper_plan.k_pad - h)])
    return pt.reshape(depth * plan.n_pad, hyper_plan.k_pad).astype(dtype)


def check_hyper(plan: PersistentPlan, hyper: HyperInside, steps: int, depth: int) -> None:
    """One-line PlanError unless the hyper cell's plan and operands suit the main plan: the
    same rows and dtype, at most the main cell's column blocks, its own operands' shapes."""
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
    for name, (array, shape, dtype) in expected.items():
        if tuple(array.shape) != shape or jnp.dtype(array.dtype).name != dtype:
            raise PlanError(
                f"persistent forward: hyper {name} is {jnp.dtype(array.dtype).name}"
                f"{list(array.shape)}, expected {dtype}{list(shape)}."
            )


@dataclasses.dataclass
class _Cell:
    """One cell inside the kernel: its plan, global refs, shared memory and the block's
    slices; `phase` is one micro-layer phase of it (the module docstring's). The main cell
    with the hyper cell inside has ``fill_z`` (z's slot from the kernel's own GEMM); the
    hyper cell has ``tail`` (the cast of its state after the last phase, which the A buffer
    does not hold and the main cell's last z reads)."""

    plan: PersistentPlan
    steps: int
    depth: int
    keep: float
    save: bool
    has_z: bool
    z_inside: bool
    refs: dict
    state: Any
    pre: Any
    epi: Any
    cast: Any
    mask_tile: Any
    bar: Any
    r: Any
    g: Any
    fill_z: Callable | None = None

    @property
    def phases(self) -> int:
        return self.steps * self.depth

    @property
    def ins(self) -> tuple[str, ...]:
        return forward_inputs(self.has_z, self.z_inside)

    def slices(self):
        rows, u = self.plan.rows_per_block, self.plan.units_per_block
        return pl.ds(self.r * rows, rows), pl.ds(self.g * u, u)

    def in_a(self):
        """Whether the block's units are among the A buffer's K columns."""
        return self.g * self.plan.units_per_block < self.plan.k_pad

    def prologue(self) -> None:
        """The block's slice of s0 into its state and into the A buffer's row block 0."""
        row_sl, unit_sl = self.slices()
        plgpu.copy_gmem_to_smem(self.refs["s0"].at[row_sl, unit_sl], self.state, self.bar.at[0])
        plgpu.barrier_wait(self.bar.at[0])
        self.cast[...] = self.state[...].astype(jnp.dtype(self.plan.dtype))
        plgpu.commit_smem()

        @pl.when(self.in_a())
        def _():
            plgpu.copy_smem_to_gmem(self.cast, self.refs["s_mm"].at[row_sl, unit_sl])

        plgpu.wait_smem_to_gmem(0)

    def _sources(self, t, layer) -> dict:
        """Each TMA-loaded staged input's global tile for phase (t, layer)."""
        row_sl, unit_sl = self.slices()
        bias_g, x_g = self.refs["bias"], self.refs["x"]
        src = {
            "b_h": bias_g.at[layer, row_sl, 0, unit_sl],
            "b_t": bias_g.at[layer, row_sl, 1, unit_sl],
            "x_h": x_g.at[t, row_sl, 0, unit_sl],
            "x_t": x_g.at[t, row_sl, 1, unit_sl],
        }
        if self.z_inside:
            src["pz"] = self.refs["proj_bias"].at[layer, row_sl, unit_sl]
        elif self.has_z:
            src["z"] = self.refs["z"].at[layer, t, row_sl, unit_sl]  # units past z_width: 0
        return src

    def phase(self, p) -> None:
        """Phase ``p`` (traced int32): loads, GEMM, epilogue, stores; waits for its stores."""
        plan, refs, epi, bar = self.plan, self.refs, self.epi, self.bar
        steps, depth, phases = self.steps, self.depth, self.phases
        row_sl, unit_sl = self.slices()
        u, n_r = plan.units_per_block, plan.row_blocks
        has_mask = refs["mask"] is not None
        ins = self.ins
        loaded = [
            (slot, name) for slot, name in enumerate(ins) if not (name == "z" and self.z_inside)
        ]
        outs = forward_saved_rows(self.save, self.has_z)
        _, out_slot = forward_staging_slots(self.has_z, self.save, self.z_inside)
        save_state = self.save and plan.state_in_packed  # f32: s_mm holds the input states
        mask_bar = len(ins)  # the mask tile's mbarrier, after the staged inputs'
        t, layer = jax.lax.div(p, depth), jax.lax.rem(p, depth)
        first = layer == 0
        src = self._sources(t, layer)

        def each_input(action):
            for slot, name in loaded:
                if name in ("x_h", "x_t"):  # loaded at layer 0, kept for the step's layers
                    pl.when(first)(functools.partial(action, slot, name))
                else:
                    action(slot, name)

        each_input(
            lambda slot, name: plgpu.copy_gmem_to_smem(src[name], epi.at[slot], bar.at[slot])
        )
        if has_mask:  # the cast's last store has completed (waited at the phase's end)
            mask_src = refs["mask"].at[p, row_sl, unit_sl]
            plgpu.copy_gmem_to_smem(mask_src, self.mask_tile, bar.at[mask_bar])
        if save_state:  # packed row 0: the phase's input state, before it is overwritten
            plgpu.copy_smem_to_gmem(self.state, refs["packed"].at[p, row_sl, 0, unit_sl])
        if self.fill_z is not None:
            self.fill_z(p, layer, epi.at[ins.index("z")])

        a_row, w_row = slots.slot(p, steps, depth) * n_r + self.r, layer * plan.col_blocks + self.g
        gemm_nt_to_smem(
            self.pre, refs["s_mm"], refs["w"], a_row, w_row,
            tile_k=plan.k_chunk, k_steps=plan.k_pad // plan.k_chunk, stages=plan.stages,
        )  # fmt: skip
        each_input(lambda slot, name: plgpu.barrier_wait(bar.at[slot]))
        if has_mask:
            plgpu.barrier_wait(bar.at[mask_bar])
        if self.z_inside:  # z = s_hyper P_l (the GEMM's) + p_l, as `cells.hyper_scales` adds;
            # in place before the epilogue, whose live tiles would otherwise spill registers
            z_slot, p_slot = ins.index("z"), ins.index("pz")
            z_tile = keep_mask.load_strided(epi.at[z_slot])
            epi[z_slot] = z_tile + keep_mask.load_strided(epi.at[p_slot])
            plgpu.commit_smem()
        x_scale = jnp.where(first, jnp.float32(1.0), jnp.float32(0.0))
        tiles_in = {
            name: keep_mask.load_strided(epi.at[slot])
            for slot, name in enumerate(ins)
            if name != "pz"
        }
        tiles_in["x_h"] = tiles_in["x_h"] * x_scale
        tiles_in["x_t"] = tiles_in["x_t"] * x_scale
        tiles_in["s"] = self.state[...]
        if has_mask:
            tiles_in["mask"] = keep_mask.load_values(self.mask_tile, self.keep)
        tiles = mf._epilogue(self.pre[:, pl.ds(0, u)], self.pre[:, pl.ds(u, u)], tiles_in)
        if save_state:  # the state's store to packed row 0 has read it
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        # Every thread has read the tiles that the stores below overwrite (the state, the
        # inputs whose slots the saved rows reuse, the mask tile under the cast).
        plgpu.commit_smem()
        self.state[...] = tiles["s_new"]
        self.cast[...] = tiles["s_new"].astype(jnp.dtype(self.plan.dtype))
        for name, slot in zip(outs, out_slot, strict=True):
            epi[slot] = tiles[name]
        store_z = self.z_inside and self.save  # the backward reads z (its slot holds it)
        plgpu.commit_smem()
        if self.save:  # the states are packed row 0 of the next phase: only the last one

            @pl.when(p == phases - 1)
            def _():
                plgpu.copy_smem_to_gmem(self.state, refs["states"].at[0, row_sl, unit_sl])

        else:
            plgpu.copy_smem_to_gmem(self.state, refs["states"].at[p, row_sl, unit_sl])

        @pl.when(jnp.logical_and(self.in_a(), p < phases - 1))  # the next phase's A rows
        def _():
            rows = plan.rows_per_block
            a_rows = pl.ds(slots.slot(p + 1, steps, depth) * plan.b_pad + self.r * rows, rows)
            plgpu.copy_smem_to_gmem(self.cast, refs["s_mm"].at[a_rows, unit_sl])

        if refs.get("tail") is not None:  # the last state's cast: the last z reads it

            @pl.when(jnp.logical_and(self.in_a(), p == phases - 1))
            def _():
                plgpu.copy_smem_to_gmem(self.cast, refs["tail"].at[row_sl, unit_sl])

        for i, slot in enumerate(out_slot):
            dst = refs["packed"].at[p, row_sl, save_state + i, unit_sl]
            plgpu.copy_smem_to_gmem(epi.at[slot], dst)
        if store_z:
            dst = refs["z"].at[layer, t, row_sl, unit_sl]  # TMA drops the units past z_width
            plgpu.copy_smem_to_gmem(epi.at[ins.index("z")], dst)
        plgpu.wait_smem_to_gmem(0)


def _scratch(
    plan: PersistentPlan, mm_dtype, has_z: bool, has_mask: bool, save: bool, z_inside: bool
) -> dict:
    """One cell's shared memory, but for its GEMM tile ``pre`` (the kernel allocates it: the
    two cells share one)."""
    rows, u = plan.rows_per_block, plan.units_per_block
    n_slots, _ = forward_staging_slots(has_z, save, z_inside)
    scratch = dict(
        state=plgpu.SMEM((rows, u), F32),
        epi=plgpu.SMEM((n_slots, rows, u), F32),
        cast_or_mask=plgpu.RefUnion(
            (plgpu.SMEM((rows, u), mm_dtype),), (plgpu.SMEM((rows, u), keep_mask.DTYPE),)
        ),
        bar=plgpu.Barrier(num_barriers=len(forward_inputs(has_z, z_inside)) + has_mask),
    )
    return scratch


def _out_types(plan: PersistentPlan, phases: int, save: bool, mm_dtype) -> list:
    """One cell's outputs: states (or with ``save`` the last and packed), s_mm."""
    b_pad, n_pad = plan.b_pad, plan.n_pad
    out = [jax.ShapeDtypeStruct((1 if save else phases, b_pad, n_pad), F32)]
    if save:
        out.append(jax.ShapeDtypeStruct((phases, b_pad, plan.packed_rows, n_pad), F32))
    out.append(jax.ShapeDtypeStruct((phases * b_pad, plan.k_pad), mm_dtype))
    return out


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
):
    """All T * L forward phases in one Mosaic GPU launch; shapes in the module docstring
    (``keep``: the keep probability that scales the masks' decisions).

    Returns (states, s_mm, status) or, with ``save``, (s_last [1, b_pad, n_pad], packed, s_mm,
    status). Compiled, it runs on a Hopper GPU only; with ``interpret``
    (`gpu_interpret.params()`, jax >= 0.11.2) it runs in GPU interpret mode as one cluster with
    a cluster barrier (`grid_barrier.launch`; ``plan.check_interpretable``). ``layout``
    "rowgroup": one cluster per row group, a cluster barrier (`rowgroup_layout`).

    ``hyper`` (`HyperInside`; then ``z`` is None): the hyper cell runs inside the same
    phases, one phase AHEAD: iteration p runs the z GEMM of main phase p (from the hyper
    state after hyper phase p, written before the last barrier), main phase p and hyper phase
    p + 1 (blocks g < hyper col_blocks), then ONE barrier; a prologue runs hyper phase 0. P + 2
    barriers in all, not 2 P + 2 in two launches. Returns the main cell's outputs, then the
    hyper cell's (the same, for its plan), then with ``save`` z [L, T, b_pad, z_width] f32
    (the backward's operand), then ``tail`` [b_pad, kh_pad] (the hyper state after the last
    phase in the matmul dtype), then status.
    """
    steps, depth = check_operands(plan, w_blk, s0, xproj, bias, z, mask)
    if hyper is not None:
        if z is not None:
            raise PlanError("persistent forward: pass z or the hyper cell, not both.")
        check_hyper(plan, hyper, steps, depth)
    rowgroup_layout.check(plan, layout, interpret)
    launch, block_index, make_barrier = rowgroup_layout.functions(layout, interpret)
    phases = steps * depth
    n_r, n_c = plan.row_blocks, plan.col_blocks
    mm_dtype = w_blk.dtype
    z_inside = hyper is not None
    has_z = z is not None or z_inside
    operands = [w_blk, s0, xproj, bias, *(a for a in (z, mask) if a is not None)]
    if z_inside:
        operands += [hyper.w_blk, hyper.s0, hyper.xproj, hyper.bias, hyper.proj, hyper.proj_bias]
        operands += [hyper.mask] if hyper.mask is not None else []
    out_type = _out_types(plan, phases, save, mm_dtype)
    if z_inside:
        hp = hyper.plan
        out_type += _out_types(hp, phases, save, mm_dtype)
        if save:
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

        def make_cell(cell_plan, named, sc, pre, cell_has_z, cell_z_inside, fill_z=None):
            (cast,), (mask_tile,) = sc["cast_or_mask"]
            return _Cell(
                cell_plan, steps, depth, keep, save, cell_has_z, cell_z_inside, named,
                sc["state"], pre, sc["epi"], cast, mask_tile, sc["bar"], r, g, fill_z,
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
            if save:
                main_refs["z"] = outs_g[-3]
            hyper_sc = {k[2:]: v for k, v in scratch.items() if k.startswith("h_")}
            hyper_cell = make_cell(hp, hyper_refs, hyper_sc, hyper_pre, False, False)
            k_steps = hp.k_pad // hp.k_chunk

            def fill_z(p, layer, z_slot):
                """z_slot [rows, u] = s_hyper[p] @ P_l[:, units] (the hyper state after hyper
                phase p: the A buffer's input of phase p + 1, or the tail after the last)."""
                b_block = layer * n_c + g
                gemm = functools.partial(
                    gemm_nt_to_smem, z_slot, tile_k=hp.k_chunk, k_steps=k_steps, stages=hp.stages
                )
                last = p == phases - 1

                @pl.when(jnp.logical_not(last))
                def _():
                    a_block = slots.slot(p + 1, steps, depth) * n_r + r
                    gemm(hyper_refs["s_mm"], proj_g, a_block, b_block)

                @pl.when(last)
                def _():
                    gemm(tail_g, proj_g, r, b_block)

            main = make_cell(plan, main_refs, main_sc, main_pre, True, True, fill_z)
        else:
            main = make_cell(plan, main_refs, main_sc, scratch["pre"], z is not None, False)
        is_hyper_block = g < (hyper.plan.col_blocks if z_inside else 0)

        main.prologue()
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
                main.phase(p)
                if z_inside:
                    ahead = jnp.logical_and(is_hyper_block, p + 1 < phases)
                    pl.when(ahead)(lambda: hyper_cell.phase(p + 1))
                ok = barrier(p + first_barrier)
                return jnp.where(ok, code, p + first_barrier + 1)

            return jax.lax.cond(code == 0, work, lambda c: c, code)

        code = jax.lax.fori_loop(0, phases, phase, code)
        status_g[block] = code

    main_scratch = _scratch(plan, mm_dtype, has_z, mask is not None, save, z_inside)
    scratch_types = {f"m_{k}": v for k, v in main_scratch.items()}
    if z_inside:
        rows = plan.rows_per_block
        hyper_scratch = _scratch(hp, mm_dtype, False, hyper.mask is not None, save, False)
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
    hyper: HyperInside | None = None,
):
    """Pure-JAX `persistent_forward` (same operands and outputs; status all zeros): a
    `lax.scan` over the phases of `mosaic_forward.highway_forward_reference` (units u),
    the state's matmul-dtype cast as the A operand, xproj scaled by 1 at layer 0 and by 0
    elsewhere as the kernel does. With ``hyper``: the hyper cell's reference first, z from
    its states (`hyper_scales_reference`), then the main cell's. ``spin_limit``,
    ``interpret`` and ``layout`` are unused."""
    del spin_limit, interpret, layout
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
        return (*main[:-1], *h_outs[:-1], *((z,) if save else ()), tail, main[-1])
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
    """z [L, T, b_pad, z_width] (the kernels' layer-major layout) from the hyper state after
    every phase ``h_states [P, b_pad, h_pad]`` f32: z_p = cast(s_hyper[p]) @ P_l^T rows +
    p_l (f32 accumulation, then the bias: `ops.cells.hyper_scales`), ``proj`` and
    ``proj_bias`` as `HyperInside`'s."""
    depth = proj_bias.shape[0]
    s = h_states[..., : hyper_plan.k_pad].astype(proj.dtype).reshape(steps, depth, plan.b_pad, -1)
    p_t = proj.reshape(depth, plan.n_pad, hyper_plan.k_pad)
    z = jnp.einsum("tlbk,lnk->tlbn", s, p_t, preferred_element_type=F32)
    z = z + proj_bias[None]
    z_pm = z.reshape(steps * depth, plan.b_pad, plan.n_pad)
    return slots.scales_to_layer_major(z_pm, steps, depth, plan.z_width)
