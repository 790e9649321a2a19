"""Shared pieces of the training tests (tests/test_train_*.py, tests/test_tools_*.py that read a
trained run; not collected: no ``test_`` prefix).

Fixtures, assigned in the test files that use them (``text_file = train_cases.text_file``):
``text_file`` (the first 30,000 characters of Tiny Shakespeare, or the stand-in of
``helpers.write_text``, split 24,000 / 3,000 / 3,000 by the tiny config) and ``trained`` (one
tiny run: 6 steps, validation at 3 and 6), each made once per test process and shared by the
files it runs: tests that read the trained run must not change it (copy it first).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import tiny_run_config, write_text

from rhhjax.train import checkpoint as ckpt_lib
from rhhjax.train import step as step_lib
from rhhjax.train import trainer

TIMING_FIELDS = ("time", "chars_per_sec", "seconds", "train_seconds")
HAS_TENSORBOARDX = importlib.util.find_spec("tensorboardX") is not None

_SHARED: dict[tuple[str, str], object] = {}  # (base temp folder, what) -> the shared thing


def quiet(message: str) -> None:
    """A ``log`` that drops every line."""
    del message


def _once(tmp_path_factory, what: str, make):
    key = (str(tmp_path_factory.getbasetemp()), what)
    if key not in _SHARED:
        _SHARED[key] = make()
    return _SHARED[key]


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    """The shared training text (a file of 30,000 characters)."""
    return _once(
        tmp_path_factory, "text", lambda: write_text(tmp_path_factory.mktemp("data") / "shake.txt")
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory, text_file):
    """The shared tiny run: (workdir, config, results, its log lines)."""

    def train():
        workdir = tmp_path_factory.mktemp("runs") / "tiny"
        lines: list[str] = []
        cfg = tiny_run_config(text_file, train__tensorboard=HAS_TENSORBOARDX)
        results = trainer.train_and_evaluate(cfg, workdir, log=lines.append)
        return workdir, cfg, results, lines

    return _once(tmp_path_factory, "trained", train)


def records(workdir: Path, kinds=("train", "valid")) -> list[dict]:
    """The records of ``kinds`` in ``workdir/metrics.jsonl``, without their timing fields."""
    out = []
    for line in (workdir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["kind"] in kinds:
            out.append({k: v for k, v in r.items() if k not in TIMING_FIELDS})
    return out


def latest_params(workdir: Path):
    """(params, meta) of the latest checkpoint of ``workdir``."""
    with ckpt_lib.Checkpoints(workdir, read_only=True) as c:
        params, meta = c.restore_params("latest")
    return params, meta


def strict_json(text: str):
    """``json.loads`` that refuses NaN and Infinity (what other JSON readers refuse)."""

    def refuse(name):
        raise ValueError(f"invalid JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def wrap_train_step(monkeypatch, wrap) -> None:
    """Every run's training step becomes ``wrap(step_fn)`` (the trainer's ``make_train_step``
    patched in its module)."""
    real = step_lib.make_train_step
    monkeypatch.setattr(step_lib, "make_train_step", lambda mc, oc, seed: wrap(real(mc, oc, seed)))


def slow_steps(monkeypatch, seconds: float, signal_at: int | None = None, executed=None):
    """Patch the train step so that each one takes ``seconds`` more on the device (a host
    callback that sleeps), and the one of 0-based index ``signal_at`` sends this process a
    SIGTERM while it runs. ``executed`` collects the indices as the device runs them."""
    import signal as signal_lib
    import time

    def slow(step):
        time.sleep(seconds)
        if executed is not None:
            executed.append(int(step))
        if signal_at is not None and int(step) == signal_at:
            os.kill(os.getpid(), signal_lib.SIGTERM)
        return np.float32(0.0)

    @jax.jit
    def delay(loss, step):
        zero = jax.pure_callback(slow, jax.ShapeDtypeStruct((), jnp.float32), step)
        return loss + zero

    def wrap(fn):
        def wrapped(params, opt_state, carry, inputs, targets, reset, step, retry):
            out = fn(params, opt_state, carry, inputs, targets, reset, step, retry)
            return (*out[:3], delay(out[3], step), out[4])

        return wrapped

    wrap_train_step(monkeypatch, wrap)


def _bytes(text: str) -> float:
    number, unit = text.split()
    return float(number.replace(",", "")) * {"kB": 1e3, "MB": 1e6, "GB": 1e9}[unit]


def assert_space_consistent(message: str) -> None:
    """A full-disk line states the space a write needs so that it cannot contradict itself:
    "it needs about X, Y free" with X > Y, or "it needs more than the Y free"."""
    size = r"([\d.,]+ [kMG]B)"
    about = re.search(rf"it needs about {size}, {size} free", message)
    more = re.search(rf"it needs more than the {size} free", message)
    assert about or more, message
    if about:
        assert _bytes(about.group(1)) > _bytes(about.group(2)), message
