"""A PREDICTION of the persistent HyperRHN training step per layout, one table: per-phase
kernel time, barrier time, glue time and their sum, for bf16 and f32, from the plan model
the library runs (`rhhjax.ops.persistent_cost`: `plan_for`, `predicted_phase_us`, `Rates`).

Every number here is a MODEL, not a measurement (its rates are measured on an H100; it
explains the measured f32 step, not the bf16 one: results/gpu_h100_2026-11-26b.md):

* kernel time of a main-cell phase: `predicted_phase_us` less its barrier (max of the
  block's GEMM slice at ``Rates.tflops_per_sm``, all blocks' L2 bytes at ``Rates.l2_tbytes``,
  one block's shared-memory fill), from the plan's counts (`rhhjax.kernels.mosaic.plan`);
  f32 runs TF32 wgmma at HALF the bf16 rate (H100 datasheet: 495 vs 989 dense TFLOP/s);
* barrier time: ``Rates.barrier_us`` per grid-barrier phase (the sign-flip barrier measured
  1.03 us; the token barrier before it 20.8 us),
  ``CLUSTER_BARRIER_US`` per hardware cluster barrier (measured on an H100);
* the hyper cell: its own launches, 2 * T * L more barrier-bound phases at the hyper plan's
  predicted phase time (inside the main kernels was removed: the GPU measured it +6.3 ms
  a bf16 step on an H100);
* glue:* glue: the step's HLO bytes under the corrected rule (``bytes_per_train_step_read`` of a
  compile report, `benchmarks/gpu_report.py`, measured without a GPU) at ``HBM_TBYTES``,
  counted serially (every launch's operands and results, the kernels' own inputs and
  outputs and the weight-gradient GEMMs included).

    python benchmarks/persistent_prediction.py [--report R] [--json OUT]
        [--calibration calibrate.json]   # Rates refitted on a GPU (gpu_suite.sh calibrate)
    python benchmarks/persistent_prediction.py --plan [--dtype float32 --row-blocks 2 ...]
"""

from __future__ import annotations

import dataclasses
import json

from rhhjax.kernels.hardware import H100
from rhhjax.kernels.mosaic.plan import PersistentPlan, PlanError

from rhhjax.ops.persistent_cost import Rates, plan_for, predicted_phase_us

HBM_TBYTES = H100.hbm_bytes_per_s / 1e12  # the datasheet's HBM bandwidth, TB/s
# The hardware cluster barrier alone, measured on an H100 (2026-11-26,
# results/calibrate_persistent_h100_rowgroup.json).
CLUSTER_BARRIER_US = 0.137
TF32_SLOWDOWN = 2.0  # bf16 / TF32 dense wgmma rate on an H100 (datasheet)
DEFAULT_REPORT = "results/gpu_report_persistent_apart_h100.json"  # the hyper cell's launches
PAPER = dict(batch=256, width=1000, hyper=128, depth=7, length=100)


def dtype_rates(rates: Rates, dtype: str) -> Rates:
    """``rates`` for ``dtype``: f32 GEMMs at 1 / TF32_SLOWDOWN of the bf16 rate."""
    if dtype == "float32":
        return dataclasses.replace(rates, tflops_per_sm=rates.tflops_per_sm / TF32_SLOWDOWN)
    return rates


def kernel_phase_us(plan: PersistentPlan, rates: Rates, multicast: int, backward: bool) -> float:
    """A main-cell phase without its barrier (us): the plan model's max of GEMM, L2, fill."""
    return predicted_phase_us(plan, rates, multicast, backward) - rates.barrier_us


@dataclasses.dataclass(frozen=True)
class Layout:
    """One way to run the step: the main plan, TMA multicast of A within a cluster and the
    barrier between phases (the hyper cell in its own launches)."""

    name: str
    plan: PersistentPlan
    multicast: int
    barrier_us: float


def rowgroup_plan(dtype: str, batch: int, width: int) -> PersistentPlan | None:
    """The plan `plan_for` picks for the row-group clusters (at most 16 column blocks), or
    None when none fits."""
    try:
        return plan_for(batch, width, dtype, "rowgroup")
    except PlanError:
        return None


