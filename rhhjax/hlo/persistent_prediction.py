"""PREDICTION of a persistent HyperRHN training step, one table: per-phase kernel time,
barrier time, glue time, their sum, for bf16 and f32 and for the layouts weighed.

Every number here is a MODEL, not a measurement:

* kernel time of a main-cell phase: `persistent_cost.predicted_phase_us` less its barrier
  (max of the block's GEMM slice at ``Rates.tflops_per_sm``, all blocks' L2 bytes at
  ``Rates.l2_tbytes``, one block's shared-memory fill); f32 runs TF32 wgmma at HALF the
  bf16 rate (H100 datasheet: 495 vs 989 dense TFLOP/s), which the plan model leaves out;
* barrier time: ``Rates.barrier_us`` per grid-barrier phase (assumed 1 us, not measured),
  ``CLUSTER_BARRIER_US`` per hardware cluster barrier (assumed, not measured);
* the hyper cell: today its own persistent launches, 2 * T * L more barrier-bound phases at
  the hyper plan's predicted phase time; "in the kernel" its GEMMs are spread over the main
  grid one phase ahead of the main cell (forward; one behind in the backward) and share the
  main cell's barriers, adding its FLOP share per block to every main phase;
* glue: the step's HLO bytes under the corrected rule (``bytes_per_train_step_read`` of a
  compile report, `benchmarks/gpu_report.py`, measured without a GPU) at ``HBM_TBYTES``,
  counted serially (every launch's operands and results, the kernels' own inputs and
  outputs included).

    python -m rhhjax.hlo.persistent_prediction [--report results/...json] [--json OUT]
        [--calibration calibrate.json]   # Rates refitted on a GPU (gpu_suite.sh calibrate)
"""

from __future__ import annotations

import dataclasses
import json

from rhhjax.hlo.persistent_cost import Rates, predicted_phase_us
from rhhjax.kernels.hardware import H100
from rhhjax.kernels.mosaic.plan import PersistentPlan, PlanError

HBM_TBYTES = H100.hbm_bytes_per_s / 1e12  # the datasheet's HBM bandwidth, TB/s
CLUSTER_BARRIER_US = 0.3  # assumed hardware cluster barrier (arrive + wait), not measured
TF32_SLOWDOWN = 2.0  # bf16 / TF32 dense wgmma rate on an H100 (datasheet)
DEFAULT_REPORT = "results/gpu_report_persistent_bytes_h100.json"
PAPER = dict(batch=256, width=1000, hyper=128, depth=7, length=100)


@dataclasses.dataclass(frozen=True)
class Layout:
    """One way to run the step: the main plan, TMA multicast of A within a cluster, the
    barrier between phases, and where the hyper cell runs."""

    name: str
    plan: PersistentPlan
    multicast: int
    barrier_us: float
    hyper_in_kernel: bool


def dtype_rates(rates: Rates, dtype: str) -> Rates:
    """``rates`` for ``dtype``: f32 GEMMs at 1 / TF32_SLOWDOWN of the bf16 rate."""
    if dtype == "float32":
        return dataclasses.replace(rates, tflops_per_sm=rates.tflops_per_sm / TF32_SLOWDOWN)
    return rates


def kernel_phase_us(plan: PersistentPlan, rates: Rates, multicast: int, backward: bool) -> float:
    """A main-cell phase without its barrier (us): the plan model's max of GEMM, L2, fill."""
    return predicted_phase_us(plan, rates, multicast, backward) - rates.barrier_us


def hyper_share_us(plan: PersistentPlan, hyper: int, rates: Rates, backward: bool) -> float:
    """The hyper cell's FLOPs per main phase spread over the main grid (us per block):
    its gate GEMM [B, h] x [h, 2h] and the z projection [B, h] x [h, n] (the backward: the
    transposed GEMMs, same FLOPs), divided evenly over ``plan.grid`` blocks."""
    batch = plan.b_pad
    flops = 2 * batch * hyper * 2 * hyper + 2 * batch * hyper * plan.n_pad
    return 1e6 * flops / plan.grid / (rates.tflops_per_sm * 1e12) * (1.0 + backward)


