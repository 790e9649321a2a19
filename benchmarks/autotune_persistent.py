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
interpret mode on a CPU (jax >= 0.11.2). ``--skip=JSON``: leave out what an earlier JSON timed
or saw fail, but the default and its winner (this machine's baselines). ``--with=TEXT``
(e.g. status=poison): its fields set in every candidate but the default, where they run.
``--only=TEXT`` (e.g. layout=rowgroup): the default and the candidates with its fields.
``--next_call=TESTS_LOG`` times nothing: it prints the loan's training impl and variant from
the model's compiled-test log and the --out JSON's winner (`gpu_suite.sh check`); nor do
``--untested_k`` (the -k expression of the compiled test classes of the variant fields no
GPU has tested, `persistent.UNTESTED_ON_A_GPU`) and ``--untested_guard=LOG`` (``field=0``
for --only, for each of those whose class did not all pass in LOG).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import re
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
        pallas_mode="interpret" if interpret else "auto", persistent_variant=variant,
    )  # fmt: skip


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


def candidates(
    size: str, dtype: str, interpret: bool, with_text: str = ""
) -> list[tuple[str, str]]:
    """(variant text, its plans in short) of every candidate of ``size`` and ``dtype``; with
    ``with_text`` (e.g. "status=poison") its fields set in each but today's, where they run."""
    hidden, hyper, _, batch, _ = SIZES[size]
    shape = (batch, hidden, hyper, dtype, interpret)
    found = persistent.variant_candidates(*shape)
    if with_text:
        default = persistent.PersistentVariant()
        fields = dataclasses.asdict(persistent.parse_variant(with_text) or default)
        lever = {k: v for k, v in fields.items() if v != getattr(default, k)}
        found = persistent.with_lever(found, lever, *shape)
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


def model_tests_passed(log: str, test_class: str = "TestPersistentCompiled") -> bool:
    """Whether a `pytest -v` log (with xdist or without) ran to its summary with
    ``test_class`` passing and nothing failed, erroring or cut by a timeout."""
    named = re.escape(test_class) + "::"
    passed = re.search(f"PASSED.*{named}|{named}.*PASSED", log)
    finished = re.search(r"=+ \d+ passed.* in [\d.]+s", log)
    return bool(passed and finished and not re.search(r"FAILED|ERROR|Timeout", log))


def untested_class(field: str) -> str:
    """The compiled model test class of an untested variant field (tests/test_ops_persistent.py)."""
    return "TestPersistentCompiled" + "".join(map(str.capitalize, field.split("_")))


def class_passed(log: str, test_class: str) -> bool:
    """Whether a `pytest -v` log ran to its summary, uncut by a timeout, with every result
    line of ``test_class`` a pass (and one at least)."""
    named = re.escape(test_class) + "::"
    results = [
        line for line in log.splitlines() if re.search(f"(PASSED|FAILED|ERROR).*{named}", line)
    ]
    finished = re.search(r"=+ .*\d+ (passed|failed).* in [\d.]+s", log)
    passes = [line for line in results if "PASSED" in line]
    return bool(passes and len(passes) == len(results) and finished and "Timeout" not in log)


def untested_guard(log: str) -> str:
    """``field=0,...`` for each `persistent.UNTESTED_ON_A_GPU` field whose class did not all
    pass in ``log`` (the untested classes' own run): --only then leaves its variants out."""
    failed = [f for f in persistent.UNTESTED_ON_A_GPU if not class_passed(log, untested_class(f))]
    return ",".join(f"{field}=0" for field in failed)


