"""GPU interpret mode for the Mosaic GPU kernels: the real kernels executed on a CPU.

jax >= 0.11.2 (0.11.2 and 0.12.0.1 tried) runs a Mosaic GPU kernel on a CPU when
``plgpu.kernel`` gets ``interpret=plgpu.InterpretGPUParams(...)``: it simulates global and
shared memory, TMA copies, wgmma, mbarriers and cluster barriers, runs each warpgroup of a
cluster as a thread, and its race detector (``detect_races=True``) raises on two accesses to
the same memory that no barrier orders, one of them a write. Every kernel here takes
``interpret=`` and passes it on (`params` builds it); `rhhjax.ops.mosaic` and
`rhhjax.ops.persistent` use it for ``model.pallas_mode="interpret"``.

What the interpreter cannot run, and how the kernels meet it:

* ``pl.program_id`` reads 0 in every block there, so the kernels name their grid axes and
  read ``jax.lax.axis_index(name)`` (the same lowering on a GPU, jax 0.10.2 included).
* It runs the grid's points one after another; only the blocks of ONE cluster run at
  once. It allocates no ``pl.get_global`` semaphores and runs no inline PTX. So the
  persistent kernels' grid barrier (`kernels/mosaic/grid_barrier.py`) cannot run there: in
  interpret mode they launch the whole grid as one cluster and meet at a
  ``plgpu.ClusterBarrier`` instead (`grid_barrier.launch`), at most `max_blocks` blocks.
* Each block of a cluster of two or more is a thread that runs its own XLA computation,
  and a block waiting at a barrier holds a thread of XLA's CPU client pool (one thread per
  core unless the ``NPROC`` environment variable says otherwise, read when jax starts), as
  does the computation that launched the kernel. With fewer pool threads than blocks + 1
  the blocks wait for each other forever, so `max_blocks` is the pool's size - 1 (one block
  needs no thread of its own), and at most `MAX_BLOCKS` (32 blocks hung on the 2-core CPU
  even with ``NPROC=64``; 24 ran).
* The race detector's vector clocks give TMA copies a clock each, handed out round-robin
  from ``num_tma_threads_per_device`` (5 by default) in the order the blocks' threads issue
  them. Two copies that share a clock can order one before another block's access and hide
  a race, depending on how the threads interleave (a CI run missed a race that every local
  run reported). `params` asks for `TMA_CLOCKS`: a cluster that issues at most that many
  copies gives each its own clock, so whether a race shows no longer depends on scheduling
  (the tests that inject a race check that their kernels stay under it). Larger runs reuse
  clocks past that count and can still miss a race.
* Nothing is timed: a CPU simulation says nothing about speed, co-residency or the GPU's
  memory model beyond the happens-before order that the race detector checks.

jax 0.10.2 has no public GPU interpret mode (its private interpreter cannot run these
kernels): `unavailable` says so in one line.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
from jax.experimental.pallas import mosaic_gpu as plgpu

MIN_JAX = "0.11.2"  # the oldest release seen with plgpu.InterpretGPUParams (0.10.2 lacks it)
TMA_CLOCKS = 256  # TMA clocks of the race detector (copies of one cluster run up to it exact)
MAX_BLOCKS = 24  # the most blocks of one cluster run here (2-core CPU, NPROC=40, 2026-11-25)


def available() -> bool:
    """Whether the installed jax has GPU interpret mode (``plgpu.InterpretGPUParams``)."""
    return hasattr(plgpu, "InterpretGPUParams")


def unavailable(what: str = "GPU interpret mode") -> str | None:
    """None where GPU interpret mode exists, else one line naming the jax it needs."""
    if available():
        return None
    return (
        f"{what} needs jax >= {MIN_JAX} (GPU interpret mode; jax {jax.__version__} is "
        f"installed): pip install 'jax>={MIN_JAX}' (Python >= 3.12)"
    )


def params(detect_races: bool = True) -> Any:
    """``plgpu.InterpretGPUParams`` for the kernels here: the race detector on by default
    (a race raises) with `TMA_CLOCKS` clocks for TMA copies, uninitialised memory NaN (an
    unwritten output shows), inline PTX an error (nothing is silently skipped). Raises
    RuntimeError (one line) where jax has no GPU interpret mode."""
    reason = unavailable()
    if reason is not None:
        raise RuntimeError(reason)
    fields = {field.name for field in dataclasses.fields(plgpu.InterpretGPUParams)}
    clocks = (
        {"num_tma_threads_per_device": TMA_CLOCKS} if "num_tma_threads_per_device" in fields else {}
    )
    return plgpu.InterpretGPUParams(detect_races=detect_races, inline_mgpu="error", **clocks)


def pool_threads() -> int:
    """Threads of XLA's CPU client pool: ``NPROC`` when set, else the usable cores."""
    try:
        return max(1, int(os.environ["NPROC"]))
    except (KeyError, ValueError):
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1


def max_blocks() -> int:
    """The most blocks of one cluster that interpret mode can run in this process: one, or
    as many as the pool has threads beside the launching computation's."""
    return min(MAX_BLOCKS, max(1, pool_threads() - 1))


def cluster_too_large(blocks: int) -> str | None:
    """None when a cluster of ``blocks`` can run interpreted here, else one line saying why
    (and, where that is the cure, the NPROC to set)."""
    if blocks <= max_blocks():
        return None
    if blocks > MAX_BLOCKS:
        return f"GPU interpret mode runs at most {MAX_BLOCKS} blocks at once, got {blocks}"
    return (
        f"GPU interpret mode runs each of the {blocks} blocks as a thread of XLA's CPU pool "
        f"beside the launching one, and the pool has {pool_threads()} here: start the "
        f"process with NPROC={blocks + 1} in its environment (read when jax starts)"
    )


def reset_state() -> None:
    """Clears the interpreter's global state after a kernel raised (a race, an error), as
    jax asks before the next interpreted kernel in the same process. A private jax function
    (jax 0.11.2, 0.12); a no-op where it is absent."""
    try:
        from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call as ipc
    except ImportError:
        return
    ipc.reset_gpu_interpret_mode_state()
