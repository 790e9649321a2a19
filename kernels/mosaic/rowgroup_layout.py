"""The persistent kernels launched as ONE CLUSTER PER ROW GROUP: no grid-wide barrier.

In both persistent kernels (`persistent_forward`, `persistent_backward`) every read of block
``(r, g)`` is row-group-local: its A rows are row block r of the phase's state (forward) or
of the layer above's d_scaled (backward), written by the blocks ``(r, 0 .. C - 1)``. So the
blocks of one row group need a barrier between phases, and blocks of different row groups
never wait for each other. This layout launches a grid of ``R`` clusters of ``C`` blocks
(axes "r" and "g", the names the kernels read) and meets at a hardware cluster barrier
(`grid_barrier.cluster_barrier`, two by phase parity), which cannot time out: the hardware
schedules a cluster's blocks together. ``C`` is at most `MAX_CLUSTER` (an H100's largest,
non-portable cluster).

Compiled, each barrier is fenced like the grid barrier (``fence.proxy.async.global`` after
the phase's TMA stores, before the arrive, and after the wait): the phases' data moves by TMA
(the async proxy), the barrier by mbarrier operations. GPU interpret mode runs the grid's
clusters one after another, each cluster's blocks at once: the layout as a GPU would run it
(in some order of clusters), with the race detector on, and no fence (no inline PTX there).

The same three functions as `grid_barrier` (`launch`, `block_index`, `make_barrier`), picked
by the kernels' ``layout`` argument (`functions`). Whether it is faster (a cluster barrier
against the grid's semaphores; TMA multicast of the A rows, not implemented here) only a GPU
can say: `rhhjax.ops.persistent_cost` predicts it.
"""

from __future__ import annotations

from typing import Any

import jax
from rhhjax.kernels.mosaic import grid_barrier
from rhhjax.kernels.mosaic.plan import PersistentPlan, PlanError

LAYOUTS = ("grid", "rowgroup")
MAX_CLUSTER = 16  # an H100's largest (non-portable) cluster
ROW, COL = "r", "g"


def check(plan: PersistentPlan, layout: str, interpret: Any) -> None:
    """One-line PlanError unless ``layout`` is known and can run ``plan`` (rowgroup: at most
    MAX_CLUSTER column blocks; interpreted, one cluster of them at a time)."""
    if layout not in LAYOUTS:
        raise PlanError(f"persistent layout {layout!r} is not one of {LAYOUTS}")
    if layout == "grid":
        if interpret is not None:
            plan.check_interpretable()
        return
    if plan.col_blocks > MAX_CLUSTER:
        raise PlanError(
            f"persistent layout 'rowgroup' needs at most {MAX_CLUSTER} column blocks (one "
            f"cluster per row group), got {plan.col_blocks}: use layout 'grid'"
        )
    if interpret is not None:
        from rhhjax.kernels.mosaic import interpret as gpu_interpret

        reason = gpu_interpret.cluster_too_large(plan.col_blocks)
        if reason is not None:
            raise PlanError(
                f"persistent layout 'rowgroup' with {plan.col_blocks} columns: {reason}"
            )


def launch(grid: tuple[int, int], names: tuple[str, str], interpret: Any) -> tuple[dict, dict]:
    """(the ``plgpu.kernel`` launch arguments, the extra scratch) of ``grid`` = (R, C): R
    clusters of C blocks, and the two cluster barriers ``phase_bar``."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    del interpret  # the same launch compiled and interpreted
    n_r, n_c = grid
    bar = plgpu.ClusterBarrier(collective_axes=(names[1],), num_barriers=2)
    layout = dict(grid=(n_r,), grid_names=(names[0],), cluster=(n_c,), cluster_names=(names[1],))
    return layout, dict(phase_bar=bar)


def block_index(grid: tuple[int, int], names: tuple[str, str], phase_bar=None) -> tuple:
    """The block's (row group, column block)."""
    del grid, phase_bar
    return jax.lax.axis_index(names[0]), jax.lax.axis_index(names[1])


def make_barrier(blocks: int, is_leader, spin_limit: int, phase_bar=None, interpret=None):
    """``barrier(index) -> True``: the cluster barrier of the index's parity, fenced when
    compiled. ``blocks``, ``is_leader``, ``spin_limit``: unused (the grid barrier's)."""
    del blocks, is_leader, spin_limit

    def barrier(index):
        if interpret is None:
            grid_barrier._fence_proxy_async_global()
        passed = grid_barrier.cluster_barrier(phase_bar.at[jax.lax.rem(index, 2)])
        if interpret is None:
            grid_barrier._fence_proxy_async_global()
        return passed

    return barrier


def functions(layout: str, interpret: Any):
    """(launch, block_index, make_barrier) of ``layout``, each with `grid_barrier`'s
    signature."""
    if layout == "grid":
        return grid_barrier.launch, grid_barrier.block_index, grid_barrier.make_barrier

    def barrier(blocks, is_leader, spin_limit, phase_bar=None):
        return make_barrier(blocks, is_leader, spin_limit, phase_bar, interpret)

    return launch, block_index, barrier
