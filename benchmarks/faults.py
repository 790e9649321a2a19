"""The fault table: the faults a new user meets, run as that user runs them, against a checkout.

    python benchmarks/faults.py --checkout=. --out=after.json
    python benchmarks/faults.py --checkout=/tmp/rhh-before --out=before.json
    python benchmarks/faults.py --table before.json after.json      # the markdown table

Every case is a command line (train.py, the tools, an installed command) run in a subprocess
with the Python running this script; the checkout's ``rhhjax`` comes first on PYTHONPATH (a
checkout without its install needs ``rhhjax/configs`` and ``rhhjax/kernels`` links to
``configs/`` and ``kernels/``). Recorded per case: the exit status, the number of stderr lines,
whether stderr holds a Python traceback (and how many lines it spans), and the line that
matters (the ``error:`` / ``warning:`` line, else the last line of stderr, else of stdout).

Memory cases run under ``ulimit -v`` (RLIMIT_AS, 8 GB): without it the first one grew to
23.8 GB on the 24 GB machine before the kernel killed it. Read-only folders and a full disk
are a read-only bind mount and a full tmpfs: those cases need root and are skipped without it.
The cases share one JAX compilation cache and one trained tiny workdir (text, 30,000
characters of Tiny Shakespeare, ``$RHHJAX_SHAKESPEARE``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from fault_harness import (
    MEMORY_LIMIT,
    ROOT,
    SHAKESPEARE,
    Context,
    damage,
    edit_config,
    full_disk,
    read_only_copy,
    run,
    summarize,
)

# ----------------------------------------------------------------------------- the cases


def memory_cases(ctx: Context) -> dict[str, Callable[[], dict]]:
    def train(*extra: str, name: str) -> Callable[[], dict]:
        return lambda: run(
            ctx.train(*extra, workdir=ctx.tmp / name), ctx, memory_limit=MEMORY_LIMIT
        )

    huge = ("eval.seq_len", "eval.batch_size", "train.batch_size")  # each 100,000,000
    cases = {
        f"memory: --config.{field}=100000000": train(f"--config.{field}=100000000", name=f"m{i}")
        for i, field in enumerate(huge, 1)
    }
    cases["memory: an out-of-memory at run time (check off, eval.batch_size=3000000)"] = train(
        "--config.train.check_memory=False", "--config.eval.batch_size=3000000", name="m4"
    )
    return cases


def output_cases(ctx: Context) -> dict[str, Callable[[], dict]]:
    a_file = ctx.tmp / "a_file"
    a_file.write_text("x")

    def with_ro(make: Callable[[Path, Path], list[str]], name: str) -> Callable[[], dict]:
        def case() -> dict:
            workdir = ctx.workdir(name)
            empty = ctx.tmp / f"{name}_empty"
            empty.mkdir(exist_ok=True)
            with read_only_copy(empty, f"{name}_ro", ctx) as ro:
                return run(make(workdir, ro), ctx)

        return case

    def with_file(make: Callable[[Path], list[str]], name: str) -> Callable[[], dict]:
        return lambda: run(make(ctx.workdir(name)), ctx)

    ablate = [ctx.config(), *ctx.data(), "--sweep=model.depth=1", "--max_steps=2"]
    analyze = ["--analyses=weights", "--impl="]
    return {
        "output: analyze --out=A_FILE": with_file(
            lambda w: ctx.tool("analyze", f"--workdir={w}", *analyze, f"--out={a_file}"), "o1"
        ),
        "output: analyze --out=READ_ONLY/x": with_ro(
            lambda w, ro: ctx.tool("analyze", f"--workdir={w}", *analyze, f"--out={ro}/x"), "o2"
        ),
        "output: plot W --out=A_FILE/bpc.png": with_file(
            lambda w: ctx.tool("plot", str(w), f"--out={a_file}/bpc.png"), "o3"
        ),
        "output: plot W --out=READ_ONLY/bpc.png": with_ro(
            lambda w, ro: ctx.tool("plot", str(w), f"--out={ro}/bpc.png"), "o4"
        ),
        "output: evaluate --output=A_FILE/r.json": with_file(
            lambda w: ctx.tool("evaluate", f"--workdir={w}", f"--output={a_file}/r.json"), "o5"
        ),
        "output: evaluate --output=READ_ONLY/r.json": with_ro(
            lambda w, ro: ctx.tool("evaluate", f"--workdir={w}", f"--output={ro}/r.json"), "o6"
        ),
        "output: ablate --out=A_FILE": lambda: run(
            ctx.tool("ablate", *ablate, f"--out={a_file}"), ctx
        ),
        "output: ablate --out=READ_ONLY/x": with_ro(
            lambda w, ro: ctx.tool("ablate", *ablate, f"--out={ro}/x"), "o8"
        ),
        "output: sample --output=READ_ONLY/s.txt": with_ro(
            lambda w, ro: ctx.tool("sample", f"--workdir={w}", f"--output={ro}/s.txt"), "o9"
        ),
    }


def text_case(ctx: Context) -> dict[str, Callable[[], dict]]:
    def case() -> dict:
        folder = ctx.tmp / "own_text"
        folder.mkdir(exist_ok=True)
        shutil.copy(SHAKESPEARE, folder / "input.txt")
        args = ctx.train(variant="cpu", text="input.txt", holdout=False)
        result = run(args, ctx, cwd=folder, stop_after=150)
        out = (folder / "workdirs" / "ptb_cpu" / "metrics.jsonl").is_file()
        result["trained"] = out
        return result

    return {"own text: the README's line on input.txt (1.1 MB), SIGTERM after 150 s": case}


def checkpoint_cases(ctx: Context) -> dict[str, Callable[[], dict]]:
    def evaluate(name: str, *flags: str, prepare=None) -> Callable[[], dict]:
        def case() -> dict:
            workdir = ctx.workdir(name)
            if prepare:
                prepare(workdir)
            return run(ctx.tool("evaluate", f"--workdir={workdir}", "--protocol=windows",
                                *flags), ctx)  # fmt: skip

        return case

    def empty_checksums(w: Path) -> None:
        damage(w, "best/6")
        (w / "best" / "6" / "checksums.json").write_text("{}\n")

    def both(w: Path) -> None:
        damage(w, "best/6")
        damage(w, "checkpoints/3")

    def disk_full(free: int) -> Callable[[], dict]:
        def case() -> dict:
            with full_disk(f"full{free}", ctx, free) as full:
                return run(ctx.train(workdir=full / "w"), ctx)

        return case

    return {
        "checkpoint: evaluate --checkpoint=3": evaluate("c1", "--checkpoint=3"),
        "checkpoint: evaluate --checkpoint=checkpoints/3": evaluate(
            "c2", "--checkpoint=checkpoints/3"
        ),
        "checkpoint: sample --checkpoint=3": lambda: run(
            ctx.tool("sample", f"--workdir={ctx.workdir('c3')}", "--checkpoint=3", "--length=20"),
            ctx,
        ),
        "checkpoint: evaluate, best/6 damaged": evaluate(
            "c4", prepare=lambda w: damage(w, "best/6")
        ),
        "checkpoint: evaluate, best/6 and checkpoints/3 damaged": evaluate("c5", prepare=both),
        "checkpoint: evaluate, best/6 truncated, its checksums.json {}": evaluate(
            "c6", prepare=empty_checksums
        ),
        "checkpoint: train on a full disk (0 bytes free), no checkpoint yet": disk_full(0),
        "checkpoint: train on a full disk (8 kB free), no checkpoint yet": disk_full(8192),
    }


def config_json_cases(ctx: Context) -> dict[str, Callable[[], dict]]:
    def case(how: str, program: str) -> Callable[[], dict]:
        def run_it() -> dict:
            workdir = ctx.workdir(f"e_{how}_{program}")
            edit_config(workdir, how)
            if program == "train":
                return run(ctx.train(workdir=workdir), ctx)
            if program == "sample":
                return run(ctx.tool("sample", f"--workdir={workdir}", "--length=20"), ctx)
            if program == "analyze":
                return run(ctx.tool("analyze", f"--workdir={workdir}", "--analyses=weights",
                                    f"--out={ctx.tmp / ('a_' + how)}"), ctx)  # fmt: skip
            return run(ctx.tool("evaluate", f"--workdir={workdir}", "--protocol=windows"), ctx)

        return run_it

    cases = {}
    for how in ("edited", "garbled", "deleted"):
        label = f"config.json {how}{' (hidden 16 -> 32)' if how == 'edited' else ''}"
        for program in ("evaluate", "sample", "analyze", "train"):
            if how == "edited" or program in ("evaluate", "train"):
                cases[f"{label}: {program}"] = case(how, program)
    return cases


def finished_case(ctx: Context) -> dict[str, Callable[[], dict]]:
    def case() -> dict:
        workdir = ctx.workdir("f1")
        with read_only_copy(workdir, "f1_ro", ctx) as ro:
            return run(ctx.train(workdir=ro), ctx)

    return {"finished run on a read-only workdir: train.py": case}


def install_cases(ctx: Context) -> dict[str, Callable[[], dict]]:
    def outside(args: Callable[[Path], list[str]]) -> Callable[[], dict]:
        def case() -> dict:
            target = ctx.installed()
            cwd = Path(tempfile.mkdtemp(dir=ctx.tmp))
            env = {**ctx.env, "PYTHONPATH": str(target)}
            try:
                return run(args(target), ctx, cwd=cwd, env=env)
            except FileNotFoundError as e:
                return summarize(127, "", f"{e}", 0.0)

        return case

    tiny = [*ctx.data(), "--workdir=w"]
    return {
        "installed: python -m rhhjax.tools.summary --config=configs/ptb.py": outside(
            lambda t: [ctx.python, "-m", "rhhjax.tools.summary", "--config=configs/ptb.py"]
        ),
        "installed: python -m rhhjax.tools.summary --config=ptb:cpu": outside(
            lambda t: [ctx.python, "-m", "rhhjax.tools.summary", "--config=ptb:cpu"]
        ),
        "installed: python -m rhhjax.train --config=ptb:tiny": outside(
            lambda t: [ctx.python, "-m", "rhhjax.train", "--config=ptb:tiny", *tiny]
        ),
        "installed: rhhjax-train --config=ptb:tiny": outside(
            lambda t: [str(t / "bin" / "rhhjax-train"), "--config=ptb:tiny", *tiny]
        ),
        "train.py --config.train.max_steps=1 (no --config)": lambda: run(
            [ctx.python, str(ctx.checkout / "train.py"), "--config.train.max_steps=1"], ctx
        ),
        "train.py --config=configs/ptb.py:tiny (the main command, from the checkout)": lambda: run(
            ctx.train(workdir=ctx.tmp / "main_cmd"), ctx
        ),
    }


def new_user_cases(ctx: Context) -> dict[str, Callable[[], dict]]:
    """What a new user met on the programs: help, ablate, signals, locks, memory, text."""
    text = [ctx.config(), *ctx.data()]

    def helps() -> dict:
        """Row 2: the flags each console command's --help lists (installed commands)."""
        bin_dir = ctx.installed() / "bin"
        env = {**ctx.env, "PYTHONPATH": str(ctx.installed())}
        script = "; ".join(
            f"printf '{c} %s, ' $({bin_dir}/rhhjax-{c} --help 2>/dev/null | "
            f"sed -n '/^Flags:/,$p' | grep -c '^  --')"
            for c in ("evaluate", "sample", "plot", "analyze", "ablate", "summary")
        )
        return run(["bash", "-c", script + "; echo '(flags listed)'"], ctx, env=env)

    def ablate(name: str, *args: str, stop_after: float | None = None) -> Callable[[], dict]:
        out = ctx.tmp / f"i43_{name}"
        return lambda: run(ctx.tool("ablate", *text, f"--out={out}", *args), ctx,
                           stop_after=stop_after, pick=r"^error:|ETA|^\| ")  # fmt: skip

    def evaluate_sigterm() -> dict:
        """Row 6: SIGTERM while evaluate reads its text (a named pipe: deterministic)."""
        workdir, fifo = ctx.workdir("i43_sig"), ctx.tmp / "i43_sig.fifo"
        fifo.unlink(missing_ok=True)
        os.mkfifo(fifo)
        args = ctx.tool("evaluate", f"--workdir={workdir}", f"--text_files={fifo}")
        start = time.time()
        proc = subprocess.Popen(args, cwd=ctx.tmp, env=ctx.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        with open(fifo, "wb"):  # returns once the program opened the pipe
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=120)
        return summarize(proc.returncode, out, err, time.time() - start)

    def in_use() -> dict:
        """Row 7: a second train on a workdir whose lock this process holds."""
        import fcntl

        workdir = ctx.tmp / "i43_lock"
        workdir.mkdir(exist_ok=True)
        with open(workdir / ".lock", "w") as held:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.write(f"{os.getpid()}\n")
            held.flush()
            return run(ctx.train(workdir=workdir), ctx)

    def fresh(name: str, *extra: str, pick: str | None = None, size: int | None = None):
        def case() -> dict:
            corpus = ctx.tmp / f"i43_{name}.txt"
            corpus.write_text(ctx.text.read_text()[:size] if size is not None else "")
            workdir = ctx.fresh(f"i43_{name}")
            return run(ctx.train(*extra, workdir=workdir, text=corpus, holdout=False), ctx,
                       pick=pick)  # fmt: skip

        return case

    def moved_text() -> dict:
        """Row 12: evaluate a run whose text file has moved since training."""
        corpus = ctx.tmp / "i43_moved.txt"
        shutil.copy(ctx.text, corpus)
        workdir = ctx.fresh("i43_moved")
        run(ctx.train("--config.train.max_steps=1", "--config.eval.final_protocols=",
                      workdir=workdir, text=corpus), ctx)  # fmt: skip
        corpus.unlink()
        return run(ctx.tool("evaluate", f"--workdir={workdir}"), ctx)

    def shadowed() -> dict:
        """Row 13: python train.py in a checkout whose rhhjax is installed non-editable
        (``python -S``: no editable finder; site-packages on PYTHONPATH for absl & co)."""
        import sysconfig

        copy = ctx.fresh("i43_checkout")
        skip = shutil.ignore_patterns("__pycache__", "configs", "kernels")  # a before-tree's links
        shutil.copytree(ctx.checkout / "rhhjax", copy / "rhhjax", ignore=skip)
        shutil.copytree(ctx.checkout / "configs", copy / "configs")
        shutil.copy(ctx.checkout / "train.py", copy / "train.py")
        env = {**ctx.env, "PYTHONPATH": sysconfig.get_paths()["purelib"]}
        return run([ctx.python, "-S", "train.py", "--config=configs/ptb.py:tiny"], ctx, cwd=copy,
                   env=env)  # fmt: skip

    def no_config_json() -> dict:
        """Row 14: config.json deleted from a finished run, then the same command again."""
        workdir = ctx.workdir("i43_nocfg")
        (workdir / "config.json").unlink()
        return run(ctx.train(workdir=workdir), ctx,
                   pick=r"already finished|final evaluation|^evaluating|^step ")  # fmt: skip

    return {
        "new user 2: --help of rhhjax-evaluate, sample, plot, analyze, ablate, summary": helps,
        "new user 3: ablate --sweep=model.hidden=8,-1 --max_steps=2": ablate(
            "sweep", "--sweep=model.hidden=8,-1", "--max_steps=2"
        ),
        "new user 4: ablate --sweep=model.depth=1 --max_steps=0 (SIGTERM after 60 s)": ablate(
            "zero", "--sweep=model.depth=1", "--max_steps=0", stop_after=60
        ),
        "new user 5: ablate --variant=foo --max_steps=1": ablate(
            "foo", "--variant=foo", "--max_steps=1"
        ),
        "new user 6: SIGTERM during evaluate": evaluate_sigterm,
        "new user 7: a second train on a workdir in use": in_use,
        "new user 8: the memory estimate at start-up (train, max_steps=1)": fresh(
            "memory",
            "--config.train.max_steps=1",
            "--config.data.hutter_holdout=3000",
            pick=r"^memory:|^error:|^training ",
            size=30_000,
        ),
        "new user 9: own text, a 2,048-character file (the data line)": fresh(
            "2kb", "--config.train.max_steps=1", pick=r"^data |^error:", size=2_048
        ),
        "new user 10: train --config.train.learning_rate=inf": fresh(
            "inf", "--config.train.learning_rate=inf", size=30_000
        ),
        "new user 11: an empty text file": fresh("empty"),
        "new user 12: evaluate a run whose text file has moved": moved_text,
        "new user 13: python train.py in a checkout shadowing a non-editable install": shadowed,
        "new user 14: config.json deleted from a finished run, train again": no_config_json,
    }


