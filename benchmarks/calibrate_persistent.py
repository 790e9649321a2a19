"""Calibrate the persistent plan model on a GPU: measure the three numbers it assumes and
refit `rhhjax.ops.persistent_cost.Rates` from them (`bash benchmarks/gpu_suite.sh calibrate`,
< 2 min).

Measured, each a median of ``--reps`` timed runs after a warm-up:

* barrier_us: a kernel of the plan's real grid that does nothing but pass its grid barrier
  (`grid_barrier.make_barrier`) ``phases`` times, per barrier (two phase counts, the
  difference divided by the phases they differ by: launch overhead cancels);
* fwd_phase_us / bwd_phase_us: the persistent forward and backward kernels at the plan
  `ops.persistent_cost.plan_for` chooses for the paper cell (batch 256, width 1000, depth 7) at
  two sequence lengths, the difference per phase (barrier included, as in the model);
* l2_tbytes: an XLA reduction that reads an L2-resident array (``--l2-mb``, default 24 MB of
  the H100's 50 MB L2) ``--l2-rounds`` times inside one jit, bytes per second.

`refit` turns them into Rates: the barrier and the L2 rate as measured, and the GEMM rate
per SM that makes the model's forward phase equal the measured one when the GEMM term
bounds it (else unchanged). The JSON (measurements, old and refitted Rates, the old and
new predicted phases, versions, date) goes to ``--out``.

    python benchmarks/calibrate_persistent.py --out $OUT/calibrate.json
    python benchmarks/calibrate_persistent.py --stages 2 ...  # the plan at 2 pipeline stages
    python benchmarks/calibrate_persistent.py --interpret   # tiny shapes, GPU interpret mode

``--stages`` / ``--k-chunk`` time the chosen plan at another pipeline depth or K chunk, e.g.
2 stages, the main GEMM's depth beside the hyper cell inside the kernels (bf16), which
measured slower on an H100, or ``--stages 6 --k-chunk 32`` (the same shared memory as 3 x
64, more loads in flight): whether the phases are bound by the pipeline's depth, which the
plan model does not see.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from rhhjax.kernels.mosaic.plan import PersistentPlan, PlanError

from rhhjax.ops.persistent_cost import Rates, check_runnable, plan_for, predicted_phase_us

PAPER = dict(batch=256, width=1000, depth=7)
TINY = dict(batch=16, width=32, depth=2)  # interpret mode: one block


def refit(plan: PersistentPlan, measured: dict, rates: Rates | None = None) -> Rates:
    """Rates refitted from ``measured`` (keys barrier_us, fwd_phase_us, l2_tbytes; us and
    TB/s): barrier and L2 rate taken as measured; ``tflops_per_sm`` set so that the model's
    GEMM term equals the measured forward phase less the barrier, when that exceeds the
    model's L2 and fill terms (the phase is then GEMM-bound); otherwise left as it was.
    When the phase is shorter than the model's L2 term at the measured rate, the kernel read
    L2 faster than the XLA reduction did (an H100 measured both, 2026-11-26): the L2 rate
    becomes the one the phase reached, so that the model predicts the measured phase.
    Raises ValueError (one line) for a missing or non-positive measurement."""
    rates = rates or Rates()
    for key in ("barrier_us", "fwd_phase_us", "l2_tbytes"):
        if not measured.get(key, 0) > 0:
            raise ValueError(f"calibration needs a positive {key}, got {measured.get(key)!r}")
    new = dataclasses.replace(rates, barrier_us=measured["barrier_us"])
    new = dataclasses.replace(new, l2_tbytes=measured["l2_tbytes"])
    work_us = measured["fwd_phase_us"] - new.barrier_us
    l2_us = 1e6 * plan.l2_bytes_per_phase() / (new.l2_tbytes * 1e12)
    fill_rate = new.smem_fill_bytes_per_clk * new.clock_ghz * 1e9
    fill_us = 1e6 * plan.ingest_bytes_per_block() / fill_rate
    if work_us > max(l2_us, fill_us):
        new = dataclasses.replace(new, tflops_per_sm=plan.flops_per_block() / (work_us * 1e6))
    elif work_us < l2_us:  # the kernel read its phase's L2 bytes faster than the reduction
        new = dataclasses.replace(new, l2_tbytes=plan.l2_bytes_per_phase() / (work_us * 1e6))
    return new


def replanned(plan: PersistentPlan, stages: int = 0, k_chunk: int = 0) -> PersistentPlan:
    """``plan`` at ``stages`` pipeline stages and K chunks of ``k_chunk`` (0: the plan's).
    Raises PlanError (one line) where either persistent kernel cannot run it (its shared
    memory, a chunk that does not divide K: `check_runnable`)."""
    candidate = dataclasses.replace(
        plan, stages=stages or plan.stages, k_chunk=k_chunk or plan.k_chunk
    )
    check_runnable(candidate)
    return candidate


def _median_s(fn, args, reps: int) -> float:
    """Median wall time (s) of ``fn(*args)`` over ``reps`` runs after one warm-up."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def barrier_kernel(plan: PersistentPlan, phases: int, interpret=None, layout: str = "grid"):
    """A kernel of the plan's grid (``layout``: `rowgroup_layout`) that passes ``phases``
    barriers; returns its status [grid] int32 (0 = every barrier passed)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu
    from rhhjax.kernels.mosaic import grid_barrier as gb
    from rhhjax.kernels.mosaic import rowgroup_layout

    grid, names = (plan.row_blocks, plan.col_blocks), ("r", "g")
    launch, block_index, make_barrier = rowgroup_layout.functions(layout, interpret)

    def kernel(status_g, phase_bar=None):
        r, g = block_index(grid, names, phase_bar)
        barrier = make_barrier(plan.grid, (r == 0) & (g == 0), gb.DEFAULT_SPIN_LIMIT, phase_bar)

        def body(i, code):
            return jnp.where(barrier(i), code, i + 1)

        status_g[r * plan.col_blocks + g] = jax.lax.fori_loop(0, phases, body, jnp.int32(0))

    launch_args, phase_bar = launch(grid, names, interpret)
    return plgpu.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct((plan.grid,), jnp.int32),
        scratch_types=phase_bar,
        kernel_name="calibrate_grid_barrier",
        interpret=interpret,
        **launch_args,
    )()


def _operands(plan: PersistentPlan, steps: int, depth: int, seed: int = 0):
    """Random forward and backward operands at the plan's padded shapes."""
    from rhhjax.kernels.mosaic import persistent_backward as pb
    from rhhjax.kernels.mosaic import persistent_forward as pf

    rng = np.random.default_rng(seed)
    b, n, phases = plan.b_pad, plan.n_pad, steps * depth
    dt = jnp.dtype(plan.dtype)

    def f32(*shape, scale=0.1):
        return jnp.asarray(rng.normal(size=shape) * scale, jnp.float32)

    kernel_s = f32(depth, plan.width, 2 * plan.width, scale=1.0 / np.sqrt(plan.width))
    ones = jnp.ones((phases, b, n), jnp.uint8)  # the dropout decisions: keep every unit
    w_blk = pf.forward_weights(plan, kernel_s, dt)
    fwd = (
        w_blk,
        f32(b, n),
        f32(steps, b, 2, plan.z_width),  # x U, units unpadded
        f32(depth, b, 2, n),
        1.0 + f32(depth, steps, b, plan.z_width),  # z, layer-major
        ones,
    )
    bwd_w = pb.backward_weights(plan, kernel_s, dt)
    return fwd, bwd_w, f32(phases, b, n)


def phase_times(
    plan: PersistentPlan, depth: int, lengths: tuple, reps: int, interpret=None, layout="grid"
):
    """(forward, backward) us per phase: the kernels at two sequence lengths, the time
    difference over the phase difference."""
    from rhhjax.kernels.mosaic import persistent_backward as pb
    from rhhjax.kernels.mosaic import persistent_forward as pf

    fwd_s, bwd_s = [], []
    kw = dict(interpret=interpret, layout=layout)
    for steps in lengths:
        fwd_ops, wt, g = _operands(plan, steps, depth)
        forward = jax.jit(lambda *a: pf.persistent_forward(plan, *a, save=True, **kw))
        s_last, packed, s_mm, status = forward(*fwd_ops)
        assert not np.asarray(status).any(), f"forward barrier timed out: {status}"
        backward = jax.jit(lambda *a: pb.persistent_backward(plan, *a, **kw))
        s_prev = None if plan.state_in_packed else s_mm  # f32: the input states' buffer
        bwd_ops = (wt, g, packed, fwd_ops[4], fwd_ops[5], fwd_ops[3], s_prev)  # z, mask, bias
        fwd_s.append(_median_s(forward, fwd_ops, reps))
        bwd_s.append(_median_s(backward, bwd_ops, reps))
    phases = (lengths[1] - lengths[0]) * depth
    return tuple(1e6 * (t[1] - t[0]) / phases for t in (fwd_s, bwd_s))


def barrier_us(plan: PersistentPlan, counts: tuple, reps: int, interpret=None, layout="grid"):
    """us per barrier: the barrier kernel at two phase counts, the difference."""
    times = []
    for count in counts:
        run = jax.jit(lambda c=count: barrier_kernel(plan, c, interpret, layout))
        status = run()
        assert not np.asarray(status).any(), f"barrier timed out: {status}"
        times.append(_median_s(run, (), reps))
    return 1e6 * (times[1] - times[0]) / (counts[1] - counts[0])


def l2_tbytes(megabytes: float, rounds: int, reps: int) -> float:
    """TB/s of an XLA reduction over an array of ``megabytes`` read ``rounds`` times in one
    jit (each round depends on the last, so none is skipped)."""
    x = jnp.ones((int(megabytes * 1e6) // 4,), jnp.float32)

    @jax.jit
    def run(x):
        def body(_, acc):
            return acc + jnp.sum(x * (1.0 + acc * 0.0))

        return jax.lax.fori_loop(0, rounds, body, jnp.float32(0.0))

    seconds = _median_s(run, (x,), reps)
    return x.nbytes * rounds / seconds / 1e12


def measure(args) -> dict:
    """Every measurement at the chosen plan (tiny shapes interpreted)."""
    from rhhjax.kernels.mosaic import interpret as gpu_interpret

    from rhhjax.ops import persistent

    shape = TINY if args.interpret else PAPER
    interpret = gpu_interpret.params() if args.interpret else None
    choose = persistent.interpret_plan if args.interpret else plan_for
    plan = choose(shape["batch"], shape["width"], args.dtype, args.layout)
    if args.stages or args.k_chunk:
        plan = replanned(plan, args.stages, args.k_chunk)
    lengths = (1, 2) if args.interpret else (4, 12)
    counts = (2, 6) if args.interpret else (200, 1400)
    reps = 1 if args.interpret else args.reps
    out = {"plan": dataclasses.asdict(plan), "shape": shape, "interpret": args.interpret}
    out["layout"] = args.layout
    out["barrier_us"] = barrier_us(plan, counts, reps, interpret, args.layout)
    out["fwd_phase_us"], out["bwd_phase_us"] = phase_times(
        plan, shape["depth"], lengths, reps, interpret, args.layout
    )
    out["l2_tbytes"] = l2_tbytes(1.0 if args.interpret else args.l2_mb, args.l2_rounds, reps)
    return out, plan


def main(argv=None) -> dict:
    """Measure, refit, print and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--l2-mb", type=float, default=24.0)
    parser.add_argument("--l2-rounds", type=int, default=50)
    parser.add_argument("--interpret", action="store_true", help="tiny shapes, interpreted")
    parser.add_argument("--layout", default="grid", choices=("grid", "rowgroup"))
    parser.add_argument(
        "--stages", type=int, default=0, help="pipeline stages of the plan (0: the chosen plan's)"
    )
    parser.add_argument(
        "--k-chunk", type=int, default=0, help="K per pipeline stage (0: the chosen plan's)"
    )
    args = parser.parse_args(argv)
    try:
        measured, plan = measure(args)
    except PlanError as e:
        from rhhjax.errors import exit_with_error

        exit_with_error(e)
    old = Rates()
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(sys.argv),
        "jax": jax.__version__,
        "device": str(jax.devices()[0]),
        "measured": measured,
        "rates_before (assumed)": dataclasses.asdict(old),
        "PREDICTION before: fwd, bwd phase us": [
            predicted_phase_us(plan, old),
            predicted_phase_us(plan, old, backward=True),
        ],
    }
    if not args.interpret:  # interpreted times say nothing about a GPU
        new = refit(plan, measured, old)
        result["rates_refitted"] = dataclasses.asdict(new)
        result["PREDICTION refitted: fwd, bwd phase us"] = [
            predicted_phase_us(plan, new),
            predicted_phase_us(plan, new, backward=True),
        ]
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
