"""The persistent kernels' plan: the plan `persistent` runs, the runnable plan of the lowest
PREDICTED phase time (`predicted_phase_us` at `Rates`, a model, not a measurement; its rates
are measured on an H100). The step's PREDICTION table per layout that builds on it is a benchmark
program, not part of the library: benchmarks/persistent_prediction.py.
"""

from __future__ import annotations

import dataclasses
import functools

from rhhjax.kernels.hardware import H100
from rhhjax.kernels.mosaic import persistent_backward as pb
from rhhjax.kernels.mosaic import rowgroup_layout
from rhhjax.kernels.mosaic.plan import PersistentPlan, PlanError

UNITS = (16, 32, 64)  # units per block tried (uint8 mask tiles: TMA rows of 16-byte multiples)
K_CHUNK = 64  # K per pipeline stage
STAGES = (4, 3, 2)  # pipeline depths tried, deepest first, until shared memory fits


@dataclasses.dataclass(frozen=True)
class Rates:
    """Machine rates of the prediction model (each an assumption or a measurement, stated)."""

    # Grid barrier, us: the sign-flip barrier (`grid_barrier`) measured alone at a 64-block
    # grid on an H100, 2026-11-26 (results/calibrate_persistent_h100_signflip.json); the
    # token barrier it replaced measured 20.8 us.
    barrier_us: float = 1.03
    tflops_per_sm: float = 798.0 / H100.sms  # measured 8192^3 bf16 matmul rate / SMs
    # L2 read rate, TB/s: the rate the measured forward phase (7.78 us, same file) read its
    # bytes at, refitted (`benchmarks/calibrate_persistent.py` refit). An XLA reduction over
    # a 24 MB L2-resident array measured 0.82-1.56 on the same H100, slower than the kernel.
    l2_tbytes: float = 3.72
    smem_fill_bytes_per_clk: float = 128.0  # assumed per-SM fill rate
    clock_ghz: float = H100.clock_ghz  # measured SM clock (results/gpu_h100.md)


def predicted_phase_us(
    plan: PersistentPlan, rates: Rates | None = None, multicast: int = 1, backward: bool = False
) -> float:
    """PREDICTION (a model, not a measurement) of one main-cell phase, in microseconds:

        barrier + max(GEMM slice at tflops_per_sm, all blocks' L2 bytes at l2_tbytes,
                      one block's ingest at smem_fill_bytes_per_clk * clock)

    at ``rates`` as given (the step's table passes `dtype_rates` for f32); a grid past the
    SMs (row groups) runs in `waves`, each with its barrier, GEMM slice and ingest."""
    rates = rates or Rates()
    turns = waves(plan)
    gemm = turns * plan.flops_per_block(backward) / (rates.tflops_per_sm * 1e12)
    l2 = plan.l2_bytes_per_phase(multicast, backward) / (rates.l2_tbytes * 1e12)
    fill_rate = rates.smem_fill_bytes_per_clk * rates.clock_ghz * 1e9
    fill = turns * plan.ingest_bytes_per_block(backward) / fill_rate
    return turns * rates.barrier_us + 1e6 * max(gemm, l2, fill)


def waves(plan: PersistentPlan) -> int:
    """How many turns the row groups take when not all are resident: clusters of
    ``col_blocks`` at ``sm_count // col_blocks`` at a time (1 where the grid fits the SMs)."""
    if plan.grid <= plan.sm_count:
        return 1
    return -(-plan.row_blocks // max(1, plan.sm_count // plan.col_blocks))


@functools.cache
def plan_for(batch: int, width: int, dtype_name: str, layout: str = "grid") -> PersistentPlan:
    """The kernels' plan for a [batch, width] recurrence: among the plans both kernels can
    run on an H100 (`candidates`), the one of the lowest PREDICTED phase time
    (`predicted_phase_us`, forward + backward at the default, uncalibrated `Rates`: the bf16
    GEMM rate for both dtypes), then the fewest padded units; ``layout`` "rowgroup": among
    the plans of at most `rowgroup_layout.MAX_CLUSTER` column blocks (K chunks of 64, 32 or
    16). Raises PlanError (one line) when none fits."""
    plans = list(candidates(batch, width, dtype_name, layout))
    if not plans:
        other = "rowgroup" if layout == "grid" else "grid"
        fix = "a smaller batch or width"
        if any(candidates(batch, width, dtype_name, other)):
            fix = f"layout {other!r}"
        blocks = f"at most {H100.sms} co-resident blocks"
        if layout != "grid":
            blocks = f"clusters of at most {rowgroup_layout.MAX_CLUSTER} blocks"
        raise PlanError(
            f"no persistent plan fits an H100 for batch {batch}, width {width} ({dtype_name}) "
            f"in layout {layout!r}: {blocks} of up to {max(UNITS)} units and 256 rows; "
            f"use {fix}"
        )

    def cost(plan):
        forward, backward = predicted_phase_us(plan), predicted_phase_us(plan, backward=True)
        return forward + backward, plan.n_pad

    return min(plans, key=cost)


def candidates(batch: int, width: int, dtype_name: str, layout: str = "grid"):
    """Plans of 1 .. ceil(batch / 64) row blocks (no block of padding rows only) and UNITS
    units per block, each with the fewest column blocks that keep the kernels' K extents on
    written columns (forward ``k_pad <= n_pad``; backward ``2 * n_pad`` whole chunks) and
    the deepest pipeline (STAGES) that both kernels' checks accept; ``layout`` "rowgroup":
    those of at most `rowgroup_layout.MAX_CLUSTER` column blocks, at K chunks of 64, 32
    or 16 (the widest that fits)."""
    k_chunks = (K_CHUNK,) if layout == "grid" else (K_CHUNK, K_CHUNK // 2, K_CHUNK // 4)
    for row_blocks in range(1, -(-batch // 64) + 1):
        for units in UNITS:
            for k_chunk in k_chunks:
                plan = _deepest(batch, width, dtype_name, row_blocks, units, k_chunk)
                if plan is not None and _runs_in(plan, layout):
                    yield plan
                    break


def _runs_in(plan: PersistentPlan, layout: str) -> bool:
    try:
        rowgroup_layout.check(plan, layout, None)
    except PlanError:
        return False
    return True


def check_runnable(plan: PersistentPlan) -> None:
    """Raises PlanError (one line) unless both persistent kernels accept ``plan``'s blocks
    (the forward's check, then the backward's: shared memory, K extents); co-residency is the
    layout's (`rowgroup_layout.check`)."""
    plan.check()
    pb.check_plan(plan)


def plan_with_units(plan: PersistentPlan, units: int) -> PersistentPlan | None:
    """``plan``'s rows and K chunk at ``units`` units per block (`_deepest`), or None."""
    return _deepest(plan.batch, plan.width, plan.dtype, plan.row_blocks, units, plan.k_chunk)


def _deepest(batch, width, dtype_name, row_blocks, units, k_chunk) -> PersistentPlan | None:
    """The plan of the fewest column blocks for ``units`` and the deepest STAGES that both
    kernels accept, or None."""
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
            check_runnable(plan)
        except PlanError:
            continue
        return plan
    return None
