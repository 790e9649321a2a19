"""Every Mosaic GPU kernel executed in GPU interpret mode on a CPU, against its reference.

    NPROC=17 python benchmarks/interpret_check.py [--paper] [--only=persistent] [--out=F.json]

For each kernel (`mosaic_forward`, `mosaic_backward`, `persistent_forward`,
`persistent_backward`) and a few layouts, from one block to a cluster of 16: runs the real
kernel interpreted with the race detector on (`rhhjax.kernels.mosaic.interpret.params`) and
its pure-JAX reference on the same fresh random inputs, and prints one markdown row per run:
the blocks (a grid run one block after another, or one cluster run at once), the largest
difference from the reference (absolute, and relative to the largest reference entry), the
races reported ("none", or the report: jax 0.12 raises it, 0.11.2 prints it) and the seconds
it took (interpretation and its compile). The last row is a MUTANT, the persistent forward
without its barrier between phases, which must be reported (exit status 1 otherwise, or when
any other row reports a race). ``--paper``: also the micro-layer kernels at the paper's
size (a grid of 528 and 256 blocks, about a minute each here). ``--out``: the rows as JSON.

A cluster of n blocks needs XLA's CPU pool to hold n + 1 threads: start it with
``NPROC=17`` for the 16-block rows (`gpu_interpret.cluster_too_large`). Without GPU interpret
mode (jax < 0.11.2) it prints the one line that says so and exits 2.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import sys
import time
from pathlib import Path
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from rhhjax.kernels.mosaic import backward as mb
from rhhjax.kernels.mosaic import forward as mf
from rhhjax.kernels.mosaic import grid_barrier
from rhhjax.kernels.mosaic import interpret as gpu_interpret
from rhhjax.kernels.mosaic import persistent_backward as pb
from rhhjax.kernels.mosaic import persistent_forward as pf
from rhhjax.kernels.mosaic import persistent_slots as slots
from rhhjax.kernels.mosaic.plan import PersistentPlan


def _normal(rng, *shape, scale=1.0):
    return jnp.asarray(rng.normal(size=shape) * scale, jnp.float32)


def _difference(actual, expected) -> tuple[float, float]:
    """(max |a - e|, that / max |e|) over every output."""
    worst, scale = 0.0, 0.0
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        a, e = np.asarray(a, np.float32), np.asarray(e, np.float32)
        worst = max(worst, float(np.max(np.abs(a - e))))
        scale = max(scale, float(np.max(np.abs(e))))
    return worst, worst / (scale or 1.0)


def mosaic_forward_case(dtype: str, batch: int, width: int, units: int, k_pad: int):
    """(grid, kernel thunk, reference thunk) of the micro-layer forward with every option
    and the saved rows."""
    rng = np.random.default_rng(batch + width)
    w = _normal(rng, width, 2 * width, scale=0.2)
    s, z = _normal(rng, batch, width), 1.0 + _normal(rng, batch, width, scale=0.3)
    b = _normal(rng, 2 * width, scale=0.3)
    ops = mf.operands(w, s, z, b, jnp.dtype(dtype), units, k_pad)
    xproj = _normal(rng, batch, 2, width, scale=0.5)
    mask = jnp.asarray(rng.random((batch, width)) < 0.7, jnp.float32) / 0.7
    args = (*ops, xproj, mask)
    config = mf.MosaicForwardConfig(units=units)

    def kernel():
        run = lambda *a: mf.highway_forward(  # noqa: E731
            *a, save=True, config=config, interpret=gpu_interpret.params()
        )
        return jax.jit(run)(*args)

    grid = f"grid {batch // 64} x {width // units}"
    return grid, kernel, lambda: mf.highway_forward_reference(*args, save=True, units=units)


def mosaic_backward_case(dtype: str, batch: int, n: int):
    """(grid, kernel thunk, reference thunk) of the micro-layer backward with z and mask."""
    rng = np.random.default_rng(batch * n)
    mm = jnp.dtype(dtype)
    args = (
        _normal(rng, batch, 2 * n, scale=0.3).astype(mm),
        _normal(rng, n, 2 * n, scale=0.2).astype(mm),
        _normal(rng, batch, n),
        _normal(rng, batch, n),
        _normal(rng, batch, n),
        jnp.tanh(_normal(rng, batch, n)),
        jax.nn.sigmoid(_normal(rng, batch, n)),
        1.0 + _normal(rng, batch, n, scale=0.3),
        jnp.asarray(rng.random((batch, n)) < 0.7, jnp.float32) / 0.7,
    )
    run = lambda *a: mb.highway_backward(*a, interpret=gpu_interpret.params())  # noqa: E731
    grid = f"grid {batch // 64} x {n // mb.MosaicBackwardConfig().units}"
    return grid, lambda: jax.jit(run)(*args), lambda: mb.highway_backward_reference(*args)


def _phase_inputs(plan: PersistentPlan, steps: int, depth: int, rng):
    """Random phase-major [P, b_pad, n_pad] f32 rows (zero past the batch and the width)."""
    rows = np.zeros((steps * depth, plan.b_pad, plan.n_pad), np.float32)
    rows[:, : plan.batch, : plan.width] = rng.normal(size=(steps * depth, plan.batch, plan.width))
    return jnp.asarray(rows)


def _forward_operands(plan: PersistentPlan, steps: int, depth: int, rng, with_z: bool):
    """One cell's random forward operands (w_blk, s0, xproj with unpadded units, bias rows,
    z or None, uint8 mask decisions), drawn from ``rng`` in that order."""
    n, b, n_pad = plan.width, plan.b_pad, plan.n_pad
    w_blk = pf.forward_weights(plan, _normal(rng, depth, n, 2 * n, scale=0.3), plan.dtype)
    s0 = _phase_inputs(plan, 1, 1, rng)[0]
    halves = [_phase_inputs(plan, steps, 1, rng) for _ in range(2)]
    xproj = (jnp.stack(halves, axis=2) * 0.5)[..., : plan.z_width]  # units unpadded
    bias = jnp.broadcast_to(_normal(rng, depth, 1, 2, n_pad, scale=0.3), (depth, b, 2, n_pad))
    z = None
    if with_z:
        z_pm = 1.0 + 0.3 * _phase_inputs(plan, steps, depth, rng)
        z = slots.scales_to_layer_major(z_pm, steps, depth, plan.z_width)
    mask = jnp.asarray(rng.random((steps * depth, b, n_pad)) < KEEP, jnp.uint8)  # decisions
    return w_blk, s0, xproj, bias, z, mask


def persistent_forward_case(plan: PersistentPlan, steps: int, depth: int):
    """(cluster, kernel thunk, reference thunk) of the whole-sequence forward with z and
    gate dropout, saving the backward's rows."""
    rng = np.random.default_rng(plan.grid + steps)
    args = (plan, *_forward_operands(plan, steps, depth, rng, with_z=True))

    def kernel():
        run = lambda *a: pf.persistent_forward(  # noqa: E731
            plan, *a, save=True, keep=KEEP, interpret=gpu_interpret.params()
        )
        return jax.jit(run)(*args[1:])[:3]

    reference = lambda: pf.persistent_forward_reference(*args, save=True, keep=KEEP)[:3]  # noqa: E731
    return f"cluster {plan.row_blocks} x {plan.col_blocks}", kernel, reference


