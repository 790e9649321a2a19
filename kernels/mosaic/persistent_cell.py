"""The micro-layer phase of the persistent forward kernel: its refs, shared memory and slices
(`Cell`), its shared memory (`scratch`) and outputs (`out_types`); `forward.py`'s math."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from rhhjax.kernels.layout import F32
from rhhjax.kernels.mosaic import forward as mf
from rhhjax.kernels.mosaic import gemm, grid_barrier, keep_mask, phase_timeline, rowgroup_layout
from rhhjax.kernels.mosaic import persistent_slots as slots
from rhhjax.kernels.mosaic.plan import (
    BIAS_ROWS,
    PersistentPlan,
    forward_inputs,
    forward_saved_rows,
    forward_staging_slots,
)

WARPGROUPS = "warpgroup"


@dataclasses.dataclass(kw_only=True)
class Cell:
    """One cell inside the persistent forward: plan, global refs, shared memory, block
    slices; `phase` runs one micro-layer phase."""

    plan: PersistentPlan
    steps: int
    depth: int
    keep: float
    save: bool
    has_z: bool
    refs: dict
    state: Any
    pre: Any
    epi: Any
    cast: Any
    mask_tile: Any
    bar: Any
    r: Any
    g: Any
    staged: gemm.StagedOperands | None = None
    producer: gemm.Producer | None = None
    bias_rows: Any = None  # in registers: [BIAS_ROWS, u] f32, the block's bias
    timeline: Any = phase_timeline.OFF

    @property
    def phases(self) -> int:
        return self.steps * self.depth

    @property
    def k_steps(self) -> int:
        return self.plan.k_pad // self.plan.k_chunk

    @property
    def ins(self) -> tuple[str, ...]:
        return forward_inputs(self.has_z, self.plan.in_registers)

    def slices(self):
        rows, u = self.plan.rows_per_block, self.plan.units_per_block
        return pl.ds(self.r * rows, rows), pl.ds(self.g * u, u)

    def blocks(self, p):
        """(A row block, weight row block) of phase ``p``'s GEMM."""
        t_layer = slots.slot(p, self.steps, self.depth) * self.plan.row_blocks + self.r
        return t_layer, jax.lax.rem(p, self.depth) * self.plan.col_blocks + self.g

    def produce(self, after_go=None) -> None:
        """Warpgroup 1: every phase's K loop loads (`gemm.produce`)."""

        def one_phase(p, carry):
            gemm.produce(
                self.producer, self.refs["s_mm"], self.refs["w"], *self.blocks(p), gemm=p,
                k_steps=self.k_steps, after_go=after_go,
            )  # fmt: skip
            return carry

        jax.lax.fori_loop(0, self.phases, one_phase, None)

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
        row_sl, unit_sl = self.slices()
        bias_g, x_g = self.refs["bias"], self.refs["x"]
        src = {
            "b_h": bias_g.at[layer, row_sl, 0, unit_sl],
            "b_t": bias_g.at[layer, row_sl, 1, unit_sl],
            "x_h": x_g.at[t, row_sl, 0, unit_sl],
            "x_t": x_g.at[t, row_sl, 1, unit_sl],
        }
        if self.has_z:
            src["z"] = self.refs["z"].at[layer, t, row_sl, unit_sl]
        return src

    def phase(self, p) -> None:
        """Phase ``p``: loads, GEMM, epilogue, stores."""
        plan, refs, epi, bar = self.plan, self.refs, self.epi, self.bar
        steps, depth, phases = self.steps, self.depth, self.phases
        row_sl, unit_sl = self.slices()
        u = plan.units_per_block
        has_mask = refs["mask"] is not None
        ins = self.ins
        outs = forward_saved_rows(self.save, self.has_z)
        _, out_slot = forward_staging_slots(self.has_z, self.save, plan.in_registers)
        save_state = self.save and plan.state_in_packed  # f32: s_mm holds the input states
        mask_bar = len(ins)
        t, layer = jax.lax.div(p, depth), jax.lax.rem(p, depth)
        first = layer == 0
        src = self._sources(t, layer)

        def each_input(action):
            for slot, name in enumerate(ins):
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
        if plan.in_registers:  # the bias: the block's first row, the same in every row
            bias_src = refs["bias"].at[layer, self.r * plan.rows_per_block, :, unit_sl]
            plgpu.copy_gmem_to_smem(bias_src, self.bias_rows, bar.at[mask_bar + has_mask])
        if save_state:  # packed row 0: the phase's input state, before it is overwritten
            plgpu.copy_smem_to_gmem(self.state, refs["packed"].at[p, row_sl, 0, unit_sl])

        a_row, w_row = self.blocks(p)
        first_ready = phase_timeline.first_ready(self.timeline)

        def epilogue(pre_h, pre_t):
            self.timeline.stamp("gemm_done")
            each_input(lambda slot, name: plgpu.barrier_wait(bar.at[slot]))
            if has_mask:
                plgpu.barrier_wait(bar.at[mask_bar])
            if plan.in_registers:
                plgpu.barrier_wait(bar.at[mask_bar + has_mask])
            x_scale = jnp.where(first, jnp.float32(1.0), jnp.float32(0.0))
            tiles_in = {name: self._load(epi.at[slot]) for slot, name in enumerate(ins)}
            tiles_in["x_h"] = tiles_in["x_h"] * x_scale
            tiles_in["x_t"] = tiles_in["x_t"] * x_scale
            tiles_in["s"] = self.state[...] if self._layout is None else self._load(self.state)
            if plan.in_registers:
                tiles_in["b_h"], tiles_in["b_t"] = bias_tiles(self.bias_rows, pre_h.shape)
            if has_mask:
                tiles_in["mask"] = keep_mask.load_values(self.mask_tile, self.keep, self._layout)
            tiles = mf._epilogue(pre_h, pre_t, tiles_in)
            if save_state:  # the state's store to packed row 0 has read it
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)
            # Every thread has read the tiles the stores below overwrite.
            plgpu.commit_smem()
            self.state[...] = tiles["s_new"]
            self.cast[...] = tiles["s_new"].astype(jnp.dtype(self.plan.dtype))
            for name, slot in zip(outs, out_slot, strict=True):
                epi[slot] = tiles[name]
            plgpu.commit_smem()

        tile = self.pre
        if plan.in_registers:
            shape = (plan.rows_per_block, plan.cols_per_block)
            tile = gemm.Tile.of(shape=shape, consume=epilogue, halves=2)
        if self.producer is not None:
            gemm.consume_gemm(
                tile, self.producer, gemm=p, k_steps=self.k_steps, first_ready=first_ready
            )
        elif self.staged is None:
            gemm.gemm_nt_to_smem(
                tile, refs["s_mm"], refs["w"], a_row, w_row,
                tile_k=plan.k_chunk, k_steps=self.k_steps, stages=plan.stages,
                first_ready=first_ready,
            )  # fmt: skip
        else:
            gemm.gemm_nt_staged(
                tile, self.staged, refs["s_mm"], refs["w"], a_row, w_row,
                k_steps=self.k_steps, first_ready=first_ready,
            )  # fmt: skip
        if not plan.in_registers:
            epilogue(self.pre[:, pl.ds(0, u)], self.pre[:, pl.ds(u, u)])
        self.timeline.stamp("epilogue_done")

        @pl.when(jnp.logical_and(self.in_a(), p < phases - 1))  # the next phase's A rows
        def _():
            rows = plan.rows_per_block
            a_rows = pl.ds(slots.slot(p + 1, steps, depth) * plan.b_pad + self.r * rows, rows)
            plgpu.copy_smem_to_gmem(self.cast, refs["s_mm"].at[a_rows, unit_sl])

        if self.save:  # the states are packed row 0 of the next phase: only the last one

            @pl.when(p == phases - 1)
            def _():
                plgpu.copy_smem_to_gmem(self.state, refs["states"].at[0, row_sl, unit_sl])

        late = self._late_stores(p, out_slot, save_state)
        wait_for_all_but(late)
        self.timeline.stamp("stores_done")

    @property
    def _layout(self):
        """The epilogue's register layout: the accumulators' in registers, else strided."""
        return plgpu.Layout.WGMMA if self.plan.in_registers else None

    def _load(self, tile):
        layout = self._layout
        return keep_mask.load_strided(tile) if layout is None else keep_mask.load(tile, layout)

    def _late_stores(self, p, out_slot, save_state: bool) -> int:
        """Issues the stores no later phase reads, after those one does; returns how many."""
        refs, epi = self.refs, self.epi
        row_sl, unit_sl = self.slices()
        late = 0
        if not self.save:
            plgpu.copy_smem_to_gmem(self.state, refs["states"].at[p, row_sl, unit_sl])
            late += 1
        for i, slot in enumerate(out_slot):
            dst = refs["packed"].at[p, row_sl, save_state + i, unit_sl]
            plgpu.copy_smem_to_gmem(epi.at[slot], dst)
            late += 1
        return late


