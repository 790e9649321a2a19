"""Resuming from the saved state (`rhhjax.train.state`): a stopped or killed run resumed equals the
uninterrupted one bit for bit, other models and optimizers resume, and so do checkpoints
written before the kernel fields existed.
"""

from __future__ import annotations

import json
import math
import signal

import pytest
import train_cases
from helpers import assert_trees_equal
from helpers import tiny_run_config as tiny_config
from train_cases import (
    latest_params,
    quiet,
    records,
)

from rhhjax.train import checkpoint as ckpt_lib
from rhhjax.train import checksums, trainer
from rhhjax.train import workdir as workdir_lib
from rhhjax.train.signals import SignalCatcher

text_file = train_cases.text_file  # a shared fixture (tests/train_cases.py)


@pytest.mark.parametrize("sampler", ["windows", "stream"])
def test_resume_reproduces_uninterrupted_run(tmp_path, text_file, sampler):
    """8 steps straight == 5 steps, stop, resume to 8 == 7 steps, 'kill -9' back to 4, to 8.

    log_every_steps=3 does not divide the stop points, so the loss values of an unfinished
    progress interval must travel with the checkpoint.
    """
    common = dict(
        data__sampler=sampler,
        train__eval_every_steps=4,
        train__log_every_steps=3,
        train__checkpoint_every_steps=2,
    )
    straight = tmp_path / "straight"
    trainer.train_and_evaluate(
        tiny_config(text_file, train__max_steps=8, **common), straight, log=quiet
    )

    stopped = tmp_path / "stopped"
    r1 = trainer.train_and_evaluate(
        tiny_config(text_file, train__max_steps=5, **common), stopped, log=quiet
    )
    assert r1["step"] == 5
    trainer.train_and_evaluate(
        tiny_config(text_file, train__max_steps=8, **common), stopped, log=quiet
    )

    # kill -9 after step 7: its metrics are on disk, the last checkpoint is step 4
    killed = tmp_path / "killed"
    trainer.train_and_evaluate(
        tiny_config(text_file, train__max_steps=7, **common), killed, log=quiet
    )
    with ckpt_lib.Checkpoints(killed) as c:
        for step in c.steps("latest"):
            if step > 4:
                c._latest.delete(step)
    # written after checkpoint 4: train records to step 6, the stop step's validation at 7
    assert max(r["step"] for r in records(killed, ("train",))) == 6
    assert [r["step"] for r in records(killed, ("valid",))] == [4, 7]
    lines: list[str] = []
    trainer.train_and_evaluate(
        tiny_config(text_file, train__max_steps=8, **common), killed, log=lines.append
    )
    assert any("resuming" in line and "step 4" in line for line in lines)

    expected = records(straight)
    assert [r["step"] for r in expected if r["kind"] == "train"] == [3, 6]
    assert [r["step"] for r in expected if r["kind"] == "valid"] == [4, 8]
    reference, _ = latest_params(straight)
    # the run stopped by max_steps=5 validated its stop step too; nothing else differs
    stop_step_validation = [r for r in records(stopped) if r["kind"] == "valid" and r["step"] == 5]
    assert len(stop_step_validation) == 1
    for workdir in (stopped, killed):
        recs = [r for r in records(workdir) if r not in stop_step_validation]
        assert recs == expected  # bitwise: floats survive JSON exactly
        params, meta = latest_params(workdir)
        assert meta["step"] == 8
        assert_trees_equal(params, reference)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(model__type="lstm", data__sampler="stream"),
        dict(
            model__type="rhn",
            model__dropout="variational",
            model__keep_input=0.7,
            model__keep_hidden=0.8,
            model__keep_output=0.9,
            train__optimizer="sgd",
            train__learning_rate=0.2,
            train__lr_decay=1.03,
            train__clip_type="l2",
            train__weight_decay=1e-7,
        ),
    ],
    ids=["lstm-stream", "rhn-variational-sgd"],
)
def test_other_models_and_optimizers_resume(tmp_path, text_file, overrides):
    common = dict(train__eval_every_steps=2, eval__final_protocols="stream", **overrides)
    results = trainer.train_and_evaluate(
        tiny_config(text_file, train__max_steps=2, **common), tmp_path / "run", log=quiet
    )
    assert results["status"] == "finished" and results["step"] == 2
    results = trainer.train_and_evaluate(
        tiny_config(text_file, train__max_steps=4, **common), tmp_path / "run", log=quiet
    )
    assert results["step"] == 4
    assert math.isfinite(results["final"]["test"]["stream"]["bpc"])


