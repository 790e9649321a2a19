"""The persistent kernels' time PREDICTION (a model, not a measurement): one phase and one
training step's recurrence from a plan's counts (`rhhjax.kernels.mosaic.plan`), at stated
machine rates. `rhhjax.ops.persistent` picks its plan by it; ``python -m
rhhjax.hlo.persistent_cost`` prints a plan's figures and the prediction as JSON.
"""

from __future__ import annotations

import dataclasses

from rhhjax.kernels.hardware import H100
from rhhjax.kernels.mosaic.plan import PersistentPlan, PlanError


@dataclasses.dataclass(frozen=True)
class Rates:
    """Machine rates of the prediction model (each an assumption or a measurement, stated)."""

    barrier_us: float = 1.0  # assumed grid-barrier latency (not measured)
    tflops_per_sm: float = 798.0 / H100.sms  # measured 8192^3 bf16 matmul rate / SMs
    # Aggregate L2 read bandwidth, TB/s: a third-party microbenchmark of an H100 PCIe (114 SMs,
    # Chips and Cheese 2023: ~5.5 TB/s); not measured here. Scaled to the H100 SXM: ~7.2.
    l2_tbytes: float = 5.5
    smem_fill_bytes_per_clk: float = 128.0  # assumed per-SM fill rate
    clock_ghz: float = H100.clock_ghz  # measured SM clock (results/gpu_h100.md)


def predicted_phase_us(
    plan: PersistentPlan, rates: Rates | None = None, multicast: int = 1, backward: bool = False
) -> float:
    """PREDICTION (a model, not a measurement) of one main-cell phase, in microseconds:

        barrier + max(GEMM slice at tflops_per_sm, all blocks' L2 bytes at l2_tbytes,
                      one block's ingest at smem_fill_bytes_per_clk * clock)

    bf16 rate for both dtypes (an f32 plan would run TF32 wgmma: same rate model)."""
    rates = rates or Rates()
    gemm = plan.flops_per_block(backward) / (rates.tflops_per_sm * 1e12)
    l2 = plan.l2_bytes_per_phase(multicast, backward) / (rates.l2_tbytes * 1e12)
    fill_rate = rates.smem_fill_bytes_per_clk * rates.clock_ghz * 1e9
    fill = plan.ingest_bytes_per_block(backward) / fill_rate
    return rates.barrier_us + 1e6 * max(gemm, l2, fill)


def predicted_step_ms(
    plan: PersistentPlan,
    depth: int,
    length: int,
    rates: Rates | None = None,
    multicast: int = 1,
    hyper_phase_us: float | None = None,
) -> float:
    """PREDICTION of a training step's recurrence time (ms): ``length * depth`` forward and
    as many backward main-cell phases at :func:`predicted_phase_us`, as many hyper-cell phases at
    ``hyper_phase_us`` (default: the barrier alone), plus the deferred weight-gradient GEMMs
    (``depth`` GEMMs of ``2 * length * b_pad * n_pad * 2 n_pad`` FLOPs at the whole GPU's
    rate). Embedding, output layer and optimizer are not counted."""
    rates = rates or Rates()
    phases = 2 * length * depth
    forward = predicted_phase_us(plan, rates, multicast)
    backward = predicted_phase_us(plan, rates, multicast, backward=True)
    main = length * depth * (forward + backward)
    hyper = phases * (rates.barrier_us if hyper_phase_us is None else hyper_phase_us)
    dw_flops = depth * 2 * length * plan.b_pad * plan.n_pad * 2 * plan.n_pad
    dw_us = 1e6 * dw_flops / (rates.tflops_per_sm * plan.sm_count * 1e12)
    return (main + hyper + dw_us) / 1e3


def main(argv: list[str] | None = None) -> dict:
    """``python -m rhhjax.hlo.persistent_cost [--dtype=float32 --row-blocks=2 ...]``:
    checks a plan (one ``error:`` line and exit 1 when it cannot run co-resident) and prints
    its figures and the labelled PREDICTION as JSON."""
    import argparse
    import json

    from rhhjax.errors import exit_with_error

    parser = argparse.ArgumentParser(description=main.__doc__)
    for name, default in (("batch", 256), ("width", 1000), ("col-blocks", H100.sms)):
        parser.add_argument(f"--{name}", type=int, default=default)
    for name, default in (("row-blocks", 1), ("k-chunk", 64), ("stages", 4), ("depth", 7)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--length", type=int, default=100)
    parser.add_argument("--multicast", type=int, default=1)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args(argv)
    try:
        plan = PersistentPlan(
            args.batch, args.width, args.dtype, args.col_blocks, args.row_blocks,
            args.k_chunk, args.stages,
        )  # fmt: skip
        plan.check()
    except PlanError as e:
        exit_with_error(e)
    report = {
        "plan": dataclasses.asdict(plan),
        **plan.summary(),
        "rates (assumed unless noted)": dataclasses.asdict(Rates()),
        "PREDICTION forward phase us": round(predicted_phase_us(plan, None, args.multicast), 2),
        "PREDICTION backward phase us": round(
            predicted_phase_us(plan, None, args.multicast, backward=True), 2
        ),
        "PREDICTION step recurrence ms": round(
            predicted_step_ms(plan, args.depth, args.length, None, args.multicast), 2
        ),
    }
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