def hyper_launch_phase_us(dtype: str, hyper: int, batch: int, rates: Rates, backward: bool):
    """Today's hyper phase (us, barrier included): the hyper plan ``ops.persistent.plan_for``
    picks for [batch, hyper] at the plan model's prediction."""
    from rhhjax.ops import persistent

    plan = persistent.plan_for(batch, hyper, dtype)
    return predicted_phase_us(plan, rates, backward=backward)


def rowgroup_plan(dtype: str, batch: int, width: int) -> PersistentPlan | None:
    """The plan ``persistent.plan_for`` picks for the row-group clusters (at most 16 column
    blocks), or None when none fits."""
    from rhhjax.ops import persistent

    try:
        return persistent.plan_for(batch, width, dtype, "rowgroup")
    except PlanError:
        return None


def layouts(dtype: str, rates: Rates, batch: int, width: int) -> list[Layout]:
    """The layouts weighed, each named with whether it is built: today's grid, the row-group
    clusters (`kernels/mosaic/rowgroup_layout.py`, ``persistent.LAYOUT = "rowgroup"``), each with
    the hyper cell as its own launches (built) and inside the main kernels (not built), and
    the row-group clusters with TMA multicast of the A rows (not built)."""
    from rhhjax.ops import persistent

    grid = persistent.plan_for(batch, width, dtype)
    out = [
        Layout("grid, hyper as own launches (built: today)", grid, 1, rates.barrier_us, False),
    ]
    rowgroup = rowgroup_plan(dtype, batch, width)
    clusters = None if rowgroup is None else f"row-group clusters of {rowgroup.col_blocks}"
    if rowgroup is not None:
        name = f"{clusters}, hyper as own launches (built)"
        out.append(Layout(name, rowgroup, 1, CLUSTER_BARRIER_US, False))
    out.append(Layout("grid, hyper inside (not built)", grid, 1, rates.barrier_us, True))
    if rowgroup is not None:
        name = f"{clusters}, hyper inside (not built)"
        out.append(Layout(name, rowgroup, 1, CLUSTER_BARRIER_US, True))
        name = f"{clusters}, multicast A, hyper inside (not built)"
        out.append(Layout(name, rowgroup, rowgroup.col_blocks, CLUSTER_BARRIER_US, True))
    return out


def step_row(layout: Layout, dtype: str, glue_bytes: float, rates: Rates, shape: dict) -> dict:
    """One row of the table (times in us per phase, ms per step)."""
    rates = dtype_rates(rates, dtype)
    plan, depth, length = layout.plan, shape["depth"], shape["length"]
    phases = depth * length  # per direction
    fwd = kernel_phase_us(plan, rates, layout.multicast, False)
    bwd = kernel_phase_us(plan, rates, layout.multicast, True)
    hyper_ms = 0.0
    barriers = 2 * phases
    if layout.hyper_in_kernel:
        fwd += hyper_share_us(plan, shape["hyper"], rates, False)
        bwd += hyper_share_us(plan, shape["hyper"], rates, True)
        barriers += 2  # the skew: one more phase per direction
    else:
        hyper = [
            hyper_launch_phase_us(dtype, shape["hyper"], shape["batch"], rates, b)
            for b in (False, True)
        ]
        hyper_ms = phases * (sum(hyper) - 2 * rates.barrier_us) / 1e3
        barriers += 2 * phases
    kernel_ms = phases * (fwd + bwd) / 1e3 + hyper_ms
    barrier_ms = barriers * layout.barrier_us / 1e3
    glue_ms = glue_bytes / (HBM_TBYTES * 1e12) * 1e3
    return {
        "dtype": dtype,
        "layout": layout.name,
        "plan": f"{plan.row_blocks}x{plan.col_blocks} blocks, {plan.units_per_block} units, "
        f"k_chunk {plan.k_chunk}, stages {plan.stages}",
        "fwd_phase_us": round(fwd, 2),
        "bwd_phase_us": round(bwd, 2),
        "barrier_us": layout.barrier_us,
        "barrier_phases": barriers,
        "kernel_ms": round(kernel_ms, 2),
        "barrier_ms": round(barrier_ms, 2),
        "glue_GB": round(glue_bytes / 1e9, 2),
        "glue_ms": round(glue_ms, 2),
        "step_ms": round(kernel_ms + barrier_ms + glue_ms, 2),
    }


