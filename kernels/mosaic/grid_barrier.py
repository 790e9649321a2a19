"""A self-resetting grid barrier for persistent Mosaic GPU kernels, with a bounded spin.

A persistent kernel (`kernels/mosaic/persistent_forward.py`,
`kernels/mosaic/persistent_backward.py`) runs every block of its grid at once and meets at a
barrier between phases. JAX allocates grid-wide semaphores only with ``pl.get_global``,
which PERSISTS across kernel calls, so the barrier must leave its counter as each call
found it. It is the sign-flip barrier of CUDA's cooperative groups (`grid.sync()`), on ONE
32-bit counter:

* Arriving, a block adds `arrival_increment`: the leader (one block) 2**31 - (grid - 1),
  every other block 1 (a release add, after the phase's writes). A barrier's arrivals sum to
  2**31: the counter's sign bit flips when, and only when, the last block arrives, and its
  low 31 bits end where they began (zero).
* Each block then reads the counter (acquire loads) until its sign differs from the sign
  before this barrier (`has_flipped`). A block knows that sign without reading it again: it
  reads the counter once at the start of the kernel, before its first arrival (the sign
  cannot flip before every block, this one too, has arrived), and the sign alternates from
  barrier to barrier.

No semaphore is decremented, so no block waits on another's compare-and-swap: the barrier it
replaces (block 0 collecting arrivals, then handing every block a token that each took back
with a compare-and-swap loop on one shared word) measured 20.8 us a barrier on an H100
(`results/calibrate_persistent_h100.json`, 2026-11-26, a 64-block grid): one contended
compare-and-swap loop per block, every barrier. A call ends with the counter's low bits
zero, as the next call needs; its sign may differ from the last call's start, which the
next call reads. Ordering: a block's writes happen before its release add; the acquire load
that sees the flip reads the last add of the barrier's release sequence (every add is an
atomic read-modify-write on the counter), so every block's writes happen before the
reader's next phase.

Bounded spin: the counter is read (acquire loads) up to ``spin_limit`` times. If the sign
has not flipped by then, the block gives up: the barrier returns False, the caller writes the
phase into its status output and skips the rest of its work, and the wrapper turns a
non-zero status into one error line (`check_status`) instead of a hang. After a timeout the
counter's low bits are left non-zero: the process must restart before the next persistent
call, which the error line says. Every thread of the warpgroup spins on its own reads; once
flipped, the sign stays so until this block itself arrives at the next barrier, so they
agree, except if the flip comes just as the threads reach ``spin_limit`` (a phase of
seconds): then some threads may pass and some give up, and the warpgroup could hang after
all. When blocks are not co-resident the flip never comes and every thread gives up.

Async-proxy fences: the phases' data moves by TMA (the async proxy), the counter by
ordinary atomics (the generic proxy). ``fence.proxy.async.global`` after a block's TMA
stores have completed and before its arrive, and again after the wait before its next TMA
loads, orders the two (`_fence_proxy_async_global`).

The semaphore barrier runs on a Hopper GPU only. It lowers and compiles for an H100 on a CPU
host with the CUDA plugin (tests/test_kernels_mosaic_grid_barrier.py); its counter
arithmetic is checked on a CPU against every arrival order (`arrival_increment`,
`has_flipped`); on an H100 (2026-11-26) it held with one block on every SM for 700 phases
and measured 1.03 us a barrier at 64 blocks (results/gpu_h100_2026-11-26b.md).

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
* Two cluster barriers, by phase parity: an mbarrier counts arrivals, so a block already
  past barrier ``p`` arriving at ``p + 1`` on the same mbarrier would count towards ``p``
  for a block still waiting there. On alternate barriers it cannot; arriving at ``p + 2``
  needs every block past ``p + 1``, hence done arriving at ``p``.
"""

from __future__ import annotations