def multicast_axes(plan: PersistentPlan, interpret: Any) -> tuple[str | None, str | None]:
    """The cluster axes the main GEMM's A and B chunks are multicast along, or None: A along
    a row group's cluster, B along a column's row blocks (interpreted: the grid's cluster)."""
    a_axis = rowgroup_layout.COL if plan.multicast_a else None
    b_axis = rowgroup_layout.ROW if interpret is None else grid_barrier.CLUSTER_AXIS
    return a_axis, b_axis if plan.multicast_b else None


def stage_buffers(
    plan: PersistentPlan, cols: int, k_steps: int, mm_dtype, interpret, prefix: str = "stage_"
) -> dict:
    """A K loop's stage buffers (B rows ``cols``) as scratch types named ``prefix*``."""
    buffers = gemm.staged_scratch(
        plan.rows_per_block, cols, plan.k_chunk, plan.staged_stages(k_steps), mm_dtype,
        *multicast_axes(plan, interpret),
    )  # fmt: skip
    return {prefix + name: buffer for name, buffer in buffers.items()}


def staged_scratch(plan: PersistentPlan, cols: int, k_steps: int, mm_dtype, interpret) -> dict:
    """With ``plan.staged`` the main GEMM's `stage_buffers` (and a producer's barriers)."""
    if not plan.staged:
        return {}
    producer = gemm.producer_scratch(plan.staged_stages(k_steps)) if plan.producer else {}
    buffers = stage_buffers(plan, cols, k_steps, mm_dtype, interpret)
    return buffers | {f"producer_{name}": barrier for name, barrier in producer.items()}