def persistent_backward_case(plan: PersistentPlan, steps: int, depth: int):
    """(cluster, kernel thunk, reference thunk) of the whole-sequence backward with z and
    gate dropout."""
    rng = np.random.default_rng(plan.grid * 7 + steps)
    n = plan.width
    wt = pb.backward_weights(plan, _normal(rng, depth, n, 2 * n, scale=0.3), plan.dtype)
    g, s_prev = _phase_inputs(plan, steps, depth, rng), _phase_inputs(plan, steps, depth, rng)
    full = [_phase_inputs(plan, steps, depth, rng) for _ in range(2)]
    # with z the gates are recomputed from full; in f32 s_prev is read from the A buffer
    packed = jnp.stack([s_prev] * plan.state_in_packed + full, axis=2)
    s_mm = None
    if not plan.state_in_packed:
        s_mm = slots.inputs_to_a_buffer(s_prev, steps, depth, plan.k_pad)
    z_pm = 1.0 + 0.3 * _phase_inputs(plan, steps, depth, rng)
    z = slots.scales_to_layer_major(z_pm, steps, depth, plan.z_width)
    mask = jnp.asarray(rng.random(g.shape) < KEEP, jnp.uint8)  # keep decisions
    b_pad, n_pad = g.shape[1:]
    bias = jnp.broadcast_to(_normal(rng, depth, 1, 2, n_pad, scale=0.3), (depth, b_pad, 2, n_pad))
    args = (wt, g, packed, z, mask, bias, s_mm)

    def kernel():
        run = lambda *a: pb.persistent_backward(  # noqa: E731
            plan, *a, keep=KEEP, interpret=gpu_interpret.params()
        )
        return jax.jit(run)(*args)[:-1]  # all but the status: d_x, d_mm, carry, bias, dz...

    def reference():
        return pb.persistent_backward_reference(plan, *args, keep=KEEP)[:-1]

    return f"cluster {plan.row_blocks} x {plan.col_blocks}", kernel, reference