def layouts(dtype: str, rates: Rates, batch: int, width: int, hyper: int) -> list[Layout]:
    """The layouts weighed, all built: the grid, the row-group clusters
    (`kernels/mosaic/rowgroup_layout.py`) and those with TMA multicast of the A rows
    (``multicast=1``); ``hyper`` is the hyper cell's width (its own launches)."""
    del hyper
    grid = plan_for(batch, width, dtype)
    out = [Layout("grid, hyper as own launches (built)", grid, 1, rates.barrier_us)]
    rowgroup = rowgroup_plan(dtype, batch, width)
    if rowgroup is not None:
        name = f"row-group clusters of {rowgroup.col_blocks}"
        out.append(Layout(f"{name}, hyper as own launches (built: the default)", rowgroup, 1,
                          CLUSTER_BARRIER_US))  # fmt: skip
        out.append(Layout(f"{name}, multicast A, hyper as own launches (built: multicast=1)",
                          rowgroup, rowgroup.col_blocks, CLUSTER_BARRIER_US))  # fmt: skip
    return out


@dataclasses.dataclass(frozen=True)
class Step:
    """PREDICTION of one training step on a layout, unrounded: the main cell's kernel time
    per phase (us, barrier excluded), the step's
    dependent barrier phases, and its kernel, barrier and glue time (ms)."""

    fwd_phase_us: float
    bwd_phase_us: float
    barrier_phases: int
    kernel_ms: float
    barrier_ms: float
    glue_ms: float

    @property
    def step_ms(self) -> float:
        """Kernel + barrier + glue time (ms), counted serially."""
        return self.kernel_ms + self.barrier_ms + self.glue_ms


def predicted_step(
    layout: Layout, dtype: str, glue_bytes: float, rates: Rates, shape: dict = PAPER
) -> Step:
    """THE step PREDICTION (see the module docstring): ``shape`` gives batch, hyper, depth
    and length (T); ``glue_bytes`` the bytes outside the kernels (0: kernels and barriers
    alone). The hyper cell's own launches run the plan `plan_for` picks for [batch, hyper]."""
    rates = dtype_rates(rates, dtype)
    plan, depth, length = layout.plan, shape["depth"], shape["length"]
    phases = depth * length  # per direction
    fwd = kernel_phase_us(plan, rates, layout.multicast, False)
    bwd = kernel_phase_us(plan, rates, layout.multicast, True)
    hyper_plan = plan_for(shape["batch"], shape["hyper"], dtype)
    hyper = [kernel_phase_us(hyper_plan, rates, 1, b) for b in (False, True)]
    barriers = 4 * phases  # each cell's, each direction
    hyper_ms = phases * sum(hyper) / 1e3
    kernel_ms = phases * (fwd + bwd) / 1e3 + hyper_ms
    barrier_ms = barriers * layout.barrier_us / 1e3
    glue_ms = glue_bytes / (HBM_TBYTES * 1e12) * 1e3
    return Step(fwd, bwd, barriers, kernel_ms, barrier_ms, glue_ms)


