"""A self-resetting grid barrier for persistent Mosaic GPU kernels, with a bounded spin.

A persistent kernel (`kernels/mosaic/persistent_forward.py`,
`kernels/mosaic/persistent_backward.py`) runs every block of its grid at once and meets at a
barrier between phases. JAX 0.10.2 allocates grid-wide semaphores only with
``pl.get_global``, which PERSISTS across kernel calls (``run_scoped`` semaphores are
block-local), so a barrier built on monotonic counters would
start the next call where the last one ended. This barrier leaves every semaphore at zero
when a call finishes, so each call starts from the state the first one saw:

* ``arrive``: every block adds 1 (a release add) after its phase's writes.
* Block 0 (the leader) waits until ``arrive >= grid`` and takes ``grid`` off it
  (decrement), then adds ``grid`` tokens to ``go[phase % 2]`` (a release add).
* Every block (the leader too) waits until ``go[phase % 2] >= 1`` and takes one token.

Two ``go`` semaphores, by phase parity: a block that has passed barrier ``p`` and reaches
``p + 1`` waits on the other semaphore, so it cannot take a token meant for a slower block
still leaving ``p``; by the time the leader releases ``p + 1`` (every block has arrived
there) every token of ``p - 1`` is taken. Ordering: a block's writes happen before its
release add; the leader's acquire and release, then the waiter's acquire, chain them to
every reader (the PTX memory model's causality order is transitive).

Bounded spin: before each wait, one thread reads the semaphore (an acquire load) up to
``spin_limit`` times. If the count is still short, the block gives up: the barrier returns
False, the caller writes the phase into its status output and skips the rest of its work,
and the wrapper turns a non-zero status into one error line (`check_status`) instead of a
hang. After a timeout the semaphores are left non-zero: the process must restart before the
next persistent call, which the error line says. Every thread of the warpgroup spins on its
own reads; the counts they wait for only grow until the block itself takes its token, so
they agree, except if a token arrives just as the threads reach ``spin_limit`` (a phase of
seconds): then some threads may pass and some give up, and the warpgroup could hang after
all. When blocks are not co-resident the token never comes and every thread gives up.

Async-proxy fences: the phases' data moves by TMA (the async proxy), the semaphores by
ordinary atomics (the generic proxy). ``fence.proxy.async.global`` after a block's TMA
stores have completed and before its arrive, and again after the wait before its next TMA
loads, orders the two (`_fence_proxy_async_global`).

The semaphore barrier runs on a Hopper GPU only. It lowers and compiles for an H100 on a CPU
host with the CUDA plugin (tests/test_kernels_mosaic_grid_barrier.py); whether it performs as
hoped, only a GPU can say.

GPU interpret mode (`kernels/mosaic/interpret.py`, jax >= 0.11.2) cannot run it: it allocates no
``pl.get_global`` semaphores, runs no inline PTX (the fence), and runs the grid's blocks one
after another, so a block waiting for another would wait forever. There a persistent kernel
launches its whole grid as ONE cluster (`launch`), whose blocks the interpreter runs at once,
and meets at a ``plgpu.ClusterBarrier`` instead (`make_barrier`, `cluster_barrier`: every
block arrives, then waits for all). Same phases, same data flow through global memory; only
the barrier differs, and the race detector checks that it orders every phase's writes before
the next phase's reads. Two details, both found by that race detector on a 2 x 4 grid:

* The cluster has ONE axis (`CLUSTER_AXIS`, the blocks in row-major order; `block_index`
  gives the grid coordinates back): a cluster barrier collective over two axes only orders
  the blocks that share a row or a column, not the whole grid.
* Two cluster barriers, by phase parity, as the semaphore barrier has two ``go``
  semaphores: an mbarrier counts arrivals, so a block already past barrier ``p`` arriving
  at ``p + 1`` on the same mbarrier would count towards ``p`` for a block still waiting
  there. On alternate barriers it cannot; arriving at ``p + 2`` needs every block past
  ``p + 1``, hence done arriving at ``p``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

# A spin of this many acquire loads (each an L2 round trip, ~0.5-1 us) is seconds: far
# beyond any legitimate phase, short enough that a non-co-resident grid fails rather than
# hangs.
DEFAULT_SPIN_LIMIT = 4_000_000
MEMORY_SCOPE = "gpu"


class GridBarrierTimeout(RuntimeError):
    """A persistent kernel's grid barrier gave up (blocks not co-resident, or a hang)."""


def semaphores():
    """The barrier's grid-wide semaphores: (arrive, go [2]); call once in the kernel body."""
    arrive = pl.get_global(plgpu.SemaphoreType.REGULAR)
    go = pl.get_global(plgpu.SemaphoreType.REGULAR((2,)))
    return arrive, go


def _fence_proxy_async_global() -> None:
    """``fence.proxy.async.global``: orders generic-proxy and async-proxy (TMA) accesses to
    global memory by this thread."""

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


def _bounded_spin(sem, target, spin_limit) -> jax.Array:
    """Reads ``sem`` until it is >= ``target`` or ``spin_limit`` reads; True when reached."""

    def short(count_and_value):
        count, value = count_and_value
        return jnp.logical_and(value < target, count < spin_limit)

    def read_again(count_and_value):
        count, _ = count_and_value
        return count + 1, pl.semaphore_read(sem)

    _, value = jax.lax.while_loop(short, read_again, (jnp.int32(0), pl.semaphore_read(sem)))
    return value >= target