def producer_of(sc: dict, plan: PersistentPlan, interpret) -> gemm.Producer | None:
    """With ``plan.producer`` the `gemm.Producer` of `staged_scratch`'s buffers; else None."""
    if not plan.producer:
        return None
    staged = staged_operands(sc, plan, interpret)
    return gemm.Producer(staged, sc["producer_free"], sc["producer_go"])


def warpgroups(two: bool) -> dict:
    """`plgpu.kernel`'s arguments for blocks of one warpgroup or ``two``."""
    return dict(num_threads=2, thread_name=WARPGROUPS) if two else {}


def staged_operands(
    sc: dict, plan: PersistentPlan, interpret, prefix: str = "stage_"
) -> gemm.StagedOperands | None:
    """The `stage_buffers` named ``prefix*`` in ``sc``, or None."""
    buffers = {k.removeprefix(prefix): v for k, v in sc.items() if k.startswith(prefix)}
    if not buffers:
        return None
    a_axis, b_axis = multicast_axes(plan, interpret)
    return gemm.StagedOperands(**buffers, a_axis=a_axis, b_axis=b_axis)


def wait_for_all_but(late: int) -> None:
    """Waits for every bulk store but the ``late`` last ones to write (the next phase reads
    those) and for every store to read its shared memory (the next phase reuses it)."""
    plgpu.wait_smem_to_gmem(late)
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def wait_for_every_store() -> None:
    """Waits for every bulk store of the block: a kernel's last act."""
    plgpu.wait_smem_to_gmem(0)


def bias_tiles(bias_rows, shape: tuple[int, int]) -> tuple:
    """The h and t gates' bias rows [2, u] (shared memory) as [rows, u] tiles in the
    accumulators' layout."""
    layout = plgpu.Layout.WGMMA.reduce(0)
    rows = [keep_mask.load(bias_rows.at[gate], layout) for gate in range(BIAS_ROWS)]
    return tuple(jax.lax.broadcast_in_dim(row, shape, (1,)) for row in rows)


def epilogue_tile(plan: PersistentPlan, shape: tuple[int, ...], dtype, halves: int = 1):
    """Epilogue tiles in shared memory; in registers swizzled by column ``halves`` (no bank
    conflicts in the accumulators' layout)."""
    if not plan.in_registers:
        return plgpu.SMEM(shape, dtype)
    transforms = gemm.wgmma_transforms(shape[-1] // halves, dtype)
    return plgpu.SMEM(shape, dtype, transforms=transforms)


def scratch(
    plan: PersistentPlan, mm_dtype, has_z: bool, has_mask: bool, save: bool, interpret: Any = None
) -> dict:
    """The cell's shared memory but its GEMM tile ``pre`` (none ``in_registers``)."""
    rows, u = plan.rows_per_block, plan.units_per_block
    n_slots, _ = forward_staging_slots(has_z, save, plan.in_registers)
    ins = forward_inputs(has_z, plan.in_registers)
    tile = functools.partial(epilogue_tile, plan)
    scratch = dict(
        state=tile((rows, u), F32),
        epi=tile((n_slots, rows, u), F32),
        cast_or_mask=plgpu.RefUnion(
            (tile((rows, u), mm_dtype),), (tile((rows, u), keep_mask.DTYPE),)
        ),
        bar=plgpu.Barrier(num_barriers=len(ins) + has_mask + plan.in_registers),
        **({"bias_rows": plgpu.SMEM((BIAS_ROWS, u), F32)} if plan.in_registers else {}),
        **staged_scratch(
            plan, plan.cols_per_block, plan.k_pad // plan.k_chunk, mm_dtype, interpret
        ),
    )
    return scratch


def out_types(plan: PersistentPlan, phases: int, save: bool, mm_dtype) -> list:
    """One cell's outputs: states (or with ``save`` the last and packed), s_mm."""
    b_pad, n_pad = plan.b_pad, plan.n_pad
    out = [jax.ShapeDtypeStruct((1 if save else phases, b_pad, n_pad), F32)]
    if save:
        out.append(jax.ShapeDtypeStruct((phases, b_pad, plan.packed_rows, n_pad), F32))
    out.append(jax.ShapeDtypeStruct((phases * b_pad, plan.k_pad), mm_dtype))
    return out
