"""The command lines as a user runs them (subprocesses): train.py, rhhjax.tools.evaluate,
rhhjax.tools.sample, rhhjax.tools.plot -- bad input, SIGTERM and resume, default workdir.

The subprocesses share a persistent JAX compilation cache (a temporary folder) so only the
first one pays for compiling the tiny model.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import PTB_CONFIG, ROOT, write_text


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    cache = tmp_path_factory.mktemp("jax_cache")
    return {
        **os.environ,
        "JAX_COMPILATION_CACHE_DIR": str(cache),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "PYTHONUNBUFFERED": "1",
    }


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    return write_text(tmp_path_factory.mktemp("data") / "shake.txt")


def train_args(text_file: Path, *extra: str, workdir: Path | None = None) -> list[str]:
    args = [
        sys.executable,
        str(ROOT / "train.py"),
        f"--config={PTB_CONFIG}:tiny",
        "--config.data.format=text",
        f"--config.data.text_files={text_file}",
        "--config.data.hutter_holdout=3000",
        *extra,
    ]
    if workdir is not None:
        args.append(f"--workdir={workdir}")
    return args


def run(args, env, cwd=ROOT, timeout=240):
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


# ----------------------------------------------------------------------------- bad input


# The layers a command line goes through: flag parsing (typo, variant, bad value, stray
# argument), config validation (depth), the workdir and the data. Each field's own check is
# tested in-process (tests/test_train_trainer.py BAD_CONFIGS).
BAD = {
    "depth": (lambda tmp, tf: tmp / "w", ["--config.model.depth=0"], "model.depth=0"),
    "missing data": (
        lambda tmp, tf: tmp / "w",
        ["--config.data.text_files=/nonexistent/corpus.txt"],
        "/nonexistent/corpus.txt",
    ),
    "unwritable": (lambda tmp, tf: tmp / "a_file" / "w", [], "not a directory"),
    "typo": (
        lambda tmp, tf: tmp / "w",
        ["--config.model.dept=3"],
        "unknown config field model.dept (did you mean model.depth?)",
    ),
    "variant": (
        lambda tmp, tf: tmp / "w",
        [f"--config={PTB_CONFIG}:gpu"],
        "unknown variant 'gpu' of configs/ptb.py",
    ),
    "bad value": (
        lambda tmp, tf: tmp / "w",
        ["--config.model.depth=abc"],
        "--config.model.depth=abc",
    ),
    "stray argument": (lambda tmp, tf: tmp / "w", ["extra"], "unexpected arguments: extra"),
    "persistent field": (
        lambda tmp, tf: tmp / "w",
        ["--config.model.persistent.sharing=both"],
        "model.persistent: sharing='both' is not one of",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, text_file, env, case):
    make_workdir, extra, needle = BAD[case]
    (tmp_path / "a_file").write_text("x")
    workdir = make_workdir(tmp_path, text_file)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    proc = run(train_args(text_file, *extra, workdir=workdir), env)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert needle in lines[0]
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before  # nothing created


@pytest.mark.parametrize("tool", ["evaluate", "sample"])
def test_an_output_file_that_cannot_be_written_is_one_line_before_any_loading(tmp_path, env, tool):
    """evaluate --output=A_FILE/r.json was a 24-line traceback after the evaluation had run
    (the work lost); sample had no --output. Now one line, before the workdir (here not a
    workdir at all) is read."""
    (tmp_path / "a_file").write_text("x")
    args = [f"--workdir={tmp_path}", f"--output={tmp_path / 'a_file' / 'r.json'}"]
    proc = run([sys.executable, "-m", f"rhhjax.tools.{tool}", *args], env)
    assert proc.returncode == 1
    assert (
        proc.stderr
        == f"error: --output={tmp_path}/a_file/r.json: {tmp_path}/a_file is a file, not a folder\n"
    )


# ----------------------------------------------------------------------------- SIGTERM, resume


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory, text_file, env):
    """Start a long run without --workdir (-> workdirs/ptb_tiny), SIGTERM it after its first
    checkpoint, then rerun the same command with a near step bound: (workdir, outputs)."""
    cwd = tmp_path_factory.mktemp("cwd")
    workdir = cwd / "workdirs" / "ptb_tiny"
    args = train_args(
        text_file,
        "--config.train.max_steps=1000000",
        "--config.train.eval_every_steps=1000000",
        "--config.train.checkpoint_every_steps=5",
        "--config.train.log_every_steps=25",
    )
    proc = subprocess.Popen(
        args, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    ckpt_dir = workdir / "checkpoints"
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None:
        if ckpt_dir.is_dir() and any(p.name.isdigit() for p in ckpt_dir.iterdir()):
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    first = (proc.returncode, stdout, stderr)
    steps = sorted(int(p.name) for p in ckpt_dir.iterdir() if p.name.isdigit())
    second = run(
        [
            *args[:-4],
            f"--config.train.max_steps={steps[-1] + 4}",
            "--config.train.eval_every_steps=2",
            "--config.train.checkpoint_every_steps=5",
            "--config.train.log_every_steps=25",
        ],
        env,
        cwd=cwd,
    )
    return workdir, steps, first, second


def test_sigterm_saves_and_exits_143(interrupted):
    workdir, steps, (code, stdout, stderr), _ = interrupted
    assert code == 128 + signal.SIGTERM, stderr
    assert "received SIGTERM" in stdout and "stopped by SIGTERM" in stdout
    assert steps[-1] >= 5
    events = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    stops = [e for e in events if e.get("event") == "stop"]
    assert stops[0]["reason"] == "signal" and stops[0]["step"] == steps[-1]
    assert not (workdir / "results.json").exists() or stops[-1]["reason"] != "signal"


def test_rerun_resumes_to_the_end(interrupted):
    workdir, steps, _, second = interrupted
    assert second.returncode == 0, second.stderr
    assert f"from step {steps[-1]}" in second.stdout
    results = json.loads((workdir / "results.json").read_text())
    assert results["step"] == steps[-1] + 4 and results["status"] == "finished"
    assert "paper_test_mask95" in results["final"]["test"]
    assert "paper_test_mask95" in second.stdout  # the printed table
    assert second.stderr.strip() == ""


def test_evaluate_cli(interrupted, env, tmp_path):
    workdir = interrupted[0]
    out = tmp_path / "eval.json"
    proc = run(
        [
            sys.executable,
            "-m",
            "rhhjax.tools.evaluate",
            f"--workdir={workdir}",
            "--split=test",
            "--protocol=windows,paper",
            "--checkpoint=best",
            f"--output={out}",
        ],
        env,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(out.read_text())
    assert set(got["results"]["test"]) == {"windows", "paper", "paper_test_mask95"}
    assert got["results"]["test"]["windows"]["chars"] == 2999
    final = json.loads((workdir / "results.json").read_text())["final"]
    assert got["results"]["test"]["windows"] == final["test"]["windows"]
    assert "paper_test_mask95" in proc.stdout


def test_sample_cli(interrupted, env):
    workdir = interrupted[0]
    args = [
        sys.executable,
        "-m",
        "rhhjax.tools.sample",
        f"--workdir={workdir}",
        "--prompt=Thou",  # in Tiny Shakespeare and in write_text's stand-in alike
        "--length=30",
        "--temperature=0.8",
        "--seed=3",
    ]
    a = run(args, env)
    assert a.returncode == 0, a.stderr
    assert a.stdout.startswith("Thou")
    assert len(a.stdout) == len("Thou") + 30 + 1  # print() adds the last newline
    bad = run([*args[:3], "--workdir=/nonexistent/run"], env)
    assert bad.returncode == 1 and bad.stderr.strip().splitlines() == [
        "error: workdir /nonexistent/run does not exist"
    ]


def test_plot_cli(interrupted, env):
    workdir = interrupted[0]
    proc = run([sys.executable, "-m", "rhhjax.tools.plot", str(workdir)], env)
    assert proc.returncode == 0, proc.stderr
    assert (workdir / "bpc.png").read_bytes()[:4] == b"\x89PNG"


def _signal_during_startup(tmp_path, text_file, env, count: int):
    """Send ``count`` SIGTERMs while the run is loading its data: the corpus is a named pipe,
    so the run blocks reading it (after the signal catcher started) until the test has sent
    the signals and then writes the text. Deterministic on a fast or a loaded machine."""
    workdir = tmp_path / "w"
    fifo = tmp_path / "corpus.fifo"
    os.mkfifo(fifo)
    args = [
        a if not a.startswith("--config.data.text_files=") else f"--config.data.text_files={fifo}"
        for a in train_args(text_file, workdir=workdir)
    ]
    proc = subprocess.Popen(
        args, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    with open(fifo, "wb") as pipe:  # returns once the run has opened the pipe for reading
        for _ in range(count):
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.2)
        try:
            pipe.write(text_file.read_bytes())
        except BrokenPipeError:  # the second signal ended the run at once
            pass
    stdout, stderr = proc.communicate(timeout=120)
    return proc.returncode, stdout, stderr, workdir


def test_sigterm_during_startup_is_acknowledged(tmp_path, text_file, env):
    code, stdout, stderr, workdir = _signal_during_startup(tmp_path, text_file, env, 1)
    assert code == 143, (stdout, stderr)
    assert "received SIGTERM" in stdout and "before training started" in stdout
    assert stderr.strip() == ""
    assert not workdir.exists()  # nothing written


def test_second_signal_aborts_with_one_line(tmp_path, text_file, env):
    code, stdout, stderr, _ = _signal_during_startup(tmp_path, text_file, env, 2)
    assert code == 143, (stdout, stderr)
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: aborted by a second SIGTERM"), stderr


@pytest.mark.parametrize("module", ["rhhjax.tools.summary", "rhhjax.tools.ablate"])
def test_other_config_programs_report_typos_in_one_line(tmp_path, env, module):
    proc = run(
        [
            sys.executable,
            "-m",
            module,
            f"--config={PTB_CONFIG}:tiny",
            "--config.train.max_setps=3",
            f"--out={tmp_path / 'out'}",
        ],
        env,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: unknown config field train.max_setps (did you mean train.max_steps?)"
    ]
