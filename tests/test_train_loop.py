"""The training loop (`rhhjax.train.loop.Loop`) through whole tiny runs: progress lines and the
epoch estimate, the stop step validated, checkpoints on a clock, non-finite and diverged losses.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import train_cases
from helpers import tiny_run_config as tiny_config
from train_cases import (
    latest_params,
    quiet,
    records,
    slow_steps,
    strict_json,
    wrap_train_step,
)

from rhhjax import authors, models
from rhhjax.ops import persistent_variant
from rhhjax.train import checkpoint as ckpt_lib
from rhhjax.train import loop as train_loop
from rhhjax.train import trainer
from rhhjax.train.config import TrainError

text_file = train_cases.text_file  # a shared fixture (tests/train_cases.py)
trained = train_cases.trained  # a shared fixture (tests/train_cases.py)


# ----------------------------------------------------------------------------- progress


def test_first_progress_line_has_no_made_up_speed_and_an_epoch_estimate_follows(trained):
    """The line of the first step after a start (only the compiled step timed) said
    "- char/s  ETA 0:00:00"; now it says when speed and ETA come, and after the second step
    one line estimates what an epoch takes here."""
    _, _, _, lines = trained
    progress = [line for line in lines if line.startswith("step ")]
    assert progress[0].startswith("step 1/6 ")
    assert progress[0].endswith("speed and ETA from the next progress line on")
    assert "ETA 0:00:00" not in progress[0] and "- char/s" not in progress[0]
    assert "char/s  ETA " in progress[1]
    estimates = [line for line in lines if line.startswith("estimate: an epoch (")]
    assert len(estimates) == 1 and ("on this CPU" in estimates[0] or "on this GPU" in estimates[0])
    assert lines.index(estimates[0]) < lines.index(progress[1])


def test_a_first_progress_line_after_several_steps_has_speed_and_eta(tmp_path, text_file):
    """Only a progress line right after the first step lacks speed and ETA: with a line every
    2 steps (``:cpu`` prints one every 25) the first one times the steps after the first."""
    cfg = tiny_config(
        text_file, train__max_steps=4, train__log_every_steps=2, eval__final_protocols=""
    )
    lines: list[str] = []
    trainer.train_and_evaluate(cfg, tmp_path / "run", log=lines.append)
    progress = [line for line in lines if line.startswith("step ")]
    assert [line.split()[1] for line in progress] == ["2/4", "4/4"]
    assert all("char/s  ETA " in line for line in progress), progress


def test_progress_total_only_when_a_step_bound_decides():
    """A time-budgeted run (configs/ptb.py:cpu) showed "step 25/797,000": no total there."""
    import types

    import ml_collections

    cfg = ml_collections.ConfigDict(
        {"train": {"max_steps": 0, "max_epochs": 1000, "max_minutes": 12.0, "budget_minutes": 0.0}}
    )
    run = types.SimpleNamespace(cfg=cfg, steps_per_epoch=797)
    loop = train_loop.Loop.__new__(train_loop.Loop)  # only run.cfg and the epoch are read
    loop.run = run
    state = types.SimpleNamespace(budget_steps=0)
    assert loop._total_steps(state) == 0
    cfg.train.max_minutes = 0.0
    assert loop._total_steps(state) == 797_000
    cfg.train.max_steps = 500
    assert loop._total_steps(state) == 500
    cfg.train.budget_minutes = 8.0  # a time budget: no total until its steps are fixed ...
    assert loop._total_steps(state) == 0
    state.budget_steps = 300  # ... then the nearest bound
    assert loop._total_steps(state) == 300


def test_the_eta_of_a_budget_probe_is_the_budget_not_max_epochs():
    """The probe of a 3-second budget showed an ETA of 81 hours (from max_epochs)."""
    import types

    import ml_collections

    train = {"max_steps": 0, "max_epochs": 1000, "max_minutes": 0.0, "budget_minutes": 0.05}
    loop = train_loop.Loop.__new__(train_loop.Loop)
    loop.run = types.SimpleNamespace(cfg=ml_collections.ConfigDict({"train": train}))
    loop.run.steps_per_epoch = 797
    state = types.SimpleNamespace(budget_steps=0, step=5, train_seconds=1.0)
    assert loop._eta(state, 0.5) == pytest.approx(2.0)


def test_epoch_estimate_names_the_cpu_recipe_for_a_model_too_large_for_a_cpu():
    paper = train_loop.epoch_estimate(12.5, 199, 2, "cpu")
    assert paper.startswith("estimate: an epoch (199 steps) takes about 0:41:28 on this CPU")
    assert "--config=configs/ptb.py:cpu" in paper and "\n" not in paper
    assert "configs/ptb.py:cpu" not in train_loop.epoch_estimate(12.5, 199, 2, "gpu")
    assert "configs/ptb.py:cpu" not in train_loop.epoch_estimate(0.01, 63_770, 2, "cpu")  # :tiny
    assert "configs/ptb.py:cpu" not in train_loop.epoch_estimate(0.45, 797, 2, "cpu")  # :cpu


# ---------------------------------------------------------------------------- stops and checkpoints


def test_a_step_bound_between_validations_validates_the_stop_step(tmp_path, text_file):
    """max_steps=5 with a validation every 3 steps validated step 3 only: steps 4-5 never
    counted for the best checkpoint."""
    cfg = tiny_config(text_file, train__max_steps=5, eval__final_protocols="windows")
    lines: list[str] = []
    results = trainer.train_and_evaluate(cfg, tmp_path / "run", log=lines.append)
    assert [r["step"] for r in records(tmp_path / "run", ("valid",))] == [3, 5]
    assert any("max_steps reached at step 5: validating it" in line for line in lines)
    with ckpt_lib.Checkpoints(tmp_path / "run", read_only=True) as c:
        assert c.read_meta("latest")["valid_step"] == 5
    assert results["best_step"] in (3, 5)


def test_time_limited_stop_validates_the_stop_step(tmp_path, text_file, monkeypatch):
    """max_minutes stops at an arbitrary step: it is validated (and checkpointed) there and
    can be the best, instead of the steps since the last validation being thrown away."""
    slow_steps(monkeypatch, 0.1)
    cfg = tiny_config(
        text_file,
        train__max_steps=0,
        train__max_minutes=0.01,  # 0.6 s of training: a few 0.1 s steps
        train__eval_every_steps=1000,
        train__log_every_steps=1000,
        eval__final_protocols="windows",
    )
    results = trainer.train_and_evaluate(cfg, tmp_path / "run", log=quiet)
    step = results["step"]
    assert results["stop_reason"] == "max_minutes" and 0 < step < 1000
    assert [r["step"] for r in records(tmp_path / "run", ("valid",))] == [step]
    assert results["best_step"] == step and results["evaluated_checkpoint"] == f"best step {step}"
    with ckpt_lib.Checkpoints(tmp_path / "run", read_only=True) as c:
        assert c.latest_step() == step and c.steps("best") == [step]
        assert c.read_meta("latest")["best"]["step"] == step


def test_checkpoint_every_minutes(tmp_path, text_file, monkeypatch):
    """Wall-time checkpoints besides the evaluations: with steps of 0.15 s and a checkpoint
    due every 0.3 s, steps other than the final one are saved."""
    slow_steps(monkeypatch, 0.15)
    cfg = tiny_config(
        text_file,
        train__max_steps=8,
        train__eval_every_steps=100,
        train__log_every_steps=100,
        train__keep_checkpoints=20,
        train__checkpoint_every_minutes=0.005,
    )
    trainer.train_and_evaluate(cfg, tmp_path / "run", log=quiet)
    with ckpt_lib.Checkpoints(tmp_path / "run", read_only=True) as c:
        steps = c.steps("latest")
    assert steps[-1] == 8 and len(steps) >= 3, steps


# ------------------------------------------------------------------- non-finite and diverged losses


def _nan_at(monkeypatch, bad_step: int, only_first_try: bool):
    """The step of 0-based index ``bad_step`` returns NaN parameters and loss (on its first
    try only, with ``only_first_try``)."""

    def wrap(fn):
        def wrapped(params, opt_state, carry, inputs, targets, reset, step, retry):
            out = fn(params, opt_state, carry, inputs, targets, reset, step, retry)
            if int(step) == bad_step and (int(retry) == 0 or not only_first_try):
                nan = jnp.float32(jnp.nan)
                params = jax.tree.map(lambda p: p * nan, out[0])
                out = (params, out[1], out[2], nan, out[4])
            return out

        return wrapped

    wrap_train_step(monkeypatch, wrap)


def test_nonfinite_loss_stops_and_keeps_last_good_checkpoint(tmp_path, text_file, monkeypatch):
    _nan_at(monkeypatch, bad_step=4, only_first_try=False)  # the 5th step
    workdir = tmp_path / "nan"
    cfg = tiny_config(text_file)
    with pytest.raises(train_loop.NonFiniteLossError) as info:
        trainer.train_and_evaluate(cfg, workdir, log=quiet)
    message = str(info.value)
    assert "\n" not in message and "step 5" in message and "step 3" in message
    with ckpt_lib.Checkpoints(workdir, read_only=True) as c:
        assert c.steps("latest") == [3]
    params, _ = latest_params(workdir)
    assert all(np.isfinite(np.asarray(p)).all() for p in jax.tree.leaves(params))
    assert any(r.get("event") == "nonfinite" for r in records(workdir, kinds=("event",)))


def test_a_nonfinite_loss_says_what_else_the_implementation_may_mean_by_it(
    tmp_path, text_file, monkeypatch
):
    _nan_at(monkeypatch, bad_step=1, only_first_try=False)
    hint = " (HINT: the step's implementation)"
    monkeypatch.setattr(trainer, "nonfinite_hint", lambda mc, batch: hint)
    with pytest.raises(train_loop.NonFiniteLossError) as info:
        trainer.train_and_evaluate(tiny_config(text_file), tmp_path / "run", log=quiet)
    assert f"non-finite training loss (nan){hint} at step 2" in str(info.value)


@pytest.mark.parametrize(
    "impl, variant, hidden, named",
    [
        ("persistent", "layout=grid", 1000, True),
        ("persistent", "layout=grid,stages=2", 1000, True),
        ("persistent", "layout=rowgroup", 1000, False),  # cluster barriers never give up
        ("persistent", "default", 1000, False),  # the row-group layout
        ("persistent", "default", 1200, True),  # no row-group plan: the grid
        ("fused", "layout=grid", 1000, False),  # the variant of an impl that does not run
    ],
)
def test_the_nonfinite_hint_names_the_barrier_only_where_a_grid_barrier_runs(
    impl, variant, hidden, named
):
    variant = persistent_variant.parse_variant(variant)
    mc = models.ModelConfig(impl=impl, persistent=variant, hidden=hidden, dtype="bfloat16")
    hint = trainer.nonfinite_hint(mc, 256)
    assert bool(hint) == named
    if named:
        assert "grid barrier" in hint


def test_nonfinite_loss_rollback_continues(tmp_path, text_file, monkeypatch):
    _nan_at(monkeypatch, bad_step=4, only_first_try=True)
    workdir = tmp_path / "rollback"
    cfg = tiny_config(text_file, train__on_nonfinite="rollback")
    lines: list[str] = []
    results = trainer.train_and_evaluate(cfg, workdir, log=lines.append)
    assert results["status"] == "finished" and results["step"] == 6
    assert any("rolled back to step 3" in line for line in lines)
    events = [r for r in records(workdir, kinds=("event",)) if r["event"] == "rollback"]
    assert events and events[0]["retry"] == 1
    assert [r["step"] for r in records(workdir, ("train",))] == [1, 2, 3, 4, 5, 6]
    _, meta = latest_params(workdir)
    assert meta["rng"]["retry"] == 1


def _diverge_at(monkeypatch, bad_step: int):
    """From the step of 0-based index ``bad_step`` on, the loss reads 1e8 nats (finite)."""

    def wrap(fn):
        def wrapped(params, opt_state, carry, inputs, targets, reset, step, retry):
            out = fn(params, opt_state, carry, inputs, targets, reset, step, retry)
            if int(step) >= bad_step:
                out = (*out[:3], out[3] * 0 + 1e8, out[4])
            return out

        return wrapped

    wrap_train_step(monkeypatch, wrap)


def test_divergence_that_stays_finite_is_caught(tmp_path, text_file, monkeypatch):
    _diverge_at(monkeypatch, bad_step=4)
    workdir = tmp_path / "run"
    with pytest.raises(train_loop.NonFiniteLossError) as info:
        trainer.train_and_evaluate(tiny_config(text_file), workdir, log=quiet)
    message = str(info.value)
    assert "diverged training loss" in message and "step 5" in message
    assert "the last good checkpoint (step 3) is left intact" in message
    for line in (workdir / "metrics.jsonl").read_text().splitlines():
        strict_json(line)
    assert not (workdir / "results.json").exists()


def test_divergence_before_any_checkpoint(tmp_path, text_file, monkeypatch):
    """With nothing to roll back to, one error (not ten retries) and a sentence that reads."""
    _diverge_at(monkeypatch, bad_step=0)
    for mode in ("stop", "rollback"):
        workdir = tmp_path / mode
        with pytest.raises(train_loop.NonFiniteLossError) as info:
            trainer.train_and_evaluate(
                tiny_config(text_file, train__on_nonfinite=mode), workdir, log=quiet
            )
        message = str(info.value)
        assert "step 1" in message and "last good no checkpoint" not in message
        assert "no checkpoint" in message
        events = [r["event"] for r in records(workdir, ("event",))]
        assert events.count("nonfinite") == 1 and "rollback" not in events


def test_divergence_guard_config(tmp_path, text_file):
    with pytest.raises(TrainError, match="divergence_factor"):
        trainer.train_and_evaluate(
            tiny_config(text_file, train__divergence_factor=0.5), tmp_path / "w", log=quiet
        )
    assert train_loop.loss_limit(10.0, 50) == pytest.approx(10 * math.log(50))
    assert train_loop.loss_limit(0.0, 50) == math.inf


# ----------------------------------------------------------------------------- projection


def test_a_run_off_the_authors_data_has_no_projection(trained):
    _, _, results, lines = trained
    assert "projection" not in results and not any("PREDICTION" in line for line in lines)


def test_the_projection_of_the_workdir_is_in_the_results_and_the_last_lines(
    tmp_path, text_file, monkeypatch
):
    curve = authors.curve("hyperrhn")
    valid = [(e / 2, b) for e, b in zip(curve.epochs[:30], curve.bpc[:30], strict=True)]
    projection = authors.project(valid, 6.0, curve)
    asked = []
    monkeypatch.setattr(
        train_loop.authors_lib, "project_workdir", lambda w: asked.append(w) or projection
    )
    workdir = tmp_path / "projected"
    lines: list[str] = []
    results = trainer.train_and_evaluate(tiny_config(text_file), workdir, log=lines.append)
    assert asked == [workdir]
    assert results["projection"] == projection.as_dict()
    saved = strict_json((workdir / "results.json").read_text())
    assert saved["projection"]["kind"] == "PREDICTION"
    assert projection.line() in lines