def test_a_run_from_before_the_kernel_fields_resumes_with_another_impl(tmp_path, text_file):
    """Checkpoints written before model.pallas_mode / lowrank_* existed, or with the retired
    model.kernel block, resume, and those fields (how the recurrence runs, like impl) may
    change on resume."""
    common = dict(train__eval_every_steps=2, eval__final_protocols="")
    workdir = tmp_path / "run"
    trainer.train_and_evaluate(
        tiny_config(text_file, train__max_steps=2, **common), workdir, log=quiet
    )
    new_fields = ("pallas_mode", "lowrank_op", "lowrank_remat")
    rewritten = 0
    for path in [workdir / workdir_lib.CONFIG_FILE, *workdir.glob("checkpoints/**/meta/*")]:
        try:
            data = json.loads(path.read_text())
        except (IsADirectoryError, UnicodeDecodeError, json.JSONDecodeError):
            continue  # orbax's own files
        block = data.get("model") or {}
        for section in (block, (data.get("config") or {}).get("model") or {}):
            for name in new_fields:
                rewritten += section.pop(name, None) is not None
            if section:
                section["kernel"] = {"block_b": 64, "block_n": 32}  # the retired Triton blocks
        path.write_text(json.dumps(data))
    assert rewritten > 0  # the old format really lacks them now
    for path in workdir.glob(f"*/*/{checksums.CHECKSUMS_FILE}"):
        path.unlink()  # nor had checkpoints checksums then
    cfg = tiny_config(text_file, train__max_steps=4, model__impl="fused", **common)
    results = trainer.train_and_evaluate(cfg, workdir, log=quiet)
    assert results["step"] == 4


def _budget_config(text_file, **overrides):
    """A cosine schedule over a 12-step budget (0.6 s at a given 0.05 s a step)."""
    budget = dict(
        train__max_steps=0,
        train__max_epochs=0,
        train__budget_minutes=0.01,
        train__budget_step_seconds=0.05,
        train__schedule="cosine",
        train__warmup_steps=3,
        train__eval_every_steps=4,
        train__log_every_steps=3,
        train__checkpoint_every_steps=2,
    )
    return tiny_config(text_file, **{**budget, **overrides})


def test_a_budget_run_resumed_mid_schedule_equals_the_uninterrupted_one(tmp_path, text_file):
    """12 budgeted steps straight == 6 steps (a SIGTERM), resume to the budget: the same
    records and parameters bit for bit; the schedule's floor on the last budgeted step."""
    straight = tmp_path / "straight"
    results = trainer.train_and_evaluate(_budget_config(text_file), straight, log=quiet)
    assert (results["step"], results["stop_reason"]) == (12, "budget")
    stopped = tmp_path / "stopped"
    # a SIGTERM after the progress line of step 6 (max_steps would shorten the schedule)
    with SignalCatcher(quiet) as signals:

        def stop_at_6(line: str) -> None:
            if line.startswith("step 6/"):
                signals.signum = signal.SIGTERM

        first = trainer.train_and_evaluate(
            _budget_config(text_file), stopped, log=stop_at_6, signals=signals
        )
    assert (first["step"], first["stop_reason"]) == (6, "signal")
    lines: list[str] = []
    trainer.train_and_evaluate(_budget_config(text_file), stopped, log=lines.append)
    assert any("resuming" in line and "step 6" in line for line in lines)
    assert not any(line.startswith("budget:") for line in lines)  # fixed by the first start
    assert records(stopped) == records(straight)
    reference, meta = latest_params(straight)
    params, resumed_meta = latest_params(stopped)
    assert_trees_equal(params, reference)
    assert meta["budget_steps"] == resumed_meta["budget_steps"] == 12
    lrs = {r["step"]: r["lr"] for r in records(straight, ("train",))}
    assert lrs[12] == pytest.approx(1e-3 * 0.1, rel=1e-6)  # the floor, reached at the end
    assert lrs[3] == pytest.approx(1e-3 * 2 / 3, rel=1e-6)  # step index 2 of a 3-step warm-up
