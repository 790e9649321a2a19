"""A self-resetting sign-flip grid barrier (CUDA cooperative groups' scheme) on one int32
semaphore, with a bounded spin that reports a give-up in ``status``; in GPU interpret mode a
cluster barrier. Design: docs/design.md (module notes)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

# Acquire loads before giving up: seconds, beyond any legitimate phase.
DEFAULT_SPIN_LIMIT = 4_000_000
MEMORY_SCOPE = "gpu"


class GridBarrierTimeout(RuntimeError):
    """A persistent kernel's grid barrier gave up."""


def semaphores():
    """The barrier's grid-wide counter; call once in the kernel body."""
    return pl.get_global(plgpu.SemaphoreType.REGULAR)


def arrival_increment(grid: int, is_leader: bool) -> int:
    """The int32 a block adds on arriving: 2**31 - (grid - 1) for the leader, else 1."""
    if grid < 1:
        raise ValueError(f"grid={grid}: a barrier needs at least one block")
    if not is_leader:
        return 1
    leader = (2**31 - (grid - 1)) % 2**32
    return leader - 2**32 if leader >= 2**31 else leader


def has_flipped(value, sign_before):
    """Whether the counter's sign differs from ``sign_before``: every block has arrived."""
    return (value < 0) != sign_before


def fence_proxy_async_global() -> None:
    """``fence.proxy.async.global``: orders generic- and async-proxy (TMA) global accesses."""

    @plgpu.inline_mgpu()
    def fence(ctx):
        del ctx
        from jax._src.lib.mlir import ir
        from jax._src.lib.mlir.dialects import llvm

        llvm.inline_asm(
            ir.Type.parse("!llvm.void"), [], "fence.proxy.async.global;", "",
            has_side_effects=True,
        )  # fmt: skip

    fence()


def _arrive(counter, increment: int) -> None:
    fence_proxy_async_global()
    plgpu.semaphore_signal(counter, increment, memory_scope=MEMORY_SCOPE)


def _spin_until_flipped(counter, sign_before, spin_limit) -> jax.Array:
    """Reads ``counter`` until its sign flips or ``spin_limit`` reads; whether it flipped."""

    def waiting(count_and_value):
        count, value = count_and_value
        return jnp.logical_and(jnp.logical_not(has_flipped(value, sign_before)), count < spin_limit)

    def read_again(count_and_value):
        count, _ = count_and_value
        return count + 1, pl.semaphore_read(counter)

    _, value = jax.lax.while_loop(waiting, read_again, (jnp.int32(0), pl.semaphore_read(counter)))
    return has_flipped(value, sign_before)


def grid_barrier(
    counter,
    start_sign,
    phase,
    grid: int,
    is_leader,
    active=True,
    spin_limit: int = DEFAULT_SPIN_LIMIT,
) -> jax.Array:
    """The barrier ending ``phase`` (0, 1, 2, ... in order): whether passed. Call from every
    block after its TMA stores have completed, ``is_leader`` in exactly one block; an
    inactive block (one that gave up) neither arrives nor waits."""
    active = jnp.asarray(active, jnp.bool_)
    sign_before = jnp.logical_xor(start_sign, jax.lax.rem(phase, 2) == 1)

    # The increment must be a kernel constant: one branch each.
    leads = jnp.logical_and(active, is_leader)
    follows = jnp.logical_and(active, jnp.logical_not(is_leader))
    pl.when(leads)(functools.partial(_arrive, counter, arrival_increment(grid, True)))
    pl.when(follows)(functools.partial(_arrive, counter, arrival_increment(grid, False)))

    limit = jnp.where(active, jnp.int32(spin_limit), jnp.int32(0))
    passed = jnp.logical_and(active, _spin_until_flipped(counter, sign_before, limit))
    pl.when(passed)(fence_proxy_async_global)
    return passed


CLUSTER_AXIS = "block"


def cluster_barrier(bar) -> jax.Array:
    """Arrive at ``bar``, wait for the cluster; True."""
    plgpu.barrier_arrive(bar)
    plgpu.barrier_wait(bar)
    return jnp.bool_(True)


def launch(
    grid: tuple[int, ...], names: tuple[str, ...], interpret: Any, cluster_rows: bool = False
) -> tuple[dict, dict]:
    """(``plgpu.kernel`` launch arguments, extra scratch): a grid compiled (with
    ``cluster_rows``, of (rows, cols): one cluster of the rows per column), or interpreted
    one cluster of all blocks on `CLUSTER_AXIS` with two cluster barriers ``phase_bar``."""
    if interpret is None and cluster_rows:
        (n_r, n_c), (row, col) = grid, names
        return dict(grid=(n_c,), grid_names=(col,), cluster=(n_r,), cluster_names=(row,)), {}
    if interpret is None:
        return dict(grid=grid, grid_names=names), {}
    bar = plgpu.ClusterBarrier(collective_axes=(CLUSTER_AXIS,), num_barriers=2)
    return dict(cluster=(math.prod(grid),), cluster_names=(CLUSTER_AXIS,)), dict(phase_bar=bar)


def block_index(grid: tuple[int, ...], names: tuple[str, ...], phase_bar=None) -> tuple:
    """The block's coordinates along ``names`` under `launch`'s grid or cluster."""
    if phase_bar is None:
        return tuple(jax.lax.axis_index(name) for name in names)
    flat, coords = jax.lax.axis_index(CLUSTER_AXIS), []
    for size in reversed(grid):
        coords.append(jax.lax.rem(flat, size))
        flat = jax.lax.div(flat, size)
    return tuple(reversed(coords))


def make_barrier(
    blocks: int, is_leader, spin_limit: int, phase_bar=None
) -> Callable[[jax.Array], jax.Array]:
    """``barrier(index) -> passed``: the grid barrier, or with ``phase_bar`` (interpret
    mode) the cluster barrier of the index's parity. Call once in the kernel body."""
    if phase_bar is not None:
        return lambda index: cluster_barrier(phase_bar.at[jax.lax.rem(index, 2)])
    counter = semaphores()
    start_sign = pl.semaphore_read(counter) < 0  # before the first arrival

    def barrier(index):
        return grid_barrier(counter, start_sign, index, blocks, is_leader, spin_limit=spin_limit)

    return barrier


def raise_if_timed_out(status, name: str) -> None:
    """Raises `GridBarrierTimeout` when ``status`` [grid] has a non-zero entry (1 + the
    barrier index a block gave up at)."""
    import numpy as np

    values = np.asarray(status)
    if values.any():
        blocks = np.flatnonzero(values)
        raise GridBarrierTimeout(
            f"{name}: grid barrier timed out in {blocks.size} of {values.size} blocks "
            f"(first at barrier {int(values[blocks[0]]) - 1}): the blocks were not all "
            "resident at once, or one hung; restart the process before the next "
            "persistent call (the barrier's counter is left non-zero)"
        )


def check_status(status: jax.Array, name: str) -> None:
    """`raise_if_timed_out` as a host callback, on a GPU backend only (a deviceless lowering
    carries no check)."""
    if jax.default_backend() == "gpu":
        jax.debug.callback(raise_if_timed_out, status, name)
