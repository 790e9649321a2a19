"""Autotune of `persistent`: every `PersistentVariant` a HyperRHN shape can run, timed as
bench.py's training step (forward, backward, clipping, Adam) in ONE process.

    python benchmarks/autotune_persistent.py --out=autotune.json   # a GPU: paper size, bf16
    python benchmarks/autotune_persistent.py --list --dtypes=bfloat16,float32  # no timing
    NPROC=5 build/venv-jax-newest/bin/python benchmarks/autotune_persistent.py \\
        --sizes=tiny --interpret --out=/tmp/autotune.json          # a CPU dry run

Per size and dtype the candidates are `persistent.variant_candidates` (today's default first),
compiled by `bench.compile_step` (the first alone, then --compile_workers at once in threads;
one by one in interpret mode) and timed one by one by `bench.time_compiled` once their group
compiled: no compile runs beside a timed step. A failure is a row with its error; one past
--limit seconds a timeout row (a hung compile or kernel is not stopped: the caller's timeout is
the hard limit); past --budget seconds the rest are skipped rows. The JSON (--out) is written
after every group; the table marks the fastest row per size and dtype. ``--interpret``: GPU
interpret mode on a CPU (jax >= 0.11.2).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import signal
import statistics
import sys
import threading
import time

import bench
import jax
from rhhjax.kernels.mosaic import interpret as gpu_interpret

from rhhjax import models
from rhhjax.ops import persistent

# name: (hidden, hyper_hidden, depth, batch, seq_len); tiny: GPU interpret mode's size
SIZES = {**bench.SIZES, "tiny": (64, 32, 2, 4, 3)}
DTYPES = ("bfloat16", "float32")
COMPILE_THREADS = "autotune-compile"  # the name prefix of the compile pools' threads


class CandidateTimeout(Exception):
    """A candidate past its time limit."""


@dataclasses.dataclass
class Row:
    size: str
    dtype: str
    variant: str
    plans: str
    status: str = "ok"  # ok | failed | timeout | skipped
    compile_s: float | None = None
    step_ms_median: float | None = None
    step_ms_min: float | None = None
    steps: int = 0
    error: str = ""
    winner: bool = False


def model_config(size: str, dtype: str, variant: str, interpret: bool) -> models.ModelConfig:
    """The HyperRHN of ``size`` (paper hyper-parameters, gate dropout) at ``variant``."""
    hidden, hyper, depth, _, _ = SIZES[size]
    return models.ModelConfig(
        type="hyperrhn", vocab_size=bench.VOCAB, embed_dim=bench.EMBED, hidden=hidden,
        hyper_hidden=hyper, depth=depth, impl=persistent.NAME, dtype=dtype, keep=0.65,
        pallas_mode="interpret" if interpret else "auto",
        persistent=persistent.parse_variant(variant),
    )  # fmt: skip


def config_flags(text: str) -> str:
    """A variant's text as train.py's flags (its fields not at their defaults)."""
    changed = persistent.parse_variant(text).changed().items()
    flags = [f"--config.model.persistent.{name}={value}" for name, value in changed]
    return " ".join(flags) or "the default (no flag)"


def describe(plans: tuple) -> str:
    """`persistent.variant_plans`'s plans in short: RxC u<units> s<stages> k<chunk> [mcA]
    [mcB] [sk] (A or B multicast, the backward's GEMM split between two warpgroups)."""

    def short(plan):
        grid = f"{plan.row_blocks}x{plan.col_blocks}"
        flags = [" mcA"] * plan.multicast_a + [" mcB"] * plan.multicast_b
        flags += [" sk"] * plan.split_k
        return f"{grid} u{plan.units_per_block} s{plan.stages} k{plan.k_chunk}{''.join(flags)}"

    layout, main, hyper = plans
    return f"{layout}: main {short(main)}, hyper {short(hyper)}"


def candidates(size: str, dtype: str, interpret: bool) -> list[tuple[str, str]]:
    """(variant text, its plans in short) of every candidate of ``size`` and ``dtype``."""
    hidden, hyper, _, batch, _ = SIZES[size]
    shape = (batch, hidden, hyper, dtype, interpret)
    found = persistent.variant_candidates(*shape)
    plans = (persistent.variant_plans(v, *shape) for v in found)
    return [(v.text(), describe(p)) for v, p in zip(found, plans, strict=True)]


def _alarm(signum, frame):
    raise CandidateTimeout


def step_shape(row: Row, interpret: bool) -> tuple[models.ModelConfig, int, int]:
    """(model config, batch, length) of ``row``'s training step."""
    _, _, _, batch, length = SIZES[row.size]
    return model_config(row.size, row.dtype, row.variant, interpret), batch, length


def compile_candidate(row: Row, interpret: bool):
    """`bench.compile_step` of ``row``'s variant: (compiled step, compile seconds)."""
    return bench.compile_step(*step_shape(row, interpret))


def time_candidate(row: Row, compiling, interpret: bool, repeats: int, limit: float) -> None:
    """Fills ``row`` from its compile (a future of `compile_candidate`; None: compiled here)
    and `bench.time_compiled`, or its failure, within ``limit`` seconds."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, max(limit, 0.01))
    try:
        if compiling is None:
            compiled, row.compile_s = compile_candidate(row, interpret)
        else:
            compiled, row.compile_s = compiling.result(timeout=max(limit, 0.01))
        args = bench.step_arrays(*step_shape(row, interpret))
        times = bench.time_compiled(compiled, args, repeats)
    except (CandidateTimeout, concurrent.futures.TimeoutError):
        row.status, row.error = "timeout", f"past its limit of {limit:.0f} s"
    except Exception as e:  # noqa: BLE001 (a failing candidate is a row)
        row.status, row.error = "failed", f"{type(e).__name__}: {' '.join(str(e).split())[:500]}"
        if CandidateTimeout.__name__ in str(e):  # the alarm went off inside a callback
            row.status, row.error = "timeout", f"past its limit of {limit:.0f} s"
    else:
        row.steps = len(times)
        row.step_ms_median = 1e3 * statistics.median(times)
        row.step_ms_min = 1e3 * min(times)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    if row.status != "ok":
        settle(interpret)


def settle(interpret: bool) -> None:
    """Waits out what a stopped candidate left running (its error with it), and interpret
    mode's shared state, so that the next candidate starts clean."""
    try:
        jax.effects_barrier()
    except Exception:  # noqa: BLE001 (the stopped candidate's own error)
        pass
    if interpret:
        gpu_interpret.reset_state()


def mark_winners(rows: list[Row]) -> dict[str, str]:
    """Marks the fastest ok row of each size and dtype; {"size dtype": its variant}."""
    winners = {}
    for key in dict.fromkeys((r.size, r.dtype) for r in rows):
        timed = [r for r in rows if (r.size, r.dtype) == key and r.status == "ok"]
        if timed:
            best = min(timed, key=lambda r: r.step_ms_median)
            best.winner = True
            winners[" ".join(key)] = best.variant
    return winners


def table(rows: list[Row]) -> str:
    """The markdown table: one line per row, the winner marked, times against the default's."""
    lines = [
        "| size | dtype | variant | plans | compile s | step ms | min ms | vs default | status |",
        "|---|---|---|---|---:|---:|---:|---:|---|",
    ]
    today = todays(rows)
    default = {(r.size, r.dtype): r.step_ms_median for r in rows if r.variant in today}
    for r in rows:
        ms = "" if r.step_ms_median is None else f"{r.step_ms_median:.2f}"
        low = "" if r.step_ms_min is None else f"{r.step_ms_min:.2f}"
        base = default.get((r.size, r.dtype))
        ratio = f"{r.step_ms_median / base:.2f}x" if base and r.step_ms_median else ""
        comp = "" if r.compile_s is None else f"{r.compile_s:.1f}"
        status = (
            ("**winner** " if r.winner else "")
            + r.status
            + (f": {r.error[:120]}" if r.error else "")
        )
        cells = [r.size, r.dtype, f"`{r.variant}`", r.plans, comp, ms, low, ratio, status]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write(path: str, rows: list[Row], args, winners: dict) -> None:
    if not path:
        return
    record = {
        "command": "python benchmarks/autotune_persistent.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "jax": jax.__version__,
        "device": bench.device_name(),
        "interpret": args.interpret,
        "budget_s": args.budget,
        "limit_s": args.limit,
        "repeats": args.repeats,
        "rows": [dataclasses.asdict(r) for r in rows],
        "winners": winners,
    }
    with open(path, "w") as out:
        json.dump(record, out, indent=1)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="paper", help=f"comma-separated: {', '.join(SIZES)}")
    p.add_argument("--dtypes", default="bfloat16", help="comma-separated: bfloat16, float32")
    p.add_argument("--repeats", type=int, default=10, help="timed steps per candidate")
    p.add_argument("--limit", type=float, default=60.0, help="seconds per candidate")
    p.add_argument("--budget", type=float, default=240.0, help="seconds for all candidates")
    p.add_argument("--compile_workers", type=int, default=1, help="candidates compiled at once")
    p.add_argument("--interpret", action="store_true", help="GPU interpret mode (a CPU)")
    p.add_argument("--list", action="store_true", help="print the candidates, time none")
    p.add_argument("--out", default="", help="write the rows as JSON here")
    args = p.parse_args(argv)
    args.sizes, args.dtypes = args.sizes.split(","), args.dtypes.split(",")
    unknown = [s for s in args.sizes if s not in SIZES] + [
        d for d in args.dtypes if d not in DTYPES
    ]
    if unknown:
        p.error(f"unknown size or dtype: {', '.join(unknown)}")
    if min(args.repeats, args.compile_workers) < 1 or args.limit <= 0 or args.budget <= 0:
        p.error("--repeats, --compile_workers, --limit and --budget must be positive")
    return args