def step_row(layout: Layout, dtype: str, glue_bytes: float, rates: Rates, shape: dict) -> dict:
    """One row of the table: `predicted_step` rounded (times in us per phase, ms per step)."""
    step, plan = predicted_step(layout, dtype, glue_bytes, rates, shape), layout.plan
    return {
        "dtype": dtype,
        "layout": layout.name,
        "plan": f"{plan.row_blocks}x{plan.col_blocks} blocks, {plan.units_per_block} units, "
        f"k_chunk {plan.k_chunk}, stages {plan.stages}",
        "fwd_phase_us": round(step.fwd_phase_us, 2),
        "bwd_phase_us": round(step.bwd_phase_us, 2),
        "barrier_us": layout.barrier_us,
        "barrier_phases": step.barrier_phases,
        "kernel_ms": round(step.kernel_ms, 2),
        "barrier_ms": round(step.barrier_ms, 2),
        "glue_GB": round(glue_bytes / 1e9, 2),
        "glue_ms": round(step.glue_ms, 2),
        "step_ms": round(step.step_ms, 2),
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
    """Every layout's row for bf16 and f32 (see the module docstring for the model); glue
    from ``report``."""
    rates, shape = rates or Rates(), shape or PAPER
    rows = []
    for dtype in ("bfloat16", "float32"):
        for layout in layouts(dtype, rates, shape["batch"], shape["width"], shape["hyper"]):
            rows.append(step_row(layout, dtype, glue_bytes_of(report, dtype), rates, shape))
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


def plan_report(args) -> dict:
    """``--plan``: one plan's figures and its labelled PREDICTION (the phases at the dtype's
    rates; the step's kernels and barriers on today's grid, glue not counted). Raises
    PlanError (one line) when the plan cannot run co-resident."""
    plan = PersistentPlan(
        args.batch, args.width, args.dtype, args.col_blocks, args.row_blocks,
        args.k_chunk, args.stages,
    )  # fmt: skip
    plan.check()
    rates = calibrated_rates(args.calibration) if args.calibration else Rates()
    at_dtype = dtype_rates(rates, args.dtype)
    shape = dict(batch=args.batch, width=args.width, hyper=args.hyper, depth=7, length=100)
    today = Layout("grid, hyper as own launches", plan, args.multicast, rates.barrier_us)
    return {
        "plan": dataclasses.asdict(plan),
        **plan.summary(),
        "rates (assumed unless noted)": dataclasses.asdict(rates),
        "PREDICTION forward phase us": round(predicted_phase_us(plan, at_dtype, args.multicast), 2),
        "PREDICTION backward phase us": round(
            predicted_phase_us(plan, at_dtype, args.multicast, backward=True), 2
        ),
        "PREDICTION step kernels + barriers ms (T 100, L 7, glue not counted)": round(
            predicted_step(today, args.dtype, 0.0, rates, shape).step_ms, 2
        ),
    }


def _read_report(path: str) -> dict:
    """A compile report's JSON."""
    with open(path) as f:
        return json.load(f)


def _report_meta(report: dict | None) -> dict | None:
    """What the table records of a report: where and when it was compiled."""
    if report is None:
        return None
    return {k: report["meta"].get(k) for k in ("date", "git_commit", "jax", "host")}


def table_report(args) -> dict:
    """The table with its assumptions, as the JSON ``--json`` writes."""
    report = _read_report(args.report)
    rates = calibrated_rates(args.calibration) if args.calibration else Rates()
    return {
        "label": "PREDICTION (a model, not a measurement)",
        "report": args.report,
        "report_meta": _report_meta(report),
        "calibration": args.calibration,
        "assumptions": {
            "rates": dataclasses.asdict(rates),
            "cluster_barrier_us": CLUSTER_BARRIER_US,
            "hbm_tbytes": HBM_TBYTES,
            "f32_gemm_rate": f"bf16 rate / {TF32_SLOWDOWN} (TF32)",
            "model": __doc__.split("\n\n")[1],
        },
        "rows": table(report, rates),
    }


def _parser():
    """The command's flags: the table's, and ``--plan`` with the plan's own."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", default=DEFAULT_REPORT, help="compile report JSON")
    parser.add_argument("--json", default=None, help="write the table here as JSON")
    parser.add_argument("--calibration", default=None, help="calibrate_persistent.py JSON")
    one = parser.add_argument_group("--plan: one plan's figures as JSON instead of the table")
    one.add_argument("--plan", action="store_true")
    for name, default in (("batch", 256), ("width", 1000), ("col-blocks", H100.sms)):
        one.add_argument(f"--{name}", type=int, default=default)
    for name, default in (("row-blocks", 1), ("k-chunk", 64), ("stages", 4), ("hyper", 128)):
        one.add_argument(f"--{name}", type=int, default=default)
    one.add_argument("--multicast", type=int, default=1)
    one.add_argument("--dtype", default="bfloat16")
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Print the table (Markdown) and, with ``--json``, write it with its assumptions; with
    ``--plan``, print one plan's figures as JSON (a plan that cannot run: one ``error:``
    line, exit 1)."""
    from rhhjax.errors import exit_with_error

    args = _parser().parse_args(argv)
    if args.plan:
        try:
            out = plan_report(args)
        except PlanError as e:
            exit_with_error(e)
        print(json.dumps(out, indent=1))
        return out
    out = table_report(args)
    print(markdown(out["rows"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