def cases(paper: bool) -> list[tuple]:
    """(kernel name, dtype, shape note, a function building its case) for every row."""
    fwd, bwd = mosaic_forward_case, mosaic_backward_case
    out = [
        ("mosaic_forward", "bfloat16", "B 128, n 32, u 16", lambda: fwd("bfloat16", 128, 32, 16, 64)),  # noqa: E501
        ("mosaic_forward", "float32", "B 128, n 72, u 8", lambda: fwd("float32", 128, 72, 8, 128)),
        ("mosaic_backward", "bfloat16", "B 128, n 64", lambda: bwd("bfloat16", 128, 64)),
        ("mosaic_backward", "float32", "B 128, n 64", lambda: bwd("float32", 128, 64)),
    ]  # fmt: skip
    if paper:
        paper_fwd = lambda: fwd("bfloat16", 256, 1056, 8, 1088)  # noqa: E731
        paper_bwd = lambda: bwd("bfloat16", 256, 1024)  # noqa: E731
        out += [
            ("mosaic_forward", "bfloat16", "paper: B 256, n 1056, u 8", paper_fwd),
            ("mosaic_backward", "bfloat16", "paper: B 256, n 1024", paper_bwd),
        ]
    forward_plans = [  # (plan, steps, depth)
        (PersistentPlan(64, 64, "bfloat16", 1, 1, 32), 3, 2),
        (PersistentPlan(64, 32, "float32", 1, 1, 32, 2), 3, 2),
        (PersistentPlan(100, 37, "float32", 3, 2, 16, 2), 3, 2),
        (PersistentPlan(64, 256, "bfloat16", 16, 1, 32), 2, 2),
    ]
    backward_plans = [
        (PersistentPlan(64, 64, "bfloat16", 1, 1, 32), 3, 2),
        (PersistentPlan(64, 32, "float32", 1, 1, 32, 2), 3, 2),
        (PersistentPlan(100, 37, "float32", 3, 2, 32), 2, 3),
        (PersistentPlan(64, 256, "bfloat16", 16, 1, 32), 2, 2),
    ]
    for name, make, plans in (
        ("persistent_forward", persistent_forward_case, forward_plans),
        ("persistent_backward", persistent_backward_case, backward_plans),
    ):
        for plan, steps, depth in plans:
            note = f"B {plan.batch}, n {plan.width}, T {steps}, L {depth}"
            out.append((name, plan.dtype, note, lambda m=make, c=(plan, steps, depth): m(*c)))
    # The check can fail: without its barrier between phases the kernel must be reported.
    mutant = (PersistentPlan(64, 64, "bfloat16", 2, 1, 32), 2, 1)
    note = "B 64, n 64, T 2, L 1; " + MUTANT
    out.append(("persistent_forward", "bfloat16", note, lambda: persistent_forward_case(*mutant)))
    return out


MUTANT = "MUTANT: no barrier between phases"
KEEP = 0.7  # gate-dropout keep probability of the persistent cases (uint8 decisions)


@contextlib.contextmanager
def _without_phase_barrier(active: bool):
    """While ``active``, the interpreted persistent kernels skip their cluster barrier."""
    if not active:
        yield
        return
    with mock.patch.object(grid_barrier, "cluster_barrier", lambda bar: jnp.bool_(True)):
        yield


def _race(text: str) -> str | None:
    """ "RACE DETECTED at <file>:<line>s" of a race report, or None."""
    if "RACE DETECTED" not in text:
        return None
    report = text[text.index("RACE DETECTED") :]
    places = sorted(set(re.findall(r"(\w+\.py:\d+)", report[:2000])))
    return "RACE DETECTED at " + ", ".join(places[:2])


def _run(kernel, mutant: bool):
    """(the kernel's outputs or None, the races reported: "none" or where): jax 0.12 raises
    a race, 0.11.2 prints it and carries on."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed), _without_phase_barrier(mutant):
            actual = jax.block_until_ready(kernel())
    except Exception as error:  # a race (or any failure) is a result here
        gpu_interpret.reset_state()
        return None, _race(str(error)) or " ".join(str(error).split())[:120]
    return actual, _race(printed.getvalue()) or "none"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paper", action="store_true", help="also the paper-size grids")
    parser.add_argument("--out", default="", help="write the rows as JSON here")
    parser.add_argument("--only", default="", help="the kernels whose name contains this")
    args = parser.parse_args(argv)
    reason = gpu_interpret.unavailable("benchmarks/interpret_check.py")
    if reason is not None:
        print(f"error: {reason}", file=sys.stderr)
        return 2
    print(f"jax {jax.__version__}, NPROC pool {gpu_interpret.pool_threads()} threads")
    print("| kernel | dtype | shape | blocks | max abs diff | max rel diff | races | s |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for name, dtype, shape, build in cases(args.paper):
        if args.only not in name:
            continue
        blocks, kernel, reference = build()
        t0 = time.perf_counter()
        actual, races = _run(kernel, MUTANT in shape)
        seconds = time.perf_counter() - t0
        diff = _difference(actual, reference()) if actual is not None else (np.nan, np.nan)
        finite = [None if np.isnan(d) else d for d in diff]  # None: the run raised
        row = dict(kernel=name, dtype=dtype, shape=shape, blocks=blocks, max_abs=finite[0],
                   max_rel=finite[1], races=races, seconds=round(seconds, 1))  # fmt: skip
        rows.append(row)
        print(f"| {name} | {dtype} | {shape} | {blocks} | {diff[0]:.2g} | {diff[1]:.2g} | "
              f"{races} | {seconds:.1f} |", flush=True)  # fmt: skip
    if args.out:
        meta = dict(
            jax=jax.__version__,
            command=" ".join(sys.argv),
            pool_threads=gpu_interpret.pool_threads(),
            date=time.strftime("%Y-%m-%d"),
        )
        Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    expected = all((r["races"] == "none") != (MUTANT in r["shape"]) for r in rows)
    return 0 if expected else 1


if __name__ == "__main__":
    sys.exit(main())