def next_call(tests_log: str, autotune: dict) -> tuple[str, str]:
    """(impl, persistent_variant) for the loan's training call: `persistent` and the (one
    size and dtype's) winner when every model test passed and a winner was timed, else
    `fused`."""
    winner = next(iter(autotune.get("winners", {}).values()), None)
    if model_tests_passed(tests_log) and winner:
        return "persistent", winner
    return "fused", "default"


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
    p.add_argument("--skip", default="", help="an earlier --out JSON: its variants left out")
    p.add_argument("--with", dest="with_text", default="", help="fields set in every candidate")
    p.add_argument("--only", default="", help="fields a candidate must have (today's kept)")
    p.add_argument("--next_call", default="", help="a test log: print the training impl")
    p.add_argument("--untested_k", action="store_true", help="print the untested classes' -k")
    p.add_argument("--untested_guard", default="", help="their test log: print --only fields")
    args = p.parse_args(argv)
    args.sizes, args.dtypes = args.sizes.split(","), args.dtypes.split(",")
    unknown = [s for s in args.sizes if s not in SIZES] + [
        d for d in args.dtypes if d not in DTYPES
    ]
    if unknown:
        p.error(f"unknown size or dtype: {', '.join(unknown)}")
    for flag, text in (("--with", args.with_text), ("--only", args.only)):
        try:
            persistent.parse_variant(text or persistent.DEFAULT_TEXT)
        except persistent.VariantError as error:
            p.error(f"{flag}={text}: {error}")
    if min(args.repeats, args.compile_workers) < 1 or args.limit <= 0 or args.budget <= 0:
        p.error("--repeats, --compile_workers, --limit and --budget must be positive")
    return args


def every_candidate(args: argparse.Namespace) -> list[Row]:
    """An untimed row per candidate of every size and dtype asked for, in order; with
    --only, today's and those with its fields."""
    rows = []
    for size in args.sizes:
        for dtype in args.dtypes:
            found = candidates(size, dtype, args.interpret, args.with_text)
            today = found[0][0]
            rows += [
                Row(size, dtype, text, plans)
                for text, plans in found
                if not args.only or text == today or has_fields(text, args.only)
            ]
    return rows


def todays(rows: list[Row]) -> set[str]:
    """Today's variant of each size and dtype: the first of its rows (`candidates`' order)."""
    first = {}
    for row in rows:
        first.setdefault((row.size, row.dtype), row.variant)
    return set(first.values())


def has_fields(text: str, only: str) -> bool:
    """Whether variant ``text`` has every field that ``only`` gives."""
    variant, wanted = persistent.parse_variant(text), persistent.parse_variant(only)
    if wanted is None:
        return True
    keys = [item.partition("=")[0].strip() for item in only.split(",") if item.strip()]
    return all(getattr(variant, k) == getattr(wanted, k) for k in keys)


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


def skip_timed(rows: list[Row], earlier: dict, source: str) -> None:
    """Marks skipped the rows ``earlier`` (an --out record) timed or saw fail, except the
    default and its winners, which are timed again."""
    keep = {*todays(rows), *earlier.get("winners", {}).values()}
    done = {(r["size"], r["dtype"], r["variant"]): r for r in earlier.get("rows", [])}
    for row in rows:
        before = done.get((row.size, row.dtype, row.variant))
        if row.variant not in keep and before and before["status"] in ("ok", "failed"):
            ms = before["step_ms_median"]
            figure = f"{ms:.2f} ms" if ms is not None else before["status"]
            row.status, row.error = "skipped", f"{figure} in {source}"


def run(args: argparse.Namespace) -> list[Row]:
    """Every candidate's row, in order, within the budget (the JSON written after each)."""
    rows = every_candidate(args)
    if args.skip:
        with open(args.skip) as earlier:
            skip_timed(rows, json.load(earlier), args.skip)
    jax.block_until_ready(jax.numpy.ones(8) + 1)  # the backend's start, before any row
    start = time.perf_counter()
    todo = [row for row in rows if row.status != "skipped"]
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
    if args.next_call:
        with open(args.next_call) as log, open(args.out) as record:
            print(*next_call(log.read(), json.load(record)))
        return 0
    if args.untested_k:
        print(" or ".join(map(untested_class, persistent.UNTESTED_ON_A_GPU)))
        return 0
    if args.untested_guard:  # a log never written: nothing passed
        log = args.untested_guard
        print(untested_guard(open(log).read() if os.path.exists(log) else ""))
        return 0
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
        print(f"winner {key}: model.persistent_variant={text!r}")
    return finish(0 if winners else 1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
