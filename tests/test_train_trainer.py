"""The training loop end to end on the tiny config: train, checkpoint, resume, evaluate, sample.

Data: the first 30,000 characters of Tiny Shakespeare (``../shared/data/tinyshakespeare``,
or ``$RHHJAX_SHAKESPEARE``) written to a temporary file, split 24,000 / 3,000 / 3,000; a
synthetic text stands in when the file is absent, so nothing is skipped.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import PTB_DIR, assert_trees_equal, write_text
from helpers import tiny_run_config as tiny_config
from test_train_workdir import strict_json

from rhhjax import configs, models
from rhhjax import data as data_lib
from rhhjax.errors import UserError
from rhhjax.tools import evaluate as evaluate_tool
from rhhjax.tools import plot, sample
from rhhjax.train import checkpoint as ckpt_lib
from rhhjax.train import loop as train_loop
from rhhjax.train import trainer
from rhhjax.train import workdir as workdir_lib

TIMING_FIELDS = ("time", "chars_per_sec", "seconds", "train_seconds")
HAS_TENSORBOARDX = importlib.util.find_spec("tensorboardX") is not None


def ptb_config(variant: str = "tiny"):
    return configs.load(f"ptb:{variant}")


def quiet(message: str) -> None:
    del message


def records(workdir: Path, kinds=("train", "valid")) -> list[dict]:
    out = []
    for line in (workdir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["kind"] in kinds:
            out.append({k: v for k, v in r.items() if k not in TIMING_FIELDS})
    return out


def latest_params(workdir: Path):
    with ckpt_lib.Checkpoints(workdir, read_only=True) as c:
        params, meta = c.restore_params("latest")
    return params, meta


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    return write_text(tmp_path_factory.mktemp("data") / "shake.txt")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, text_file):
    """One tiny run (6 steps, validation at 3 and 6): (workdir, config, results, log)."""
    workdir = tmp_path_factory.mktemp("runs") / "tiny"
    lines: list[str] = []
    cfg = tiny_config(text_file, train__tensorboard=HAS_TENSORBOARDX)
    results = trainer.train_and_evaluate(cfg, workdir, log=lines.append)
    return workdir, cfg, results, lines


# ----------------------------------------------------------------------------- end to end


def test_end_to_end_outputs(trained):
    workdir, cfg, results, lines = trained
    assert results["status"] == "finished" and results["exit_code"] == 0
    assert results["step"] == 6 and results["stop_reason"] == "max_steps"
    assert results["best_step"] in (3, 6)
    # files
    for name in ("config.json", "metrics.jsonl", "results.json"):
        assert (workdir / name).is_file(), name
    saved_cfg = json.loads((workdir / "config.json").read_text())
    assert saved_cfg["model"]["depth"] == cfg.model.depth
    assert saved_cfg["train"]["optimizer"] == "adam"  # optional field filled in
    assert json.loads((workdir / "results.json").read_text()) == json.loads(json.dumps(results))
    # metrics: a train record per step (log_every_steps=1), validation at 3 and 6
    recs = records(workdir)
    assert [r["step"] for r in recs if r["kind"] == "train"] == [1, 2, 3, 4, 5, 6]
    valid = [r for r in recs if r["kind"] == "valid"]
    assert [r["step"] for r in valid] == [3, 6]
    assert all(r["chars"] == cfg.eval.max_valid_chars - 1 for r in valid)
    for r in recs:
        assert math.isclose(r["bpc"], r["loss"] / math.log(2))
    # the progress line
    progress = [line for line in lines if line.startswith("step ")]
    assert len(progress) == 6
    assert all(k in progress[-1] for k in ("epoch", "loss", "bpc", "char/s", "ETA"))
    assert progress[-1].startswith("step 6/6 ") and progress[-1].endswith("+ final evaluation")
    # a line right after the first step (whose compilation can take minutes)
    first = [i for i, line in enumerate(lines) if line.startswith("first step done in")]
    assert len(first) == 1 and lines[first[0] + 1].startswith("step 1/6 ")
    assert any(line.startswith("data text_char:shake.txt from ") for line in lines)
    # the final evaluation: both splits, every protocol, the paper's mask-95 test number
    final = results["final"]
    assert set(final) == {"valid", "test"}
    assert set(final["valid"]) == {"windows", "stream", "paper"}
    assert set(final["test"]) == {"windows", "stream", "paper", "paper_test_mask95"}
    for split in ("valid", "test"):
        for protocol in ("windows", "stream"):
            m = final[split][protocol]
            assert m["chars"] == 3000 - 1  # every character but the first, exactly once
            assert math.isclose(m["bpc"], m["nats"] / math.log(2))
            assert math.isclose(m["ppl"], math.exp(m["nats"]))
            assert 0.0 <= m["acc"] <= 1.0
        assert final[split]["paper"]["chars"] == data_lib.scored_count(3000, "paper")
    assert final["test"]["paper_test_mask95"]["chars"] == data_lib.scored_count(
        3000, "paper", paper_mask=95
    )
    # checkpoints: latest and best
    with ckpt_lib.Checkpoints(workdir, read_only=True) as c:
        assert c.latest_step() == 6
        assert c.best_step() == results["best_step"]
        meta = c.read_meta("latest")
    assert meta["step"] == 6 and meta["vocab"]["kind"] == "char"
    assert meta["sampler"]["step"] == 6 and meta["rng"] == {"seed": 0, "retry": 0}
    assert meta["config"]["model"]["hidden"] == 16


def snapshot(workdir: Path) -> dict[str, bytes]:
    """Every file of ``workdir`` (relative path -> bytes)."""
    return {str(p.relative_to(workdir)): p.read_bytes() for p in workdir.rglob("*") if p.is_file()}


def test_rerun_of_a_finished_run_does_nothing(trained, text_file):
    """The same command again, even with another learning rate: nothing trained, nothing
    re-evaluated, and the workdir byte for byte as it was (config.json keeps the values the
    run trained with; no resume record). An empty eval.final_protocols does not overwrite
    results.json with an empty table either."""
    workdir, cfg, results, _ = trained
    before = snapshot(workdir)
    lines: list[str] = []
    changed = tiny_config(text_file, train__tensorboard=HAS_TENSORBOARDX)
    changed.train.learning_rate = 0.5
    again = trainer.train_and_evaluate(changed, workdir, log=lines.append)
    assert snapshot(workdir) == before
    assert any("already finished at step 6: nothing to do" in line for line in lines)
    assert not any(line.startswith(("resuming", "step ", "final evaluation")) for line in lines)
    assert again["final"] == results["final"]
    empty = tiny_config(text_file, eval__final_protocols="")
    lines.clear()
    trainer.train_and_evaluate(empty, workdir, log=lines.append)
    assert (workdir / "results.json").read_bytes() == before["results.json"]
    assert any("results.json is left as it was" in line for line in lines)


def test_evaluate_checkpoint_matches_training_results(trained):
    workdir, _, results, _ = trained
    out = evaluate_tool.run(str(workdir), split="all", protocol="all", which="best", log=quiet)
    assert out["checkpoint"] == "best" and out["step"] == results["best_step"]
    assert out["results"] == results["final"]
    latest = evaluate_tool.run(
        str(workdir), split="test", protocol="stream", which="latest", log=quiet
    )
    assert latest["step"] == 6 and set(latest["results"]) == {"test"}


def test_sample_from_checkpoint(trained):
    workdir, _, _, _ = trained
    a = sample.run(str(workdir), "the ", 40, 0.8, seed=0)
    b = sample.run(str(workdir), "the ", 40, 0.8, seed=0)
    assert a == b and a.startswith("the ") and len(a) == 44
    # "Thou": characters of Tiny Shakespeare and of the stand-in text used without shared/.
    greedy = sample.run(str(workdir), "Thou", 10, 0.0, seed=1)
    assert greedy == sample.run(str(workdir), "Thou", 10, 0.0, seed=2)  # seed-free


def test_plot_of_run(trained, tmp_path):
    workdir, _, _, _ = trained
    out = plot.plot([workdir], tmp_path / "bpc.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(
    not (PTB_DIR / "ptb.train.txt").is_file(),
    reason=f"real PTB not found in {PTB_DIR} (set RHHJAX_PTB_DIR to the folder of ptb.*.txt)",
)
def test_real_ptb_tiny(tmp_path):
    """configs/ptb.py:tiny as shipped (raw PTB characters), only the data folder and a larger
    evaluation batch set: 50 symbols, every valid/test character scored once."""
    cfg = ptb_config("tiny")
    cfg.data.dir = str(PTB_DIR)
    cfg.eval.batch_size = 512
    cfg.eval.final_protocols = "windows,stream"
    results = trainer.train_and_evaluate(cfg, tmp_path / "ptb", log=quiet)
    meta = ckpt_lib.load_for_inference(tmp_path / "ptb")[1]
    assert meta["model"]["vocab_size"] == 50 and len(meta["vocab"]["symbols"]) == 50
    assert results["final"]["valid"]["windows"]["chars"] == 399_782 - 1
    assert results["final"]["test"]["stream"]["chars"] == 449_945 - 1
    # an untrained model is close to uniform over 50 symbols (log2 50 = 5.64 bits)
    assert 4.5 < results["final"]["test"]["windows"]["bpc"] < 6.5


# ----------------------------------------------------------------------------- resume exactness


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


def test_a_run_from_before_the_kernel_fields_resumes_with_another_impl_and_blocks(
    tmp_path, text_file
):
    """Checkpoints written before model.pallas_mode / kernel / lowrank_* existed resume, and
    those fields (how the recurrence runs, like impl) may change on resume."""
    common = dict(train__eval_every_steps=2, eval__final_protocols="")
    workdir = tmp_path / "run"
    trainer.train_and_evaluate(
        tiny_config(text_file, train__max_steps=2, **common), workdir, log=quiet
    )
    new_fields = ("pallas_mode", "kernel", "lowrank_op", "lowrank_remat")
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
        path.write_text(json.dumps(data))
    assert rewritten > 0  # the old format really lacks them now
    for path in workdir.glob(f"*/*/{ckpt_lib.CHECKSUMS_FILE}"):
        path.unlink()  # nor had checkpoints checksums then
    cfg = tiny_config(text_file, train__max_steps=4, model__impl="fused", **common)
    cfg.model.kernel.block_b = 16
    results = trainer.train_and_evaluate(cfg, workdir, log=quiet)
    assert results["step"] == 4


# ----------------------------------------------------------------------------- non-finite loss


def _nan_at(monkeypatch, bad_step: int, only_first_try: bool):
    real = trainer.make_train_step

    def patched(mc, oc, seed):
        fn = real(mc, oc, seed)

        def wrapped(params, opt_state, carry, inputs, targets, reset, step, retry):
            out = fn(params, opt_state, carry, inputs, targets, reset, step, retry)
            if int(step) == bad_step and (int(retry) == 0 or not only_first_try):
                nan = jnp.float32(jnp.nan)
                params = jax.tree.map(lambda p: p * nan, out[0])
                out = (params, out[1], out[2], nan, out[4])
            return out

        return wrapped

    monkeypatch.setattr(trainer, "make_train_step", patched)


def test_nonfinite_loss_stops_and_keeps_last_good_checkpoint(tmp_path, text_file, monkeypatch):
    _nan_at(monkeypatch, bad_step=4, only_first_try=False)  # the 5th step
    workdir = tmp_path / "nan"
    cfg = tiny_config(text_file)
    with pytest.raises(trainer.NonFiniteLossError) as info:
        trainer.train_and_evaluate(cfg, workdir, log=quiet)
    message = str(info.value)
    assert "\n" not in message and "step 5" in message and "step 3" in message
    with ckpt_lib.Checkpoints(workdir, read_only=True) as c:
        assert c.steps("latest") == [3]
    params, _ = latest_params(workdir)
    assert all(np.isfinite(np.asarray(p)).all() for p in jax.tree.leaves(params))
    assert any(r.get("event") == "nonfinite" for r in records(workdir, kinds=("event",)))


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


# ----------------------------------------------------------------------------- bad input


BAD_CONFIGS = [
    (dict(model__depth=0), models.ConfigError, "model.depth"),
    (dict(model__keep=1.5), models.ConfigError, "model.keep"),
    (dict(model__hidden=-3), models.ConfigError, "model.hidden"),
    (dict(model__impl="magic"), models.ConfigError, "model.impl"),
    (dict(data__format="nope"), data_lib.DataError, "data.format"),
    (dict(data__text_files="/nonexistent/file.txt"), data_lib.DataError, "/nonexistent"),
    (dict(train__clip_type="l3"), trainer.TrainError, "train.clip_type"),
    (dict(train__learning_rate=0.0), trainer.TrainError, "train.learning_rate"),
    (dict(train__on_nonfinite="ignore"), trainer.TrainError, "train.on_nonfinite"),
    (dict(eval__min_context=20), trainer.TrainError, "eval.min_context"),
    (dict(eval__final_protocols="windows,bogus"), trainer.TrainError, "bogus"),
    (dict(data__hutter_holdout=20_000), data_lib.DataError, "hutter_holdout"),
]
if jax.default_backend() != "gpu":  # impl="mosaic" and "persistent" compile for a GPU only
    BAD_CONFIGS += [
        (dict(model__impl="mosaic"), UserError, "for a Hopper GPU, and the platform is"),
        (dict(model__impl="persistent"), UserError, "for a Hopper GPU, and the platform is"),
        # lowering only (the compile report's mode): not executed off a GPU
        (dict(model__impl="mosaic", model__pallas_mode="compiled"), UserError, "only lowers"),
        (dict(model__impl="pallas", model__pallas_mode="compiled"), UserError, "only lowers"),
    ]


@pytest.mark.parametrize("overrides,error,needle", BAD_CONFIGS)
def test_bad_config_fails_before_writing(tmp_path, text_file, overrides, error, needle):
    workdir = tmp_path / "never"
    with pytest.raises(error) as info:
        trainer.train_and_evaluate(tiny_config(text_file, **overrides), workdir, log=quiet)
    assert needle in str(info.value) and "\n" not in str(info.value)
    assert isinstance(info.value, UserError)
    assert not workdir.exists()


def test_unwritable_workdir(tmp_path, text_file):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(trainer.TrainError, match="not a directory"):
        trainer.train_and_evaluate(tiny_config(text_file), blocker / "run", log=quiet)
    with pytest.raises(trainer.TrainError, match="not a directory"):
        trainer.train_and_evaluate(tiny_config(text_file), blocker, log=quiet)


def test_incompatible_workdir_is_refused(trained, text_file):
    workdir, _, _, _ = trained
    before = sorted(p.name for p in workdir.rglob("*"))
    for overrides, needle in [
        (dict(model__hidden=32), "model.hidden"),
        (dict(model__type="rhn"), "model.type"),
        (dict(train__batch_size=8), "train.batch_size"),
        (dict(data__text_vocab="byte"), "data.text_vocab"),
        (dict(data__hutter_holdout=2500), "n_tokens"),
    ]:
        with pytest.raises(trainer.TrainError, match=needle):
            trainer.train_and_evaluate(tiny_config(text_file, **overrides), workdir, log=quiet)
    assert sorted(p.name for p in workdir.rglob("*")) == before


def test_incompatible_config_json_without_checkpoint(tmp_path, text_file):
    workdir = tmp_path / "run"
    workdir.mkdir()
    other = tiny_config(text_file, model__depth=3)
    (workdir / "config.json").write_text(json.dumps(other.to_dict()))
    with pytest.raises(trainer.TrainError, match="model.depth=3"):
        trainer.train_and_evaluate(tiny_config(text_file), workdir, log=quiet)


# ----------------------------------------------------------------------------- faults (issue 15)


def _slow_steps(monkeypatch, seconds: float, signal_at: int | None = None, executed=None):
    """Patch the train step so that each one takes ``seconds`` more on the device (a host
    callback that sleeps), and the one of 0-based index ``signal_at`` sends this process a
    SIGTERM while it runs. ``executed`` collects the indices as the device runs them."""
    import signal as signal_lib
    import time

    real = trainer.make_train_step

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

    def patched(mc, oc, seed):
        fn = real(mc, oc, seed)

        def wrapped(params, opt_state, carry, inputs, targets, reset, step, retry):
            out = fn(params, opt_state, carry, inputs, targets, reset, step, retry)
            return (*out[:3], delay(out[3], step), out[4])

        return wrapped

    monkeypatch.setattr(trainer, "make_train_step", patched)


def test_sigterm_stops_after_the_step_in_flight(tmp_path, text_file, monkeypatch):
    """Asynchronous dispatch must not queue steps ahead: a SIGTERM that arrives while the
    device runs step 3 stops the run at step 3 or 4 (the one in flight), not at the bound."""
    executed: list[int] = []
    _slow_steps(monkeypatch, 0.2, signal_at=2, executed=executed)
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


def test_checkpoint_every_minutes(tmp_path, text_file, monkeypatch):
    """Wall-time checkpoints besides the evaluations: with steps of 0.15 s and a checkpoint
    due every 0.3 s, steps other than the final one are saved."""
    _slow_steps(monkeypatch, 0.15)
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


def test_time_limited_stop_validates_the_stop_step(tmp_path, text_file, monkeypatch):
    """max_minutes stops at an arbitrary step: it is validated (and checkpointed) there and
    can be the best, instead of the steps since the last validation being thrown away."""
    _slow_steps(monkeypatch, 0.1)
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


class _Killed(BaseException):
    """Stands in for kill -9 at a chosen point."""


def test_kill_between_best_and_latest_save_keeps_the_best(tmp_path, text_file, monkeypatch):
    """A kill after a new best (step 4) is saved but before the latest checkpoint of step 4:
    the resumed run (from step 2) still has the best checkpoint its state names (step 2), and
    results.json evaluates that checkpoint."""
    common = dict(
        train__eval_every_steps=2, train__log_every_steps=100, eval__final_protocols="windows"
    )
    workdir = tmp_path / "run"
    real_save = ckpt_lib.Checkpoints.save_latest

    def save_latest(self, step, *args, **kwargs):
        if step == 4:
            raise _Killed()
        return real_save(self, step, *args, **kwargs)

    monkeypatch.setattr(ckpt_lib.Checkpoints, "save_latest", save_latest)
    with pytest.raises(_Killed):
        trainer.train_and_evaluate(
            tiny_config(text_file, train__max_steps=6, **common), workdir, log=quiet
        )
    monkeypatch.setattr(ckpt_lib.Checkpoints, "save_latest", real_save)
    with ckpt_lib.Checkpoints(workdir, read_only=True) as c:
        assert c.steps("latest") == [2] and 4 in c.steps("best")  # the kill's aftermath
    # resumed to stop at step 2 (a stop at 3 would validate step 3: a new best, maybe)
    results = trainer.train_and_evaluate(
        tiny_config(text_file, train__max_steps=2, **common), workdir, log=quiet
    )
    assert results["step"] == 2 and results["best_step"] == 2
    assert results["evaluated_checkpoint"] == "best step 2"
    with ckpt_lib.Checkpoints(workdir, read_only=True) as c:
        assert c.steps("best") == [2]
    saved = json.loads((workdir / "results.json").read_text())
    assert saved["best_step"] == 2 and saved["evaluated_checkpoint"] == "best step 2"


def _bytes(text: str) -> float:
    number, unit = text.split()
    return float(number.replace(",", "")) * {"kB": 1e3, "MB": 1e6, "GB": 1e9}[unit]


def assert_space_consistent(message: str) -> None:
    """A full-disk line states the space a write needs so that it cannot contradict itself:
    "it needs about X, Y free" with X > Y, or "it needs more than the Y free"."""
    import re

    size = r"([\d.,]+ [kMG]B)"
    about = re.search(rf"it needs about {size}, {size} free", message)
    more = re.search(rf"it needs more than the {size} free", message)
    assert about or more, message
    if about:
        assert _bytes(about.group(1)) > _bytes(about.group(2)), message


def test_full_disk_during_a_checkpoint_is_one_line(tmp_path, text_file, monkeypatch):
    """A save that fails (here: the storage layer's ENOSPC error) raises CheckpointError with
    one line naming the folder, the step and the space needed; the previous checkpoint is
    intact and the same command resumes from it."""
    import orbax.checkpoint as ocp

    common = dict(
        train__eval_every_steps=2, train__log_every_steps=100, eval__final_protocols="windows"
    )
    workdir = tmp_path / "run"
    real_save = ocp.CheckpointManager.save

    def full_disk(self, step, *args, **kwargs):
        if step == 4:
            raise ValueError(
                "RESOURCE_EXHAUSTED: Error writing local file "
                f"{self.directory}/4/params/d/abc: No space left on device"
            )
        return real_save(self, step, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "save", full_disk)
    cfg = tiny_config(text_file, train__max_steps=6, **common)
    with pytest.raises(ckpt_lib.CheckpointError) as info:
        trainer.train_and_evaluate(cfg, workdir, log=quiet)
    message = str(info.value)
    assert "\n" not in message and isinstance(info.value, UserError)
    assert "step 4" in message and str(workdir) in message
    assert "no space left on device" in message
    assert_space_consistent(message)
    assert "the last checkpoint (step 2) is intact" in message
    monkeypatch.setattr(ocp.CheckpointManager, "save", real_save)
    lines: list[str] = []
    results = trainer.train_and_evaluate(cfg, workdir, log=lines.append)
    assert any(line.startswith("resuming") and "step 2" in line for line in lines)
    assert results["status"] == "finished" and results["step"] == 6
    assert [r["step"] for r in records(workdir, ("valid",))] == [2, 4, 6]


def _diverge_at(monkeypatch, bad_step: int):
    """From the step of 0-based index ``bad_step`` on, the loss reads 1e8 nats (finite)."""
    real = trainer.make_train_step

    def patched(mc, oc, seed):
        fn = real(mc, oc, seed)

        def wrapped(params, opt_state, carry, inputs, targets, reset, step, retry):
            out = fn(params, opt_state, carry, inputs, targets, reset, step, retry)
            if int(step) >= bad_step:
                out = (*out[:3], out[3] * 0 + 1e8, out[4])
            return out

        return wrapped

    monkeypatch.setattr(trainer, "make_train_step", patched)


def test_divergence_that_stays_finite_is_caught(tmp_path, text_file, monkeypatch):
    _diverge_at(monkeypatch, bad_step=4)
    workdir = tmp_path / "run"
    with pytest.raises(trainer.NonFiniteLossError) as info:
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
        with pytest.raises(trainer.NonFiniteLossError) as info:
            trainer.train_and_evaluate(
                tiny_config(text_file, train__on_nonfinite=mode), workdir, log=quiet
            )
        message = str(info.value)
        assert "step 1" in message and "last good no checkpoint" not in message
        assert "no checkpoint" in message
        events = [r["event"] for r in records(workdir, ("event",))]
        assert events.count("nonfinite") == 1 and "rollback" not in events


def test_divergence_guard_config(tmp_path, text_file):
    with pytest.raises(trainer.TrainError, match="divergence_factor"):
        trainer.train_and_evaluate(
            tiny_config(text_file, train__divergence_factor=0.5), tmp_path / "w", log=quiet
        )
    assert train_loop.loss_limit(10.0, 50) == pytest.approx(10 * math.log(50))
    assert train_loop.loss_limit(0.0, 50) == math.inf


def test_workdir_lock_refuses_a_second_run(tmp_path, text_file):
    workdir = tmp_path / "run"
    workdir.mkdir()
    lock = workdir_lib.WorkdirLock(workdir)
    lock.acquire()  # another run holds the workdir
    try:
        with pytest.raises(trainer.TrainError, match="in use by another run") as info:
            trainer.train_and_evaluate(tiny_config(text_file), workdir, log=quiet)
        assert str(os.getpid()) in str(info.value)
        assert not (workdir / "metrics.jsonl").exists()
    finally:
        lock.release()


def test_files_share_one_mode(trained):
    """config.json / results.json are written like metrics.jsonl (0666 less the umask), not
    0600 as tempfile.mkstemp makes them."""
    workdir = trained[0]
    mode = (workdir / "metrics.jsonl").stat().st_mode & 0o777
    for name in ("config.json", "results.json"):
        assert (workdir / name).stat().st_mode & 0o777 == mode, name


def read_event_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value)]} from the TensorBoard event files in ``folder`` (TFRecord framing:
    length, its CRC, the Event proto, its CRC), parsed with tensorboardX's own protos."""
    import struct

    from tensorboardX.proto import event_pb2

    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        i = 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i : i + 8])
            event = event_pb2.Event.FromString(data[i + 12 : i + 12 + n])
            i += 12 + n + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