import functools
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
    """The barrier's grid-wide counter (one int32 semaphore); call once in the kernel body."""
    return pl.get_global(plgpu.SemaphoreType.REGULAR)


def arrival_increment(grid: int, is_leader: bool) -> int:
    """What a block adds to the counter on arriving (an int32 holding the bits of a uint32
    add): 2**31 - (grid - 1) for the leader, 1 for every other block; ``grid`` blocks'
    arrivals sum to 2**31 (mod 2**32)."""
    if grid < 1:
        raise ValueError(f"grid={grid}: a barrier needs at least one block")
    if not is_leader:
        return 1
    leader = (2**31 - (grid - 1)) % 2**32
    return leader - 2**32 if leader >= 2**31 else leader  # the same 32 bits as an int32


def has_flipped(value, sign_before):
    """True when the counter ``value`` (int32) has a sign other than ``sign_before`` (True:
    negative, the sign bit set): every block has arrived at the barrier."""
    return (value < 0) != sign_before


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


def _arrive(counter, increment: int) -> None:
    """This block's writes so far, then its release add of ``increment`` to ``counter``."""
    _fence_proxy_async_global()
    plgpu.semaphore_signal(counter, increment, memory_scope=MEMORY_SCOPE)


def _spin_until_flipped(counter, sign_before, spin_limit) -> jax.Array:
    """Reads ``counter`` until its sign differs from ``sign_before`` or ``spin_limit``
    reads; True when it flipped."""

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
    """The barrier ending ``phase`` (an int32 scalar, 0, 1, 2, ... in order); True when
    passed, False on a timeout or when ``active`` is False (a block that gave up earlier: it
    neither arrives nor waits, so the others give up at this barrier too). ``start_sign``:
    the counter's sign read at the kernel's start, before the block's first arrival.

    Call it from every block of a ``grid``-block kernel, after the phase's TMA stores have
    been waited for (`plgpu.wait_smem_to_gmem(0)`), with ``is_leader`` true in exactly one
    block. The next phase's TMA loads may start when it returns True.
    """
    active = jnp.asarray(active, jnp.bool_)
    sign_before = jnp.logical_xor(start_sign, jax.lax.rem(phase, 2) == 1)

    # The increment must be a constant of the kernel: one branch each.
    leads = jnp.logical_and(active, is_leader)
    follows = jnp.logical_and(active, jnp.logical_not(is_leader))
    pl.when(leads)(functools.partial(_arrive, counter, arrival_increment(grid, True)))
    pl.when(follows)(functools.partial(_arrive, counter, arrival_increment(grid, False)))

    limit = jnp.where(active, jnp.int32(spin_limit), jnp.int32(0))
    passed = jnp.logical_and(active, _spin_until_flipped(counter, sign_before, limit))
    pl.when(passed)(_fence_proxy_async_global)
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
    0, 1, 2, ... in order: the grid barrier on its counter (`semaphores`,
    `grid_barrier`), or with ``phase_bar`` (the scratch that `launch` adds in interpret
    mode) the cluster barrier of the index's parity. Call once in the kernel body."""
    if phase_bar is not None:
        return lambda index: cluster_barrier(phase_bar.at[jax.lax.rem(index, 2)])
    counter = semaphores()
    start_sign = pl.semaphore_read(counter) < 0  # before this block's first arrival

    def barrier(index):
        return grid_barrier(counter, start_sign, index, blocks, is_leader, spin_limit=spin_limit)

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
            "persistent call (the barrier's counter is left non-zero)"
        )


def check_status(status: jax.Array, name: str) -> None:
    """`raise_if_timed_out` on the kernel's ``status`` output, as a host callback inside the
    traced computation. Only when jax's default backend is a GPU: a host callback needs the
    backend it runs on, so a step lowered for a GPU on a CPU host (the deviceless compile
    report) carries no check."""
    if jax.default_backend() == "gpu":
        jax.debug.callback(raise_if_timed_out, status, name)
