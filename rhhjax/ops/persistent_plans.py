"""Which `PersistentPlan` a [batch, width] recurrence runs on an H100 (`plan_for`)."""

from __future__ import annotations

import functools

from rhhjax.kernels.hardware import H100
from rhhjax.kernels.mosaic import persistent_backward as pb
from rhhjax.kernels.mosaic import rowgroup_layout
from rhhjax.kernels.mosaic.plan import PersistentPlan, PlanError

UNITS = (16, 32, 64)  # units per block tried (uint8 mask tiles: TMA rows of 16-byte multiples)
K_CHUNK = 64  # K per pipeline stage
STAGES = (4, 3, 2)  # pipeline depths tried, deepest first, until shared memory fits
MIN_BLOCKS = 16  # `plan_for` takes the fewest blocks at or above this


@functools.cache
def plan_for(batch: int, width: int, dtype_name: str, layout: str = "grid") -> PersistentPlan:
    """Of `candidates`: the most row blocks, then the fewest blocks >= MIN_BLOCKS (else the
    most), then the fewest padded units; PlanError (one line) if none fits."""
    plans = list(candidates(batch, width, dtype_name, layout))
    if not plans:
        raise PlanError(_no_plan(batch, width, dtype_name, layout))
    rows = max(plan.row_blocks for plan in plans)
    widest = [plan for plan in plans if plan.row_blocks == rows]
    enough = [plan for plan in widest if plan.grid >= MIN_BLOCKS]
    if enough:
        return min(enough, key=lambda plan: (plan.grid, plan.n_pad))
    return min(widest, key=lambda plan: (-plan.grid, plan.n_pad))


def _no_plan(batch: int, width: int, dtype_name: str, layout: str) -> str:
    other = "rowgroup" if layout == "grid" else "grid"
    fix = f"layout {other!r}" if any(candidates(batch, width, dtype_name, other)) else ""
    blocks = f"at most {H100.sms} co-resident blocks"
    if layout != "grid":
        blocks = f"clusters of at most {rowgroup_layout.MAX_CLUSTER} blocks"
    return (
        f"no persistent plan fits an H100 for batch {batch}, width {width} ({dtype_name}) in "
        f"layout {layout!r}: {blocks} of up to {max(UNITS)} units and 256 rows; "
        f"use {fix or 'a smaller batch or width'}"
    )


def candidates(batch: int, width: int, dtype_name: str, layout: str = "grid"):
    """Plans of 1 .. ceil(batch / 64) row blocks and UNITS units a block at their deepest
    STAGES (`_deepest`) that ``layout`` runs; row groups also at K chunks of 32 and 16."""
    k_chunks = (K_CHUNK,) if layout == "grid" else (K_CHUNK, K_CHUNK // 2, K_CHUNK // 4)
    for row_blocks in range(1, -(-batch // 64) + 1):
        for units in UNITS:
            for k_chunk in k_chunks:
                plan = _deepest(batch, width, dtype_name, row_blocks, units, k_chunk, layout)
                if plan is not None and _runs_in(plan, layout):
                    yield plan
                    break


def _runs_in(plan: PersistentPlan, layout: str) -> bool:
    try:
        rowgroup_layout.check(plan, layout, None)
    except PlanError:
        return False
    return True


def check_runnable(plan: PersistentPlan, layout: str = "grid") -> None:
    """PlanError (one line) unless both kernels accept ``plan``'s blocks (not co-residency:
    `rowgroup_layout.check`)."""
    plan.check(layout)
    pb.check_plan(plan, layout=layout)


def plan_with_units(plan: PersistentPlan, units: int, layout: str) -> PersistentPlan | None:
    """``plan``'s rows and K chunk at ``units`` units per block (`_deepest`), or None."""
    args = (plan.batch, plan.width, plan.dtype, plan.row_blocks, units, plan.k_chunk, layout)
    return _deepest(*args)


def _deepest(batch, width, dtype_name, row_blocks, units, k_chunk, layout) -> PersistentPlan | None:
    """The fewest column blocks for ``units`` that keep the K extents on written columns
    (forward ``k_pad <= n_pad``; backward ``2 * n_pad`` whole chunks), at the deepest STAGES
    both kernels accept, or None."""
    col_blocks = -(-width // units)
    while (col_blocks * units < -(-width // k_chunk) * k_chunk) or (
        2 * col_blocks * units % k_chunk
    ):
        col_blocks += 1
    for stages in STAGES:
        plan = PersistentPlan(
            batch, width, dtype_name, col_blocks=col_blocks, row_blocks=row_blocks,
            k_chunk=k_chunk, stages=stages, units=units,
        )  # fmt: skip
        try:
            check_runnable(plan, layout)
        except PlanError:
            continue
        return plan
    return None