def every_candidate(args: argparse.Namespace) -> list[Row]:
    """An untimed row per candidate of every size and dtype asked for, in order."""
    return [
        Row(size, dtype, text, plans)
        for size in args.sizes
        for dtype in args.dtypes
        for text, plans in candidates(size, dtype, args.interpret)
    ]


def todays(rows: list[Row]) -> set[str]:
    """Today's variant of each size and dtype: the first of its rows (`candidates`' order)."""
    first = {}
    for row in rows:
        first.setdefault((row.size, row.dtype), row.variant)
    return set(first.values())


def compile_pool(workers: int) -> concurrent.futures.ThreadPoolExecutor:
    """A pool for one group's compiles, its threads named COMPILE_THREADS (see `finish`)."""
    return concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix=COMPILE_THREADS)


def finish(code: int) -> int:
    """``code``; at once (os._exit) while a stopped candidate's compile still runs, which the
    interpreter's exit would wait for past the caller's timeout."""
    if any(t.name.startswith(COMPILE_THREADS) for t in threading.enumerate()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def run(args: argparse.Namespace) -> list[Row]:
    """Every candidate's row, in order, within the budget (the JSON written after each)."""
    rows = every_candidate(args)
    jax.block_until_ready(jax.numpy.ones(8) + 1)  # the backend's start, before any row
    start = time.perf_counter()
    todo = rows
    # the first alone (XLA's GEMM autotuning, cached for the rest); interpret mode's shared
    # state takes one kernel at a time: there every candidate compiles in this thread
    workers = 1 if args.interpret else args.compile_workers
    for group in [todo[:1]] + [todo[i : i + workers] for i in range(1, len(todo), workers)]:
        compiling = [None] * len(group)
        if len(group) > 1 and time.perf_counter() - start < args.budget:
            pool = compile_pool(len(group))  # threads of its own:
            compiling = [pool.submit(compile_candidate, row, args.interpret) for row in group]
            pool.shutdown(wait=False)  # a hung compile holds up no later group
        for row, future in zip(group, compiling, strict=True):
            left = args.budget - (time.perf_counter() - start)
            if left <= 0:
                row.status, row.error = "skipped", f"the budget of {args.budget:.0f} s was spent"
                continue
            time_candidate(row, future, args.interpret, args.repeats, min(args.limit, left))
            label = f"{row.size} {row.dtype} {row.variant}"
            print(f"{label}: {row.status} {row.step_ms_median or ''} {row.error[:200]}", flush=True)
        write(args.out, rows, args, {})
    return rows


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.list:
        for row in every_candidate(args):
            print(f"{row.size} {row.dtype} {row.variant}  ({row.plans})")
        return 0
    if args.interpret and gpu_interpret.unavailable() is not None:
        raise SystemExit(f"error: {gpu_interpret.unavailable('--interpret')}")
    if not args.interpret and jax.default_backend() != "gpu":
        raise SystemExit("error: no GPU here: give --interpret (jax >= 0.11.2) or --list")
    rows = run(args)
    winners = mark_winners(rows)
    write(args.out, rows, args, winners)
    print(table(rows))
    for key, text in winners.items():
        print(f"winner {key}: {config_flags(text)}")
    return finish(0 if winners else 1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
