"""A run's time budget (`rhhjax.train.budget`): the nearest step bound and the schedule's
length, the probe that fixes the budget in steps, and the budgets refused for buying no decay
after the warm-up (at the first timed step, and again on a rerun until a field changes)."""

from __future__ import annotations

import types

import ml_collections
import pytest
import train_cases
from helpers import tiny_run_config as tiny_config
from train_cases import latest_params, quiet, records

from rhhjax.train import budget, trainer
from rhhjax.train import checkpoint as ckpt_lib
from rhhjax.train import workdir as workdir_lib
from rhhjax.train.config import TrainError

text_file = train_cases.text_file  # a shared fixture (tests/train_cases.py)


def _train(**fields) -> ml_collections.ConfigDict:
    bounds = dict(max_steps=0, max_epochs=0, budget_minutes=0.0, budget_probe_steps=20)
    return ml_collections.ConfigDict({**bounds, **fields})


def test_the_schedule_length_is_the_nearest_step_bound_once_the_budget_is_fixed():
    state = types.SimpleNamespace(budget_steps=0)
    assert budget.step_bound(_train(), state, 100) == 0  # no step bound
    assert budget.step_bound(_train(max_steps=500, max_epochs=3), state, 100) == 300
    train = _train(max_steps=500, budget_minutes=8.0)
    assert budget.unfixed(train, state)
    assert budget.schedule_length(train, state, 100) == 0  # not fixed yet
    state.budget_steps = 1200
    assert not budget.unfixed(train, state)
    assert budget.schedule_length(train, state, 100) == 500  # max_steps comes first


def test_the_probe_times_the_steps_after_the_first_and_fixes_the_budget_at_its_end(monkeypatch):
    fixed = []
    monkeypatch.setattr(budget, "fix", lambda run, oc, s, elapsed, step: fixed.append(step))
    state = types.SimpleNamespace(budget_steps=0, train_seconds=0.0)
    assert budget.Probe.for_run(_train(), state).end == 0  # no budget: no probe
    probe = budget.Probe.for_run(_train(budget_minutes=1.0, budget_probe_steps=4), state)
    assert probe.end == 5 and not probe.ends_at(4) and probe.ends_at(5)
    for steps_run, seconds in enumerate((10.0, 10.5, 11.0, 11.5, 12.0), 1):
        state.train_seconds = seconds  # the first step (compilation) took 10 s, then 0.5 s
        probe.timed(None, None, state, steps_run)
    assert fixed == [pytest.approx(0.5)]


def test_a_refused_budget_names_the_cpu_recipe_on_a_cpu():
    assert budget.refusal_fix().startswith("raise budget_minutes or lower warmup_steps")
    assert "configs/ptb.py:cpu" in budget.refusal_fix()  # the tests run on a CPU


def test_the_schedule_decays_to_the_nearest_bound_not_the_budget(tmp_path, text_file):
    """A budget of 1,200 steps with max_steps=6: the floor is reached at step 6, where the
    run stops (it stayed at the peak before)."""
    config = tiny_config(
        text_file,
        train__max_steps=6,
        train__budget_minutes=1.0,
        train__budget_step_seconds=0.05,
        train__schedule="cosine",
        train__warmup_steps=2,
        train__log_every_steps=1,
        train__eval_every_steps=6,
    )
    results = trainer.train_and_evaluate(config, tmp_path / "w", log=quiet)
    assert results["step"] == 6
    lrs = {r["step"]: r["lr"] for r in records(tmp_path / "w", ("train",))}
    assert lrs[6] == pytest.approx(config.train.learning_rate * 0.1, rel=1e-6)


def test_a_measured_budget_is_fixed_after_the_probe_and_stops_the_run(tmp_path, text_file):
    lines: list[str] = []
    config = tiny_config(
        text_file,
        train__max_steps=0,
        train__max_epochs=0,
        train__budget_minutes=0.02,  # spent by the first steps: the run ends after the probe
        train__budget_step_seconds=0.0,
        train__budget_probe_steps=2,
        train__schedule="constant",
        train__warmup_steps=3,
        train__eval_every_steps=0,
        train__log_every_steps=50,
        train__checkpoint_every_steps=2,
    )
    results = trainer.train_and_evaluate(config, tmp_path / "run", log=lines.append)
    fixed = [line for line in lines if line.startswith("budget: 0.02 minutes = ")]
    assert len(fixed) == 1, lines
    _, meta = latest_params(tmp_path / "run")
    assert results["stop_reason"] == "budget" and results["step"] == meta["budget_steps"] >= 3


# A measured budget of 0.06 s against a 40-step warm-up: refused at the first timed step.
SHORT_BUDGET = dict(
    train__max_steps=0,
    train__max_epochs=0,
    train__budget_minutes=0.001,
    train__budget_probe_steps=10,
    train__schedule="cosine",
    train__warmup_steps=40,
)


def test_a_budget_too_short_for_its_warm_up_stops_at_the_first_timed_step_leaving_no_checkpoint(
    tmp_path, text_file
):
    """On a CPU the refusal comes after step 2 (not the probe's end), names the CPU recipe,
    and leaves no checkpoint for a rerun to train on from."""
    config = tiny_config(
        text_file,
        **SHORT_BUDGET,
        train__eval_every_steps=1,
        train__checkpoint_every_steps=1,
        train__log_every_steps=1,
    )
    lines: list[str] = []
    with pytest.raises(TrainError) as info:
        trainer.train_and_evaluate(config, tmp_path / "w", log=lines.append)
    assert "buys 2 steps" in str(info.value) and "configs/ptb.py:cpu" in str(info.value)
    assert not ckpt_lib.has_checkpoint(tmp_path / "w")
    assert (tmp_path / "w" / workdir_lib.BUDGET_REFUSED_FILE).is_file()


def test_a_rerun_of_a_refused_budget_is_refused_before_it_trains_until_a_field_changes(
    tmp_path, text_file
):
    fields = dict(SHORT_BUDGET)
    workdir = tmp_path / "w"
    with pytest.raises(TrainError) as first:
        trainer.train_and_evaluate(tiny_config(text_file, **fields), workdir, log=quiet)
    trained = (workdir / "metrics.jsonl").read_text()
    with pytest.raises(TrainError) as again:
        trainer.train_and_evaluate(tiny_config(text_file, **fields), workdir, log=quiet)
    assert str(again.value).startswith(str(first.value) + " (measured by an earlier run")
    assert (workdir / "metrics.jsonl").read_text() == trained  # no step ran again
    fields.update(train__budget_step_seconds=1.0, train__budget_minutes=0.5, train__warmup_steps=12)
    results = trainer.train_and_evaluate(tiny_config(text_file, **fields), workdir, log=quiet)
    assert results["status"] == "finished" and not (workdir / "budget_refused.json").exists()
