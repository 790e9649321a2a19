"""The micro-layer phase of the persistent backward kernel: its refs, shared memory and
slices (`BackwardCell`) and staged input tiles (`input_names`); `backward.py`'s math."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from rhhjax.kernels.layout import F32
from rhhjax.kernels.mosaic import forward as mf
from rhhjax.kernels.mosaic import gemm, keep_mask, phase_timeline
from rhhjax.kernels.mosaic import persistent_slots as slots
from rhhjax.kernels.mosaic.backward import _gate_backward
from rhhjax.kernels.mosaic.persistent_cell import bias_tiles, staged_operands, wait_for_all_but
from rhhjax.kernels.mosaic.plan import REGISTER_UNITS, PersistentPlan


def bias_row_group(plan: PersistentPlan) -> int:
    """Rows of a block's da tile whose column sums stay apart: sums are slice loads and
    adds in the strided layout, no reduction across threads; in registers 1."""
    return 1 if plan.in_registers else 256 // math.gcd(plan.units_per_block, 256)


def register_halves(plan: PersistentPlan) -> int:
    """``in_registers``: the tile's column halves, each's epilogue apart (registers)."""
    return 2 if plan.units_per_block % (2 * REGISTER_UNITS) == 0 else 1


def input_names(has_z: bool, in_registers: bool = False) -> tuple[str, ...]:
    """The per-phase f32 epilogue input tiles, in slot order (in registers the bias is one
    row, `bias_rows`)."""
    if has_z:
        return ("g_out", "s_prev", "full_h", "full_t", "z") + ("b_h", "b_t") * (not in_registers)
    return ("g_out", "s_prev", "h", "t")


def bias_rows(plan: PersistentPlan, has_z: bool) -> bool:
    """Whether the backward stages the bias as one row (in registers, with z)."""
    return plan.in_registers and has_z


def saved_row(name: str, has_z: bool, state_in_packed: bool) -> int | None:
    saved = ("s_prev",) * state_in_packed + (("full_h", "full_t") if has_z else ("h", "t"))
    return saved.index(name) if name in saved else None


@dataclasses.dataclass(kw_only=True)
class BackwardCell:
    """The cell of the backward kernel: its plan, global refs, shared memory and block
    (r, c); `phase` runs one micro-layer phase."""

    plan: PersistentPlan
    steps: int
    depth: int
    keep: float
    names: tuple[str, ...]
    g_last: bool
    refs: dict
    sc: dict
    r: Any
    c: Any
    interpret: Any = None  # the kernel's: the cluster axes of a multicast
    split: gemm.SplitK | None = None  # plan.split_k: warpgroup 1's half of the main GEMM
    producer: gemm.Producer | None = None  # plan.producer: warpgroup 1 issues its loads
    timeline: Any = phase_timeline.OFF

    @property
    def phases(self) -> int:
        return self.steps * self.depth

    @property
    def has_z(self) -> bool:
        return "z" in self.names

    @property
    def k_steps(self) -> int:
        return 2 * self.plan.n_pad // self.plan.k_chunk

    @property
    def staged(self) -> gemm.StagedOperands | None:
        return staged_operands(self.sc, self.plan, self.interpret)

    def _weight_block(self, p):
        """The weight rows phase ``p``'s GEMM reads: the layer above's."""
        return jax.lax.rem(p + 1, self.depth) * self.plan.col_blocks + self.c

    def _a_block(self, p):
        """The d_mm rows phase ``p``'s GEMM reads: phase p + 1's d_scaled, the block's rows."""
        return slots.slot(p + 1, self.steps, self.depth) * self.plan.row_blocks + self.r

    def help(self, after_go: Callable | None = None) -> None:
        """Warpgroup 1 of phases P - 2 .. 0: `gemm.helper_gemm` (``plan.split_k``) or
        `gemm.produce` (``plan.producer``), GEMM number i - 1 at step i."""

        def one_phase(i, carry):
            p = self.phases - 1 - i
            blocks = (self.refs["d_mm"], self.refs["wt"], self._a_block(p), self._weight_block(p))
            if self.producer is not None:
                gemm.produce(
                    self.producer, *blocks, gemm=i - 1, k_steps=self.k_steps, after_go=after_go
                )
            else:
                gemm.helper_gemm(self.split, *blocks, k_steps=self.k_steps, after_go=after_go)
            return carry

        jax.lax.fori_loop(1, self.phases, one_phase, None)

    def slices(self):
        rows, u = self.plan.rows_per_block, self.plan.units_per_block
        return pl.ds(self.r * rows, rows), pl.ds(self.c * u, u)

    def prologue(self) -> None:
        """Zeroes the carry."""
        self.sc["carry"][...] = self._zeros()
        plgpu.commit_smem()

    def finish(self, ds_carry0) -> None:
        """Writes the carry after phase 0; waits for every store."""
        row_sl, unit_sl = self.slices()
        plgpu.copy_smem_to_gmem(self.sc["carry"], ds_carry0.at[row_sl, unit_sl])
        plgpu.wait_smem_to_gmem(0)

    def _zeros(self):
        zeros = jnp.zeros((self.plan.rows_per_block, self.plan.units_per_block), F32)
        return plgpu.layout_cast(zeros, plgpu.Layout.WGMMA) if self.plan.in_registers else zeros

    def _load_inputs(self, p, t, layer) -> None:
        """TMA loads of the phase's staged inputs (zeroing absent ones)."""
        plan, refs, epi, bar = self.plan, self.refs, self.sc["epi"], self.sc["bar"]
        rows, u = plan.rows_per_block, plan.units_per_block
        row_sl, unit_sl = self.slices()
        for slot, name in enumerate(self.names):
            if name == "g_out" and self.g_last:

                @pl.when(layer == self.depth - 1)
                def _(slot=slot):
                    src = refs["g"].at[t, row_sl, unit_sl]
                    plgpu.copy_gmem_to_smem(src, epi.at[slot], bar.at[slot])

                @pl.when(layer != self.depth - 1)
                def _(slot=slot):
                    epi[slot] = self._zeros()

                continue
            if name == "s_prev" and not plan.state_in_packed:  # f32: from the A buffer

                @pl.when(self.c * u < plan.k_pad)  # s_mm holds the K columns only
                def _(slot=slot):
                    first = slots.slot(p, self.steps, self.depth) * plan.b_pad + self.r * rows
                    src = refs["s_mm"].at[pl.ds(first, rows), unit_sl]
                    plgpu.copy_gmem_to_smem(src, epi.at[slot], bar.at[slot])

                @pl.when(self.c * u >= plan.k_pad)
                def _(slot=slot):
                    epi[slot] = self._zeros()

                continue
            row = saved_row(name, self.has_z, plan.state_in_packed)
            if row is not None:
                src = refs["packed"].at[p, row_sl, row, unit_sl]
            elif name == "z":  # layer-major; units past z_width read as zero
                src = refs["z"].at[layer, t, row_sl, unit_sl]
            elif name in ("b_h", "b_t"):
                src = refs["bias"].at[layer, row_sl, int(name == "b_t"), unit_sl]
            else:
                src = refs["g"].at[p, row_sl, unit_sl]
            plgpu.copy_gmem_to_smem(src, epi.at[slot], bar.at[slot])
        has_mask = refs["mask"] is not None
        if has_mask:
            mask_src = refs["mask"].at[p, row_sl, unit_sl]
            plgpu.copy_gmem_to_smem(mask_src, self.sc["mask_tile"], bar.at[len(self.names)])
        if bias_rows(plan, self.has_z):
            bias_src = refs["bias"].at[layer, self.r * rows, :, unit_sl]
            bias_bar = bar.at[len(self.names) + has_mask]
            plgpu.copy_gmem_to_smem(bias_src, self.sc["bias_rows"], bias_bar)

    def _wait_inputs(self, layer) -> None:
        plan, bar, names = self.plan, self.sc["bar"], self.names
        extra = (self.refs["mask"] is not None) + bias_rows(plan, self.has_z)
        for slot in range(len(names) + extra):
            name = names[slot] if slot < len(names) else "mask"
            if name == "g_out" and self.g_last:
                pl.when(layer == self.depth - 1)(lambda slot=slot: plgpu.barrier_wait(bar.at[slot]))
            elif name == "s_prev" and not plan.state_in_packed:
                in_a = self.c * plan.units_per_block < plan.k_pad
                pl.when(in_a)(lambda slot=slot: plgpu.barrier_wait(bar.at[slot]))
            else:
                plgpu.barrier_wait(bar.at[slot])

    def _gemm(self, p, tile) -> None:
        """``tile`` (`acc` or a `gemm.Tile`) = d_mm[p + 1] @ wt[l_above]^T; 0 at the last."""
        plan = self.plan
        last = p == self.phases - 1
        staged, w_block = self.staged, self._weight_block(p)
        first_ready = phase_timeline.first_ready(self.timeline)

        @pl.when(jnp.logical_not(last))
        def _():
            a_block, a_mm, w = self._a_block(p), self.refs["d_mm"], self.refs["wt"]
            if self.producer is not None:
                gemm.consume_gemm(
                    tile, self.producer, gemm=self.phases - 2 - p, k_steps=self.k_steps,
                    first_ready=first_ready,
                )  # fmt: skip
            elif self.split is not None:
                gemm.lead_gemm(
                    tile, staged, self.split, a_mm, w, a_block, w_block, k_steps=self.k_steps,
                    first_ready=first_ready,
                )  # fmt: skip
            elif staged is None:
                gemm.gemm_nt_to_smem(
                    tile, a_mm, w, a_block, w_block, tile_k=plan.k_chunk, k_steps=self.k_steps,
                    stages=plan.stages, first_ready=first_ready,
                )  # fmt: skip
            else:
                gemm.gemm_nt_staged(
                    tile, staged, a_mm, w, a_block, w_block, k_steps=self.k_steps,
                    first_ready=first_ready,
                )  # fmt: skip

        @pl.when(last)
        def _():
            self.timeline.stamp("operands_ready")  # no GEMM: acc = 0
            if isinstance(tile, gemm.Tile):
                zero = jnp.zeros((plan.rows_per_block, plan.units_per_block // tile.halves), F32)
                tile.consume(*[zero] * tile.halves)
            else:
                tile[...] = jnp.zeros(tile.shape, F32)
                plgpu.commit_smem()

    def phase(self, p) -> None:
        """Phase ``p``: loads, GEMM, epilogue, stores."""
        plan, refs, sc = self.plan, self.refs, self.sc
        epi, dsc, mm_dtype = sc["epi"], sc["dsc"], refs["wt"].dtype
        rows, u = plan.rows_per_block, plan.units_per_block
        row_sl, unit_sl = self.slices()
        t, layer = jax.lax.div(p, self.depth), jax.lax.rem(p, self.depth)
        has_z = self.has_z
        self._load_inputs(p, t, layer)

        def epilogue(parts):
            self.timeline.stamp("gemm_done")
            self._wait_inputs(layer)
            plgpu.commit_smem()  # every thread's acc (and zero g, s) write before a read
            for index, acc in parts:
                self._epilogue(index, mm_dtype, acc)
            plgpu.commit_smem()

        if plan.in_registers:
            halves = register_halves(plan)
            width = u // halves

            def consume(*accs):
                index = [(pl.ds(0, rows), pl.ds(i * width, width)) for i in range(halves)]
                epilogue([(at, lambda acc=acc: acc) for at, acc in zip(index, accs, strict=True)])

            self._gemm(p, gemm.Tile.of(shape=(rows, u), consume=consume, halves=halves))
        else:
            self._gemm(p, sc["acc"])
            epilogue([((c,), lambda c=c: sc["acc"][c]) for c in self._row_chunks()])
        self.timeline.stamp("epilogue_done")
        # First the stores the next phase reads; the phase waits for those alone.
        first = slots.slot(p, self.steps, self.depth) * plan.b_pad + self.r * rows
        for half in range(2):
            dst = refs["d_mm"].at[pl.ds(first, rows), pl.ds(half * plan.n_pad + self.c * u, u)]
            plgpu.copy_smem_to_gmem(dsc.at[half], dst)
        d_x_slots = (3, 4) if has_z else (0, 1)

        @pl.when(layer == 0)
        def _():
            for half, slot in enumerate(d_x_slots):
                plgpu.copy_smem_to_gmem(epi.at[slot], refs["d_x"].at[t, row_sl, half, unit_sl])

        if has_z:  # units past z_width: dropped by TMA
            plgpu.copy_smem_to_gmem(epi.at[2], refs["dz"].at[layer, t, row_sl, unit_sl])
        self._column_sums(p)  # its store last
        wait_for_all_but(has_z + 1)
        self.timeline.stamp("stores_done")

    def _row_chunks(self) -> list:
        """Row slices of the epilogue: two halves where the strided layout allows (register
        pressure), else the whole tile."""
        rows, u = self.plan.rows_per_block, self.plan.units_per_block
        if rows % 2 == 0 and (rows // 2 * u) % 256 == 0:
            return [pl.ds(0, rows // 2), pl.ds(rows // 2, rows // 2)]
        return [pl.ds(0, rows)]

    def _epilogue(self, index: tuple, mm_dtype, acc: Callable) -> None:
        """The gate backward on the tiles at ``index`` from ``acc()``: da, dz, d_scaled and
        the new carry, written over the inputs once every thread has read them."""
        sc, names, epi, has_z = self.sc, self.names, self.sc["epi"], self.has_z
        layout = plgpu.Layout.WGMMA if self.plan.in_registers else None

        def load(tile):
            return keep_mask.load_strided(tile) if layout is None else keep_mask.load(tile, layout)

        ins = {name: load(epi.at[(slot, *index)]) for slot, name in enumerate(names)}
        if self.refs["mask"] is not None:
            ins["mask"] = keep_mask.load_values(sc["mask_tile"].at[index], self.keep, layout)
        ins["ds_carry"] = load(sc["carry"].at[index])
        if bias_rows(self.plan, has_z):
            rows = sc["bias_rows"].at[(slice(None), *index[1:])]
            ins["b_h"], ins["b_t"] = bias_tiles(rows, ins["z"].shape)
        if has_z:  # the gates as the forward computed them, from full
            ins["h"], ins["t"] = mf.gates(ins["full_h"], ins["full_t"], ins)
        tiles = _gate_backward(acc(), ins)
        if has_z:
            dz = tiles["da_h"] * ins["full_h"] + tiles["da_t"] * ins["full_t"]
        plgpu.commit_smem()  # every read of the inputs before their slots are overwritten
        epi.at[(0, *index)][...] = tiles["da_h"]  # over g_out
        epi.at[(1, *index)][...] = tiles["da_t"]  # over s_prev
        if has_z:
            epi.at[(2, *index)][...] = dz  # over full_h
            epi.at[(3, *index)][...] = tiles["d_h"]  # over full_t: d_scaled in f32 (d_x)
            epi.at[(4, *index)][...] = tiles["d_t"]  # over z
        sc["carry"].at[index][...] = tiles["ds_carry"]
        sc["dsc"].at[(0, *index)][...] = tiles["d_h"].astype(mm_dtype)
        sc["dsc"].at[(1, *index)][...] = tiles["d_t"].astype(mm_dtype)
        if layout is not None:  # the bias gradients' column sums
            for half, name in enumerate(("da_h", "da_t")):
                sc["bias_part"].at[(half, 0, *index[1:])][...] = jnp.sum(tiles[name], axis=0)

    def _column_sums(self, p) -> None:
        """Column sums of da's halves from their staged tiles."""
        plan, epi, sc = self.plan, self.sc["epi"], self.sc
        rows, group = plan.rows_per_block, bias_row_group(plan)
        _, unit_sl = self.slices()

        def column_sums(tile):
            total = keep_mask.load_strided(tile.at[pl.ds(0, group)])
            for j in range(1, rows // group):
                total = total + keep_mask.load_strided(tile.at[pl.ds(j * group, group)])
            return total

        if not plan.in_registers:  # else summed in the epilogue
            for half in range(2):
                sc["bias_part"][half] = column_sums(epi.at[half])
            plgpu.commit_smem()
        dst = self.refs["bias_parts"].at[p, self.r, :, :, unit_sl]
        plgpu.copy_smem_to_gmem(sc["bias_part"], dst)