def turn6_cases(ctx: Context) -> dict[str, Callable[[], dict]]:
    """The sixth round of faults, a case per row (row 8: tests/test_tools_plot.py)."""
    t = "--config.train."
    budget = [f"{t}max_steps=0", f"{t}max_epochs=0", f"{t}patience=0", f"{t}schedule=cosine"]

    def train(name: str, *extra: str, pick: str | None = None, twice: bool = False):
        def case() -> dict:
            workdir = ctx.fresh(name)
            if twice:
                run(ctx.train(*extra, workdir=workdir), ctx)
            row = run(ctx.train(*extra, workdir=workdir), ctx, pick=pick)
            latest = workdir / "checkpoints"
            row["checkpoints"] = sorted(p.name for p in latest.iterdir()) if latest.is_dir() else []
            return row

        return case

    def resumed(name: str, first: list[str], then: list[str], pick: str) -> Callable[[], dict]:
        def case() -> dict:
            workdir = ctx.fresh(name)
            run(ctx.train(*first, workdir=workdir), ctx)
            return run(ctx.train(*then, workdir=workdir), ctx, pick=pick)

        return case

    def params(name: str, swap: bool) -> Callable[[], dict]:
        def case() -> dict:
            script = [ctx.python, str(ctx.checkout / "benchmarks" / "params_files.py")]
            out = ctx.fresh(f"{name}_out")
            if not swap:
                return run([*script, "import", str(ctx.tmp / "no_such_folder"), str(out)], ctx)
            run([*script, "export", str(ctx.workdir(name)), str(out), "--parts=2"], ctx)
            a, b = out / "params_0.npy", out / "params_1.npy"
            first = a.read_bytes()
            a.write_bytes(b.read_bytes())
            b.write_bytes(first)
            return run([*script, "import", str(out), str(ctx.tmp / f"{name}_back")], ctx)

        return case

    def two_runs() -> dict:
        """Row 10: a second train on an existing workdir, a second after the first started."""
        workdir = ctx.fresh("t6_two")
        workdir.mkdir()
        first = subprocess.Popen(ctx.train(workdir=workdir), cwd=ctx.tmp, env=ctx.env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        time.sleep(1.0)
        row = run(ctx.train(workdir=workdir), ctx)
        first.wait(timeout=600)
        return row

    def evaluate_persistent() -> dict:
        return run(ctx.tool("evaluate", f"--workdir={ctx.workdir('t6_eval')}", "--impl=persistent"),
                   ctx)  # fmt: skip

    variant = "--config.model.impl=persistent"
    return {
        "turn 6, row 1: a budget too short for its warm-up (0.01 min, warmup_steps=200)": train(
            "t6_r1", *budget, f"{t}budget_minutes=0.01", f"{t}warmup_steps=200"
        ),
        "turn 6, row 2: schedule=cosine with max_minutes=0.2": train(
            "t6_r2a", f"{t}max_steps=0", f"{t}max_minutes=0.2", f"{t}schedule=cosine"
        ),
        "turn 6, row 2: max_epochs=1 (300 steps), warmup_steps=1000": train(
            "t6_r2b",
            f"{t}max_steps=0",
            f"{t}max_epochs=1",
            f"{t}schedule=cosine",
            f"{t}warmup_steps=1000",
            pick=r"^error:|^training stopped",
        ),  # fmt: skip
        "turn 6, row 3: a budget of 60 steps stopped at 3, resumed with budget_minutes=0.02": (
            resumed(
                "t6_r3",
                [f"{t}max_steps=3", f"{t}budget_minutes=0.01", f"{t}budget_step_seconds=0.01"],
                [f"{t}max_steps=0", f"{t}budget_minutes=0.02", f"{t}budget_step_seconds=0.01"],
                pick=r"^error:|^training stopped",
            )
        ),
        "turn 6, row 4: a finished budget run rerun with max_steps=4000": resumed(
            "t6_r4",
            [f"{t}max_steps=0", f"{t}budget_minutes=0.001", f"{t}budget_step_seconds=0.01"],
            [f"{t}max_steps=4000", f"{t}budget_minutes=0.001", f"{t}budget_step_seconds=0.01"],
            pick=r"already finished",
        ),
        "turn 6, row 5: budget_minutes=0.05, warmup_steps=100, the second run": train(
            "t6_r5",
            *budget,
            f"{t}budget_minutes=0.05",
            f"{t}warmup_steps=100",
            f"{t}eval_every_steps=5",
            twice=True,
        ),  # fmt: skip
        "turn 6, row 6: params_files import of swapped parts": params("t6_r6", swap=True),
        "turn 6, row 7: params_files import no_such_folder": params("t6_r7", swap=False),
        "turn 6, row 9: resume with learning_rate 1e-3 -> 1e-2": lambda: run(
            ctx.train(f"{t}max_steps=8", f"{t}learning_rate=0.01", workdir=ctx.workdir("t6_r9")),
            ctx,
            pick=r"^resum",
        ),
        "turn 6, row 10: a second train on an existing workdir, 1 s after the first": two_runs,
        "turn 6, row 11: model.persistent.stages=-3": train(
            "t6_r11a", variant, "--config.model.persistent.stages=-3"
        ),
        "turn 6, row 11: model.persistent.sharing=both": train(
            "t6_r11b", variant, "--config.model.persistent.sharing=both"
        ),
        "turn 6, row 11: evaluate --impl=persistent on a CPU": evaluate_persistent,
    }


GROUPS = {
    "memory": memory_cases,
    "output": output_cases,
    "text": text_case,
    "checkpoint": checkpoint_cases,
    "config_json": config_json_cases,
    "finished": finished_case,
    "install": install_cases,
    "new_user": new_user_cases,
    "turn6": turn6_cases,
}
NEEDS_ROOT = re.compile(r"READ_ONLY|read-only|full disk")


def normalized(rows: dict) -> dict:
    """``rows`` with the temporary folder of the run written as ``$TMP``."""
    text = json.dumps(rows)
    return json.loads(re.sub(r"/tmp/rhhjax-faults-[A-Za-z0-9_]+", "$TMP", text))


def _cell(row: dict | None) -> str:
    """exit status, stderr lines (traceback lines), the line, as one table cell group."""
    if not row:
        return "- | - | -"
    if "skipped" in row:
        return f"- | - | skipped: {row['skipped']}"
    tb = f" ({row['traceback_lines']}-line traceback)" if row["traceback_lines"] else ""
    line = row["line"].replace("|", "\\|")
    return f"{row['exit']} | {row['stderr_lines']}{tb} | `{line}`"


def table(before: dict, after: dict) -> str:
    """The fault table in markdown: every case of ``after``, before and after."""
    header = "before: exit | stderr lines | the line | after: exit | stderr lines | the line"
    lines = [f"| fault | {header} |", "|---|---|---|---|---|---|---|"]
    for name, row in after.items():
        lines.append(f"| {name} | {_cell(before.get(name))} | {_cell(row)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", type=Path, default=ROOT)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--only", default="", help="comma list of groups: " + ", ".join(GROUPS))
    parser.add_argument("--table", nargs=2, type=Path, metavar=("BEFORE", "AFTER"),
                        help="print the markdown table of two runs' JSON instead")  # fmt: skip
    args = parser.parse_args()
    if args.table:
        before, after = (normalized(json.loads(p.read_text())) for p in args.table)
        print(table(before, after), end="")
        return
    if args.out is None:
        parser.error("--out is required")
    groups = [g for g in args.only.split(",") if g] or list(GROUPS)
    rows = json.loads(args.out.read_text()) if args.out.is_file() else {}
    with tempfile.TemporaryDirectory(prefix="rhhjax-faults-") as tmp:
        ctx = Context(args.checkout, Path(tmp))
        for group in groups:
            for name, case in GROUPS[group](ctx).items():
                if NEEDS_ROOT.search(name) and os.geteuid() != 0:
                    rows[name] = {"skipped": "needs root (a bind mount or a tmpfs)"}
                    continue
                rows[name] = {"group": group, **case()}
                print(json.dumps({name: rows[name]}), flush=True)
                args.out.write_text(json.dumps(normalized(rows), indent=2) + "\n")


if __name__ == "__main__":
    main()