def grid_barrier(
    arrive,
    go,
    phase,
    grid: int,
    is_leader,
    active=True,
    spin_limit: int = DEFAULT_SPIN_LIMIT,
) -> jax.Array:
    """The barrier ending ``phase`` (an int32 scalar); True when passed, False on a timeout
    or when ``active`` is False (a block that gave up earlier: it neither arrives nor waits,
    so the others give up at this barrier too).

    Call it from every block of a ``grid``-block kernel, after the phase's TMA stores have
    been waited for (`plgpu.wait_smem_to_gmem(0)`), with ``is_leader`` true in exactly one
    block. The next phase's TMA loads may start when it returns True.
    """
    active = jnp.asarray(active, jnp.bool_)
    go_now = go.at[jax.lax.rem(phase, 2)]

    @pl.when(active)
    def _arrive():
        _fence_proxy_async_global()
        plgpu.semaphore_signal(arrive, 1, memory_scope=MEMORY_SCOPE)

    @pl.when(jnp.logical_and(active, is_leader))
    def _release():
        @pl.when(_bounded_spin(arrive, grid, spin_limit))
        def _():
            plgpu.semaphore_wait(arrive, grid, decrement=True, memory_scope=MEMORY_SCOPE)
            plgpu.semaphore_signal(go_now, grid, memory_scope=MEMORY_SCOPE)

    limit = jnp.where(active, jnp.int32(spin_limit), jnp.int32(0))
    passed = jnp.logical_and(active, _bounded_spin(go_now, 1, limit))

    @pl.when(passed)
    def _take_token():
        plgpu.semaphore_wait(go_now, 1, decrement=True, memory_scope=MEMORY_SCOPE)
        _fence_proxy_async_global()

    return passed


CLUSTER_AXIS = "block"  # the one axis of an interpreted persistent kernel's cluster


def cluster_barrier(bar) -> jax.Array:
    """Every block of the cluster arrives at ``bar`` (a ``plgpu.ClusterBarrier`` collective
    over the cluster's one axis), then waits until all have; returns True (it cannot time
    out)."""
    plgpu.barrier_arrive(bar)
    plgpu.barrier_wait(bar)
    return jnp.bool_(True)


def launch(grid: tuple[int, ...], names: tuple[str, ...], interpret: Any) -> tuple[dict, dict]:
    """(the ``plgpu.kernel`` launch arguments, the extra scratch) of a persistent kernel of
    ``grid`` blocks with axis ``names``: compiled, a grid of blocks (semaphore barrier);
    interpreted (``interpret`` not None), ONE cluster of all the blocks on one axis,
    `CLUSTER_AXIS`, and two cluster barriers ``phase_bar`` (`make_barrier`). Read the block's
    coordinates with `block_index`."""
    if interpret is None:
        return dict(grid=grid, grid_names=names), {}
    bar = plgpu.ClusterBarrier(collective_axes=(CLUSTER_AXIS,), num_barriers=2)
    return dict(cluster=(math.prod(grid),), cluster_names=(CLUSTER_AXIS,)), dict(phase_bar=bar)


def block_index(grid: tuple[int, ...], names: tuple[str, ...], phase_bar=None) -> tuple:
    """The block's coordinates along ``names`` (a grid of shape ``grid`` launched by
    `launch`): its grid axes, or interpreted (``phase_bar`` given) its row-major index on the
    cluster's one axis unravelled."""
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
    """The kernel's barrier between phases, ``barrier(index) -> passed``, with ``index``
    0, 1, 2, ... in order: the grid barrier on its semaphores (`semaphores`,
    `grid_barrier`), or with ``phase_bar`` (the scratch that `launch` adds in interpret
    mode) the cluster barrier of the index's parity. Call once in the kernel body."""
    if phase_bar is not None:
        return lambda index: cluster_barrier(phase_bar.at[jax.lax.rem(index, 2)])
    arrive, go = semaphores()

    def barrier(index):
        return grid_barrier(arrive, go, index, blocks, is_leader, spin_limit=spin_limit)

    return barrier


def raise_if_timed_out(status, name: str) -> None:
    """Raises `GridBarrierTimeout` (one line) when any entry of a kernel's ``status``
    [grid] int32 is non-zero: 1 + the index of the barrier a block gave up at (barrier 0
    ends the prologue, barrier i the i-th phase)."""
    import numpy as np

    values = np.asarray(status)
    if values.any():
        blocks = np.flatnonzero(values)
        raise GridBarrierTimeout(
            f"{name}: grid barrier timed out in {blocks.size} of {values.size} blocks "
            f"(first at barrier {int(values[blocks[0]]) - 1}): the blocks were not all "
            "resident at once, or one hung; restart the process before the next "
            "persistent call (the barrier's semaphores are left non-zero)"
        )


def check_status(status: jax.Array, name: str) -> None:
    """`raise_if_timed_out` on the kernel's ``status`` output, as a host callback inside the
    traced computation. Only when jax's default backend is a GPU: a host callback needs the
    backend it runs on, so a step lowered for a GPU on a CPU host (the deviceless compile
    report) carries no check."""
    if jax.default_backend() == "gpu":
        jax.debug.callback(raise_if_timed_out, status, name)