@pytest.mark.skipif(
    not HAS_TENSORBOARDX, reason='tensorboardX not installed (pip install -e ".[tensorboard]")'
)
def test_tensorboard_events_match_metrics(trained):
    workdir = trained[0]
    scalars = read_event_scalars(workdir / "tensorboard")
    recs = records(workdir)
    train = [r for r in recs if r["kind"] == "train"]
    valid = [r for r in recs if r["kind"] == "valid"]
    for tag, field in [
        ("train/bpc", "bpc"),
        ("train/loss", "loss"),
        ("train/grad_norm", "grad_norm"),
        ("train/learning_rate", "lr"),
    ]:
        assert [s for s, _ in scalars[tag]] == [r["step"] for r in train], tag
        np.testing.assert_allclose([v for _, v in scalars[tag]], [r[field] for r in train], 1e-6)
    assert [s for s, _ in scalars["train/chars_per_sec"]] == [r["step"] for r in train][1:]
    for tag, field in [("valid_windows/bpc", "bpc"), ("valid_windows/accuracy", "acc")]:
        assert [s for s, _ in scalars[tag]] == [r["step"] for r in valid], tag
        np.testing.assert_allclose([v for _, v in scalars[tag]], [r[field] for r in valid], 1e-6)


def test_tensorboard_without_the_package_is_one_line(tmp_path, text_file, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    workdir = tmp_path / "run"
    with pytest.raises(trainer.TrainError, match="needs the tensorboardX package") as info:
        trainer.train_and_evaluate(
            tiny_config(text_file, train__tensorboard=True), workdir, log=quiet
        )
    assert "\n" not in str(info.value) and not workdir.exists()


def test_evaluate_reads_moved_data(trained, tmp_path, text_file):
    """rhhjax.evaluate --text_files / --data_dir: the run's data folder can be overridden."""
    workdir, _, results, _ = trained
    moved = tmp_path / "elsewhere" / "shake.txt"
    moved.parent.mkdir()
    moved.write_bytes(text_file.read_bytes())
    lines: list[str] = []
    out = evaluate_tool.run(
        str(workdir), "test", "stream", "best", log=lines.append, text_files=str(moved)
    )
    assert str(moved) in lines[0]
    assert out["results"]["test"]["stream"] == results["final"]["test"]["stream"]
    with pytest.raises(data_lib.DataError, match="use --text_files"):
        evaluate_tool.run(str(workdir), "test", "stream", "best", log=quiet, data_dir=str(tmp_path))
    with pytest.raises(data_lib.DataError, match="nowhere.txt"):
        evaluate_tool.run(str(workdir), "test", "stream", log=quiet, text_files="/nowhere.txt")


def test_progress_total_only_when_a_step_bound_decides():
    """A time-budgeted run (configs/ptb.py:cpu) showed "step 25/797,000": no total there."""
    import types

    import ml_collections

    cfg = ml_collections.ConfigDict(
        {"train": {"max_steps": 0, "max_epochs": 1000, "max_minutes": 12.0}}
    )
    run = types.SimpleNamespace(cfg=cfg, steps_per_epoch=797)
    loop = train_loop.Loop.__new__(train_loop.Loop)  # only run.cfg and the epoch are read
    loop.run = run
    assert loop._total_steps() == 0
    cfg.train.max_minutes = 0.0
    assert loop._total_steps() == 797_000
    cfg.train.max_steps = 500
    assert loop._total_steps() == 500


# ----------------------------------------------------------------------------- faults (issue 23)


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


def test_start_up_says_which_implementation_auto_picked_and_why(trained):
    """model.impl=auto (the default) is resolved once; the run says in one line what runs."""
    _, cfg, _, lines = trained
    assert cfg.model.impl == "auto"
    chosen = [line for line in lines if line.startswith("model.impl=")]
    expected = "scan" if jax.default_backend() == "cpu" else "fused"
    assert len(chosen) == 1 and chosen[0].startswith(f"model.impl=auto runs {expected}: ")
    assert "results/bench_" in chosen[0]  # the measurements it rests on


def test_epoch_estimate_names_the_cpu_recipe_for_a_model_too_large_for_a_cpu():
    paper = trainer.epoch_estimate(12.5, 199, 2, "cpu")
    assert paper.startswith("estimate: an epoch (199 steps) takes about 0:41:28 on this CPU")
    assert "--config=configs/ptb.py:cpu" in paper and "\n" not in paper
    assert "configs/ptb.py:cpu" not in trainer.epoch_estimate(12.5, 199, 2, "gpu")
    assert "configs/ptb.py:cpu" not in trainer.epoch_estimate(0.01, 63_770, 2, "cpu")  # :tiny
    assert "configs/ptb.py:cpu" not in trainer.epoch_estimate(0.45, 797, 2, "cpu")  # :cpu


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


def _damage(path: Path, how: str) -> None:
    if how == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    else:  # the same size, other bytes
        data = bytearray(path.read_bytes())
        data[len(data) // 2 : len(data) // 2 + 16] = b"\xff" * 16
        path.write_bytes(bytes(data))


def _largest_params_file(step_dir: Path) -> Path:
    files = [p for p in (step_dir / "params").rglob("*") if p.is_file()]
    return max(files, key=lambda p: p.stat().st_size)


@pytest.mark.parametrize("how", ["truncated", "overwritten"])
def test_a_damaged_latest_checkpoint_falls_back_to_the_previous_one(
    trained, tmp_path, text_file, capfd, how
):
    """A damaged file under checkpoints/6/params printed 160-280 lines of tensorstore
    tracebacks (truncated) or loaded silently (overwritten). Now one line names it and the
    run resumes from step 3, the previous checkpoint."""
    import shutil

    workdir = tmp_path / "copy"
    shutil.copytree(trained[0], workdir)
    _damage(_largest_params_file(workdir / "checkpoints" / "6"), how)
    capfd.readouterr()
    lines: list[str] = []
    cfg = tiny_config(text_file, train__max_steps=7, eval__final_protocols="windows")
    results = trainer.train_and_evaluate(cfg, workdir, log=lines.append)
    damaged = [line for line in lines if "is damaged" in line]
    assert len(damaged) == 1 and str(workdir / "checkpoints" / "6") in damaged[0]
    assert damaged[0].endswith("resuming from step 3 instead")
    assert any(line.startswith(f"resuming {workdir} from step 3") for line in lines)
    assert results["status"] == "finished" and results["step"] == 7
    assert "Traceback" not in "".join(capfd.readouterr())


def test_every_checkpoint_damaged_is_one_error_naming_them(trained, tmp_path, text_file):
    import shutil

    workdir = tmp_path / "copy"
    shutil.copytree(trained[0], workdir)
    for step in (3, 6):
        _damage(_largest_params_file(workdir / "checkpoints" / str(step)), "truncated")
    cfg = tiny_config(text_file, train__max_steps=7)
    with pytest.raises(ckpt_lib.DamagedCheckpointError) as info:
        trainer.train_and_evaluate(cfg, workdir, log=quiet)
    message = str(info.value)
    assert isinstance(info.value, UserError) and "\n" not in message
    assert str(workdir / "checkpoints" / "3") in message and "no undamaged checkpoint" in message


def test_full_disk_while_writing_results_is_one_line(tmp_path, text_file, monkeypatch):
    """ENOSPC while results.json is written was a 26-line OSError traceback; now one line with
    a consistent estimate, and the same command writes it once there is space."""
    import errno
    import tempfile

    real = tempfile.mkstemp

    def full(*args, prefix="", **kwargs):
        if prefix.startswith(".results.json"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, prefix=prefix, **kwargs)

    monkeypatch.setattr(workdir_lib.tempfile, "mkstemp", full)
    cfg = tiny_config(text_file, train__max_steps=3, eval__final_protocols="windows")
    workdir = tmp_path / "run"
    with pytest.raises(workdir_lib.WorkdirWriteError) as info:
        trainer.train_and_evaluate(cfg, workdir, log=quiet)
    message = str(info.value)
    assert isinstance(info.value, UserError) and "\n" not in message
    assert message.startswith(f"cannot write {workdir / 'results.json'}: no space left on device")
    assert_space_consistent(message)
    assert not list(workdir.glob(".results.json*"))  # nothing half-written
    monkeypatch.setattr(workdir_lib.tempfile, "mkstemp", real)
    results = trainer.train_and_evaluate(cfg, workdir, log=quiet)
    assert json.loads((workdir / "results.json").read_text())["final"] == results["final"]


def _scalars_as_tensorboard_shows_them(folder: Path) -> dict[str, list[int]]:
    """{tag: [step, ...]} as TensorBoard displays the event files in ``folder``: with its own
    reader (EventAccumulator, which applies purge_step) when tensorboard is installed."""
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [e.step for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.mark.skipif(
    not HAS_TENSORBOARDX or importlib.util.find_spec("tensorboard") is None,
    reason="needs tensorboardX (the writer) and tensorboard (its reader)",
)
def test_tensorboard_keeps_the_resume_steps_points(tmp_path, text_file):
    """purge_step=start_step made TensorBoard drop the resume step's train and validation
    points after every resume. A resume from step 3 after a 'kill -9' at step 6 (checkpoint 6
    deleted): every step once, with the values of metrics.jsonl."""
    cfg = tiny_config(text_file, train__tensorboard=True, eval__final_protocols="")
    workdir = tmp_path / "run"
    trainer.train_and_evaluate(cfg, workdir, log=quiet)
    with ckpt_lib.Checkpoints(workdir) as c:
        c._latest.delete(6)  # killed before checkpoint 6: the events of 4-6 are abandoned
    lines: list[str] = []
    trainer.train_and_evaluate(cfg, workdir, log=lines.append)
    assert any(line.startswith(f"resuming {workdir} from step 3") for line in lines)
    shown = _scalars_as_tensorboard_shows_them(workdir / "tensorboard")
    assert shown["train/bpc"] == [1, 2, 3, 4, 5, 6]
    assert shown["valid_windows/bpc"] == [3, 6]
    scalars = read_event_scalars(workdir / "tensorboard")  # the newest value of each step
    newest = {step: value for step, value in scalars["train/bpc"]}
    expected = {r["step"]: r["bpc"] for r in records(workdir, ("train",))}
    assert sorted(newest) == sorted(expected)
    np.testing.assert_allclose([newest[k] for k in expected], list(expected.values()), 1e-6)
