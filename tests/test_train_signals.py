"""SIGTERM in a run (`rhhjax.train.signals`): the run stops after the step in flight and saves
it; during the initialisation nothing is written.
"""

from __future__ import annotations

import os

import train_cases
from helpers import tiny_run_config as tiny_config
from train_cases import (
    slow_steps,
)

from rhhjax.train import checkpoint as ckpt_lib
from rhhjax.train import trainer

text_file = train_cases.text_file  # a shared fixture (tests/train_cases.py)


def test_sigterm_stops_after_the_step_in_flight(tmp_path, text_file, monkeypatch):
    """Asynchronous dispatch must not queue steps ahead: a SIGTERM that arrives while the
    device runs step 3 stops the run at step 3 or 4 (the one in flight), not at the bound."""
    executed: list[int] = []
    slow_steps(monkeypatch, 0.2, signal_at=2, executed=executed)
    cfg = tiny_config(
        text_file,
        train__max_steps=30,
        train__eval_every_steps=100,
        train__log_every_steps=100,
    )
    lines: list[str] = []
    results = trainer.train_and_evaluate(cfg, tmp_path / "run", log=lines.append)
    assert results["status"] == "interrupted" and results["exit_code"] == 143
    assert results["step"] in (3, 4), results["step"]
    assert max(executed) + 1 <= 4  # no step queued behind the one in flight ran
    assert any("stopping after the current step" in line for line in lines)
    assert any("send SIGTERM again to abort now" in line for line in lines)
    with ckpt_lib.Checkpoints(tmp_path / "run", read_only=True) as c:
        assert c.latest_step() == results["step"]


def test_a_signal_during_initialisation_writes_nothing(tmp_path, text_file, monkeypatch):
    """SIGTERM while the model initialises (a minute for the paper model on a CPU) used to be
    acted on only in the loop: config.json, metrics and a step-0 checkpoint of an untrained
    model were written. Now the run stops after the initialisation and writes nothing."""
    import signal as signal_lib

    from rhhjax.train import state as state_lib

    real = state_lib.make_init

    def init_then_signal(mc):
        fn = real(mc)

        def wrapped(key):
            params = fn(key)
            os.kill(os.getpid(), signal_lib.SIGTERM)
            return params

        return wrapped

    monkeypatch.setattr(state_lib, "make_init", init_then_signal)
    lines: list[str] = []
    workdir = tmp_path / "run"
    results = trainer.train_and_evaluate(tiny_config(text_file), workdir, log=lines.append)
    assert results["status"] == "interrupted" and results["exit_code"] == 143
    assert results["step"] is None and not workdir.exists()
    assert "stopped by SIGTERM before training started; nothing was written" in lines
