"""GPU interpret mode (jax >= 0.11.2): `params` for every kernel's ``interpret=`` (race
detector on), and `max_blocks`, the most blocks one cluster holds at ``NPROC`` threads."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
from jax.experimental.pallas import mosaic_gpu as plgpu

MIN_JAX = "0.11.2"  # the oldest release with plgpu.InterpretGPUParams
TMA_CLOCKS = 256  # race-detector clocks for TMA copies: exact up to this many per cluster
MAX_BLOCKS = 24  # the most blocks of one cluster that ran on a 2-core CPU


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
    """``plgpu.InterpretGPUParams``: races raise, uninitialised memory NaN, inline PTX an
    error. Raises RuntimeError where jax has no GPU interpret mode."""
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
    """The most blocks of one cluster interpret mode can run in this process."""
    return min(MAX_BLOCKS, max(1, pool_threads() - 1))


def cluster_too_large(blocks: int) -> str | None:
    """None when a cluster of ``blocks`` can run interpreted here, else why (and NPROC)."""
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
    """Clears the interpreter's state after a kernel raised (private jax; else a no-op)."""
    try:
        from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call as ipc
    except ImportError:
        return
    ipc.reset_gpu_interpret_mode_state()
