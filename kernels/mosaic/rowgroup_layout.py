"""The persistent kernels launched as one cluster per row group (axes "r", "g"), meeting at
hardware cluster barriers: `grid_barrier`'s functions for ``layout="rowgroup"``."""

from __future__ import annotations

import functools
from typing import Any

import jax
from rhhjax.kernels.mosaic import grid_barrier
from rhhjax.kernels.mosaic.plan import PHASE_BARRIERS, PersistentPlan, PlanError

LAYOUTS = ("grid", "rowgroup")
MAX_CLUSTER = 16  # an H100's largest (non-portable) cluster
ROW, COL = "r", "g"


def check(plan: PersistentPlan, layout: str, interpret: Any) -> None:
    """PlanError unless ``layout`` is known and can run ``plan`` (its co-residency included)."""
    if layout not in LAYOUTS:
        raise PlanError(f"persistent layout {layout!r} is not one of {LAYOUTS}")
    if plan.multicast_a and layout != "rowgroup":
        raise PlanError(f"persistent multicast_a needs layout 'rowgroup', got {layout!r}")
    if plan.multicast_b and layout != "grid":
        raise PlanError(f"persistent multicast_b needs layout 'grid', got {layout!r}")
    if plan.multicast_b and not 2 <= plan.row_blocks <= MAX_CLUSTER:
        raise PlanError(
            f"persistent multicast_b needs 2 to {MAX_CLUSTER} row blocks (a cluster of them), "
            f"got {plan.row_blocks}"
        )
    if layout == "grid":
        plan.check_grid()
        if interpret is not None:
            plan.check_interpretable()
        return
    # No grid <= SMs: clusters never wait for each other, so only a cluster's are co-resident.
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
    """(launch arguments, scratch) of ``grid`` = (R, C): R clusters of C blocks."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    del interpret
    n_r, n_c = grid
    bar = plgpu.ClusterBarrier(collective_axes=(names[1],), num_barriers=PHASE_BARRIERS)
    layout = dict(grid=(n_r,), grid_names=(names[0],), cluster=(n_c,), cluster_names=(names[1],))
    return layout, dict(phase_bar=bar)


def block_index(grid: tuple[int, int], names: tuple[str, str], phase_bar=None) -> tuple:
    del grid, phase_bar
    return jax.lax.axis_index(names[0]), jax.lax.axis_index(names[1])


def make_barrier(blocks: int, is_leader, spin_limit: int, phase_bar=None, interpret=None):
    """``barrier(index) -> True``: the cluster barrier of the index's parity."""
    del blocks, is_leader, spin_limit

    def barrier(index):
        if interpret is None:
            grid_barrier.fence_proxy_async_global()
        passed = grid_barrier.cluster_barrier(phase_bar.at[jax.lax.rem(index, 2)])
        if interpret is None:
            grid_barrier.fence_proxy_async_global()
        return passed

    return barrier


def functions(layout: str, interpret: Any, plan: PersistentPlan | None = None):
    """(launch, block_index, make_barrier) of ``layout`` (the grid's in clusters of a column's
    row blocks where ``plan.multicast_b``)."""
    if layout == "grid":
        grid_launch = grid_barrier.launch
        if plan is not None and plan.multicast_b:
            grid_launch = functools.partial(grid_launch, cluster_rows=True)
        return grid_launch, grid_barrier.block_index, grid_barrier.make_barrier

    def barrier(blocks, is_leader, spin_limit, phase_bar=None):
        return make_barrier(blocks, is_leader, spin_limit, phase_bar, interpret)

    return launch, block_index, barrier
