"""The persistent kernels' phase timeline: each block stamps its progress through each phase
into ``stamps [P, blocks, WORDS]`` int32 and its SM into ``sm [blocks]``. Words 0-1: the
phase's ``%globaltimer`` (ns; low, high) at barrier passed; word 2 + e: ``%clock`` (cycles,
mod 2**32) at event e. In GPU interpret mode a per-block event counter stands in for both
clocks and the block index for the SM. Design: docs/persistent_design.md."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental.pallas import mosaic_gpu as plgpu

EVENTS = (
    "barrier_passed",
    "operands_ready",  # the first K chunk's TMA landed
    "gemm_done",
    "epilogue_done",
    "stores_done",
    "barrier_arrived",
)
WORDS = 2 + len(EVENTS)
_COUNT = WORDS  # the scratch word of the interpreted counter


class Stamps(NamedTuple):
    """A kernel's timeline: stamps [P, blocks, WORDS] int32, sm [blocks] int32."""

    stamps: jax.Array
    sm: jax.Array


def out_types(phases: int, blocks: int) -> list:
    return [
        jax.ShapeDtypeStruct((phases, blocks, WORDS), jnp.int32),
        jax.ShapeDtypeStruct((blocks,), jnp.int32),
    ]


def scratch() -> dict:
    return dict(timeline_row=plgpu.SMEM((WORDS + 1,), jnp.int32))


def _read_clocks(row, word: int, with_timer: bool, with_sm: bool = False) -> None:
    """``row[word] = %clock``; with_timer ``row[0:2] = %globaltimer``; with_sm ``row[WORDS] =
    %smid``."""

    @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),))
    def read(ctx, ref):
        del ctx
        from jax._src.lib.mlir import ir
        from jax._src.lib.mlir.dialects import arith, memref
        from jax.experimental.mosaic.gpu import utils

        i32, i64 = ir.IntegerType.get_signless(32), ir.IntegerType.get_signless(64)

        def store(value, at):
            memref.store(value, ref, [arith.constant(ir.IndexType.get(), at)])

        if with_sm:
            store(utils.smid(), WORDS)
            return
        if with_timer:
            ns = utils.globaltimer()
            store(arith.trunci(i32, ns), 0)
            store(arith.trunci(i32, arith.shrui(ns, arith.constant(i64, 32))), 1)
        store(utils.clock(), word)

    read(row)


class Timeline:
    """A block's stamps: `start` once, `stamp` each event of a phase, then `flush` it; from
    the one warpgroup that runs the phases."""

    def __init__(self, row, stamps_g, sm_g, block, interpret: Any):
        self.row, self.stamps_g, self.sm_g, self.block = row, stamps_g, sm_g, block
        self.interpret = interpret is not None

    def start(self) -> None:
        """The block's SM into ``sm``."""
        if self.interpret:
            self.row[_COUNT] = jnp.int32(0)
            self.sm_g[self.block] = self.block
        else:
            _read_clocks(self.row, 0, False, with_sm=True)
            self.sm_g[self.block] = self.row[WORDS]

    def stamp(self, event: str) -> None:
        e = EVENTS.index(event)
        if not self.interpret:
            _read_clocks(self.row, 2 + e, with_timer=e == 0)
            return
        count = self.row[_COUNT] + 1
        self.row[_COUNT] = count
        self.row[2 + e] = count
        if e == 0:
            self.row[0], self.row[1] = count, jnp.int32(0)

    def flush(self, p) -> None:
        """The phase's words into ``stamps[p, block]``."""
        for word in range(WORDS):
            self.stamps_g[p, self.block, word] = self.row[word]


class Off:
    """No timeline: every call adds nothing to the kernel."""

    def start(self) -> None:
        pass

    def stamp(self, event: str) -> None:
        del event

    def flush(self, p) -> None:
        del p


OFF = Off()


def first_ready(timeline) -> Any:
    """The GEMM's ``first_ready`` hook: None when off."""
    return None if isinstance(timeline, Off) else lambda: timeline.stamp("operands_ready")


def deltas(stamps) -> Any:
    """Host side: [P, blocks, EVENTS] int64 cycles from each phase's barrier passed."""
    import numpy as np

    clocks = np.asarray(stamps)[..., 2:].astype(np.int64)
    return (clocks - clocks[..., :1]) % 2**32


def start_ns(stamps) -> Any:
    """Host side: [P, blocks] int64, each phase's ``%globaltimer`` at barrier passed."""
    import numpy as np

    words = np.asarray(stamps)[..., :2].astype(np.int64) % 2**32
    return words[..., 0] + (words[..., 1] << 32)