def glue_bytes_of(report: dict, dtype: str) -> float:
    """Corrected-rule bytes per training step of the persistent HyperRHN row of a compile
    report (`benchmarks/gpu_report.py` JSON). Raises ValueError (one line) without one."""
    for row in report["rows"]:
        if (row["model"], row["impl"], row["dtype"]) == ("hyperrhn", "persistent", dtype):
            if row.get("status") != "ok":
                break
            return float(row["bytes_per_train_step_read"])
    raise ValueError(f"the report has no compiled persistent HyperRHN {dtype} row")


def table(report: dict, rates: Rates | None = None, shape: dict | None = None) -> list[dict]:
    """Every layout's row for bf16 and f32 (see the module docstring for the model)."""
    rates, shape = rates or Rates(), shape or PAPER
    rows = []
    for dtype in ("bfloat16", "float32"):
        glue = glue_bytes_of(report, dtype)
        for layout in layouts(dtype, rates, shape["batch"], shape["width"]):
            rows.append(step_row(layout, dtype, glue, rates, shape))
    return rows


COLUMNS = (
    ("dtype", "dtype"), ("layout", "layout"), ("plan", "plan"),
    ("fwd_phase_us", "fwd phase us"), ("bwd_phase_us", "bwd phase us"),
    ("barrier_phases", "barriers"), ("barrier_us", "barrier us"), ("kernel_ms", "kernel ms"),
    ("barrier_ms", "barrier ms"), ("glue_GB", "glue GB"), ("glue_ms", "glue ms"),
    ("step_ms", "step ms"),
)  # fmt: skip


def markdown(rows: list[dict]) -> str:
    """The table in Markdown, titled as a PREDICTION."""
    head = "| " + " | ".join(title for _, title in COLUMNS) + " |"
    rule = "|" + "---|" * len(COLUMNS)
    body = ["| " + " | ".join(str(r[key]) for key, _ in COLUMNS) + " |" for r in rows]
    return "\n".join(["PREDICTION (plan model; assumptions in the JSON)", head, rule, *body])


def calibrated_rates(path: str) -> Rates:
    """The refitted Rates of a `benchmarks/calibrate_persistent.py` JSON. Raises ValueError
    (one line) when it has none (an interpreted smoke run)."""
    with open(path) as f:
        fitted = json.load(f).get("rates_refitted")
    if not fitted:
        raise ValueError(f"{path} has no rates_refitted (an interpreted or failed run?)")
    return Rates(**fitted)


def main(argv: list[str] | None = None) -> dict:
    """Print the table (Markdown) and, with ``--json``, write it with its assumptions."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", default=DEFAULT_REPORT, help="compile report JSON")
    parser.add_argument("--json", default=None, help="write the table here as JSON")
    parser.add_argument("--calibration", default=None, help="calibrate_persistent.py JSON")
    args = parser.parse_args(argv)
    with open(args.report) as f:
        report = json.load(f)
    rates = calibrated_rates(args.calibration) if args.calibration else Rates()
    rows = table(report, rates)
    out = {
        "label": "PREDICTION (a model, not a measurement)",
        "report": args.report,
        "report_meta": {k: report["meta"].get(k) for k in ("date", "git_commit", "jax", "host")},
        "calibration": args.calibration,
        "assumptions": {
            "rates": dataclasses.asdict(rates),
            "cluster_barrier_us": CLUSTER_BARRIER_US,
            "hbm_tbytes": HBM_TBYTES,
            "f32_gemm_rate": f"bf16 rate / {TF32_SLOWDOWN} (TF32)",
            "model": __doc__.split("\n\n")[1],
        },
        "rows": rows,
    }
    print(markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
