"""The K loop every Mosaic GPU kernel here shares: one block's f32 tile of ``A @ B^T``
through a ``stages``-deep TMA pipeline into wgmma accumulators, no wgmma left in flight; the
tile goes to shared memory or, with ``consume``, to the caller's epilogue in registers.
The staged form runs on the caller's buffers and can multicast A's or B's chunks to the
blocks along a cluster axis, or split them between two warpgroups."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from rhhjax.kernels.layout import F32
from rhhjax.kernels.mosaic import keep_mask


def wgmma_transforms(cols: int, dtype) -> tuple:
    """wgmma shared-memory transforms of a tile with ``cols`` minor elements."""
    swizzle = plgpu.find_swizzle(cols * jnp.dtype(dtype).itemsize * 8)
    elems = swizzle // jnp.dtype(dtype).itemsize
    return (plgpu.TilingTransform((8, elems)), plgpu.SwizzleTransform(swizzle))


@dataclasses.dataclass(frozen=True)
class Tile:
    """A GEMM's f32 tile: into ``out`` (shared memory), or ``consume(*values)`` of
    ``halves`` accumulators (B's rows split evenly) in registers."""

    rows: int
    cols: int
    out: Any = None
    consume: Callable[..., None] | None = None
    halves: int = 1

    @staticmethod
    def of(out=None, *, shape=None, consume=None, halves: int = 1) -> Tile:
        rows, cols = out.shape if consume is None else shape
        return Tile(rows, cols, out, consume, halves if consume is not None else 1)


def _accumulate(tile: Tile, body: Callable, addend: Callable | None = None) -> None:
    """``body(accs)``, then the values (plus ``addend(halves)``'s) stored or consumed."""
    n = tile.cols // tile.halves

    def scoped(*accs):
        body(accs)
        values = [acc[...] for acc in accs]
        if addend is not None:
            values = [v + a for v, a in zip(values, addend(tile.halves), strict=True)]
        if tile.consume is not None:
            tile.consume(*values)
        else:
            tile.out[...] = values[0]

    pl.run_scoped(scoped, *[plgpu.ACC((tile.rows, n), F32)] * tile.halves)
    if tile.consume is None:
        plgpu.commit_smem()  # a warpgroup barrier: others read `out` in another layout


def _wgmma(accs, a_smem, b_smem) -> None:
    n = b_smem.shape[0] // len(accs)
    for i, acc in enumerate(accs):
        b = b_smem if len(accs) == 1 else b_smem.at[pl.ds(i * n, n)]
        plgpu.wgmma(acc, a_smem, b.transpose((1, 0)))


def gemm_nt_to_smem(
    out,
    a_gmem,
    b_gmem,
    a_block: jax.Array | int,
    b_block: jax.Array | int,
    *,
    tile_k: int,
    k_steps: int,
    stages: int,
    first_ready: Callable[[], None] | None = None,
) -> None:
    """``out [rows, cols] f32 (shared memory, or a `Tile`) = A[a_block] @ B[b_block]^T``,
    K = ``k_steps * tile_k``; A and B are K minor. ``first_ready()`` runs once the first K
    chunk has landed."""
    tile = out if isinstance(out, Tile) else Tile.of(out)
    layout = wgmma_transforms(tile_k, a_gmem.dtype)
    spec = functools.partial(plgpu.BlockSpec, transforms=layout)

    def body(accs):
        def k_step(indices, a_smem, b_smem):
            if first_ready is not None:
                pl.when(indices[0] == 0)(first_ready)
            _wgmma(accs, a_smem, b_smem)
            plgpu.wgmma_wait(0)

        plgpu.emit_pipeline(
            k_step,
            grid=(k_steps,),
            in_specs=[
                spec((tile.rows, tile_k), lambda k: (a_block, k)),
                spec((tile.cols, tile_k), lambda k: (b_block, k)),
            ],
            max_concurrent_steps=stages,
        )(a_gmem, b_gmem)

    _accumulate(tile, body)


@dataclasses.dataclass(frozen=True)
class StagedOperands:
    """A K loop's stage buffers, kept by the caller across GEMMs (`gemm_nt_staged`)."""

    a: Any  # [stages, rows, tile_k]
    b: Any  # [stages, cols, tile_k]
    a_bar: Any  # [stages] mbarriers
    b_bar: Any
    a_free: Any = None  # [stages] cluster barriers: every block read the A slot (multicast)
    b_free: Any = None
    a_axis: str | None = None  # the cluster axis A's chunks are multicast along, or None
    b_axis: str | None = None

    @property
    def stages(self) -> int:
        return self.a.shape[0]


def staged_scratch(
    rows: int, cols: int, tile_k: int, stages: int, dtype, a_axis=None, b_axis=None
) -> dict:
    """The scratch types of `StagedOperands`' buffers, by field name; with ``a_axis`` or
    ``b_axis`` (a cluster axis) that operand's chunks are multicast to the blocks along it."""
    smem = functools.partial(plgpu.SMEM, dtype=dtype, transforms=wgmma_transforms(tile_k, dtype))
    types = dict(
        a=smem((stages, rows, tile_k)),
        b=smem((stages, cols, tile_k)),
        a_bar=plgpu.Barrier(num_barriers=stages),
        b_bar=plgpu.Barrier(num_barriers=stages),
    )
    for operand, axis in (("a", a_axis), ("b", b_axis)):
        if axis is not None:
            bar = plgpu.ClusterBarrier(collective_axes=(axis,), num_barriers=stages)
            types[f"{operand}_free"] = bar
    return types


def _landed(staged: StagedOperands, slot) -> None:
    plgpu.barrier_wait(staged.a_bar.at[slot])
    plgpu.barrier_wait(staged.b_bar.at[slot])


def _multiply(staged: StagedOperands, accs, slot, k, first_ready: Callable | None) -> None:
    """Stage ``slot`` (chunk ``k`` of the GEMM), once landed, into the accumulators."""
    _landed(staged, slot)
    if first_ready is not None:
        pl.when(k == 0)(first_ready)
    _wgmma(accs, staged.a.at[slot], staged.b.at[slot])
    plgpu.wgmma_wait(0)


def _chunk(gmem, block: jax.Array | int, k: jax.Array | int, tile):
    rows, tile_k = tile.shape
    return gmem.at[pl.ds(block * rows, rows), pl.ds(k * tile_k, tile_k)]


def _load(staged: StagedOperands, operand: str, gmem, block, chunk, n) -> None:
    """K chunk ``chunk`` of ``operand``'s block into stage ``n % stages``."""
    tiles, bars = getattr(staged, operand), getattr(staged, f"{operand}_bar")
    slot, axis = jax.lax.rem(n, staged.stages), getattr(staged, f"{operand}_axis")
    src = _chunk(gmem, block, chunk, tiles.at[0])
    plgpu.copy_gmem_to_smem(src, tiles.at[slot], bars.at[slot], collective_axes=axis)


def _free(staged: StagedOperands, operand: str, k) -> None:
    """Waits until every block along the operand's multicast axis has read chunk ``k``'s
    stage (arriving for this block): a multicast writes into theirs too."""
    if getattr(staged, f"{operand}_axis") is not None:
        free = getattr(staged, f"{operand}_free").at[jax.lax.rem(k, staged.stages)]
        plgpu.barrier_arrive(free)
        plgpu.barrier_wait(free)


def load_b_chunks(
    staged: StagedOperands, b_gmem, b_block: jax.Array | int, k_steps: int, k_first: int = 0
) -> None:
    """Issues the copies of B[b_block]'s first ``min(stages, k_steps)`` K chunks."""
    for k in range(min(staged.stages, k_steps)):
        _load(staged, "b", b_gmem, b_block, k_first + k, k)


def gemm_nt_staged(
    out,
    staged: StagedOperands,
    a_gmem,
    b_gmem,
    a_block: jax.Array | int,
    b_block: jax.Array | int,
    *,
    k_steps: int,
    k_first: int = 0,
    addend: Callable[[int], list] | None = None,
    first_ready: Callable[[], None] | None = None,
) -> None:
    """`gemm_nt_to_smem` of K chunks ``k_first .. k_first + k_steps - 1`` on ``staged``.
    With ``staged.a_axis`` (``b_axis``) every block along that cluster axis runs this GEMM
    with the same A (B) block, and each of its chunks is loaded once for all of them: a
    stage is refilled once every block has read it (`_free`). The cluster must not reuse the
    stages between two such GEMMs without a barrier of its blocks. ``addend``: `_accumulate`."""
    stages = staged.stages
    tile = out if isinstance(out, Tile) else Tile.of(out)
    load_b_chunks(staged, b_gmem, b_block, k_steps, k_first)
    for k in range(min(stages, k_steps)):
        _load(staged, "a", a_gmem, a_block, k_first + k, k)

    def body(accs):
        def k_step(k, carry):
            _multiply(staged, accs, jax.lax.rem(k, stages), k, first_ready)
            refill = k + stages  # the chunk for the stage just read

            @pl.when(refill < k_steps)
            def _():
                _free(staged, "a", refill)
                _free(staged, "b", refill)
                _load(staged, "a", a_gmem, a_block, k_first + refill, refill)
                _load(staged, "b", b_gmem, b_block, k_first + refill, refill)

            return carry

        jax.lax.fori_loop(0, k_steps, k_step, None)

    _accumulate(tile, body, addend)


@dataclasses.dataclass(frozen=True)
class SplitK:
    """A GEMM's K chunks split between a block's warpgroups: 0 (`lead_gemm`) the first half,
    1 (`helper_gemm`) the rest into ``partial``; mbarriers ``go`` (start) and ``done``."""

    stages: StagedOperands  # the helper's
    partial: Any  # [rows, cols] f32
    go: Any
    done: Any

    @staticmethod
    def halves(k_steps: int) -> tuple[int, int]:
        return k_steps // 2, k_steps - k_steps // 2


def split_scratch(rows: int, cols: int) -> dict:
    """The scratch types of `SplitK`'s fields but ``stages``'s (`staged_scratch`'s)."""
    return dict(  # partial: stored and loaded in the accumulator's layout
        partial=plgpu.SMEM((rows, cols), F32, transforms=wgmma_transforms(cols, F32)),
        go=plgpu.Barrier(num_barriers=1),
        done=plgpu.Barrier(num_barriers=1),
    )


def lead_gemm(out, staged: StagedOperands, split: SplitK, a_gmem, b_gmem, a_block, b_block,
              *, k_steps: int, first_ready=None) -> None:  # fmt: skip
    """Warpgroup 0: the first half of the K chunks, plus the helper's ``partial``."""
    lead, _ = SplitK.halves(k_steps)

    def partial(halves: int):
        plgpu.barrier_wait(split.done)
        n = split.partial.shape[1] // halves
        parts = [split.partial.at[:, pl.ds(i * n, n)] for i in range(halves)]
        return [keep_mask.load(part, plgpu.Layout.WGMMA) for part in parts]

    plgpu.barrier_arrive(split.go)
    gemm_nt_staged(
        out, staged, a_gmem, b_gmem, a_block, b_block, k_steps=lead,
        addend=partial, first_ready=first_ready,
    )  # fmt: skip


def helper_gemm(split: SplitK, a_gmem, b_gmem, a_block, b_block, *, k_steps: int,
                after_go=None) -> None:  # fmt: skip
    """Warpgroup 1: after ``go`` (and ``after_go()``), the second half into ``partial``."""
    lead, rest = SplitK.halves(k_steps)
    plgpu.barrier_wait(split.go)
    if after_go is not None:
        after_go()
    gemm_nt_staged(
        split.partial, split.stages, a_gmem, b_gmem, a_block, b_block, k_steps=rest,
        k_first=lead,
    )  # fmt: skip
    plgpu.barrier_arrive(split.done)


def skip_split(split: SplitK) -> None:
    """Warpgroup 0's `lead_gemm` of no GEMM: the helper runs its half on stale operands."""
    plgpu.barrier_arrive(split.go)
    plgpu.barrier_wait(split.done)


@dataclasses.dataclass(frozen=True)
class Producer:
    """A K loop whose loads warpgroup 1 issues (`produce`) while warpgroup 0 runs the wgmmas
    (`consume_gemm`): chunk ``n`` of the block's sequence of GEMMs is stage ``n % stages``,
    refilled once warpgroup 0 has read it (``free``); ``go``: warpgroup 0 passed the phase
    barrier, so its A rows may be read."""

    staged: StagedOperands
    free: Any
    go: Any


def producer_scratch(stages: int) -> dict:
    """The scratch types of `Producer`'s fields but ``staged`` (`staged_scratch`'s)."""
    return dict(free=plgpu.Barrier(num_barriers=stages), go=plgpu.Barrier(num_barriers=1))


def produce(producer: Producer, a_gmem, b_gmem, a_block, b_block, *, gemm: jax.Array,
            k_steps: int, after_go: Callable | None = None) -> None:  # fmt: skip
    """Warpgroup 1: GEMM number ``gemm``'s loads. B (no dependence on the recurrence) fills
    the first stages as they free up, before ``go``; then A, then the rest chunk by chunk."""
    staged, stages = producer.staged, producer.staged.stages
    first = gemm * k_steps

    def free(k):
        n = first + k

        @pl.when(n >= stages)
        def _():
            plgpu.barrier_wait(producer.free.at[jax.lax.rem(n, stages)])

    head = min(stages, k_steps)
    for k in range(head):
        free(k)
        _load(staged, "b", b_gmem, b_block, k, first + k)
    plgpu.barrier_wait(producer.go)
    if after_go is not None:
        after_go()
    for k in range(head):
        _load(staged, "a", a_gmem, a_block, k, first + k)

    def rest(k, carry):
        free(k)
        _load(staged, "b", b_gmem, b_block, k, first + k)
        _load(staged, "a", a_gmem, a_block, k, first + k)
        return carry

    jax.lax.fori_loop(head, k_steps, rest, None)


def consume_gemm(out, producer: Producer, *, gemm: jax.Array, k_steps: int,
                 first_ready: Callable | None = None) -> None:  # fmt: skip
    """Warpgroup 0: `gemm_nt_to_smem` of GEMM number ``gemm`` on the stages `produce` fills;
    opens its A loads (``go``) first."""
    staged, stages = producer.staged, producer.staged.stages
    tile = out if isinstance(out, Tile) else Tile.of(out)
    first = gemm * k_steps
    plgpu.barrier_arrive(producer.go)

    def body(accs):
        def k_step(k, carry):
            slot = jax.lax.rem(first + k, stages)
            _multiply(staged, accs, slot, k, first_ready)
            plgpu.barrier_arrive(producer.free.at[slot])
            return carry

        jax.lax.fori_loop(0, k_steps, k_step, None)

    _accumulate(tile, body)


def skip_gemm(producer: Producer, *, gemm: jax.Array, k_steps: int) -> None:
    """Warpgroup 0's `consume_gemm` of a phase it does not run (a grid barrier gave up):
    takes each chunk `produce` loads, so that it never waits."""
    staged, stages = producer.staged, producer.staged.stages
    plgpu.barrier_arrive(producer.go)

    def k_step(k, carry):
        slot = jax.lax.rem(gemm * k_steps + k, stages)
        _landed(staged, slot)
        plgpu.barrier_arrive(producer.free.at[slot])
        return carry

    jax.lax.fori_loop(0, k_steps, k_step, None)
