"""rhhjax.train.workdir: the workdir's JSON files stay valid with non-finite values; a full disk
is one line; through whole runs: the lock, a workdir that is a file, config.json checks, file
modes, results.json on a full disk and the TensorBoard events."""

import importlib.util
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import train_cases
from helpers import tiny_run_config as tiny_config
from train_cases import (
    HAS_TENSORBOARDX,
    assert_space_consistent,
    quiet,
    records,
    strict_json,
)

from rhhjax import outputs
from rhhjax.errors import UserError
from rhhjax.train import checkpoint as ckpt_lib
from rhhjax.train import trainer
from rhhjax.train import workdir as workdir_lib
from rhhjax.train.config import TrainError


def test_json_outputs_stay_valid_with_infinite_values(tmp_path):
    log = workdir_lib.MetricsLog(tmp_path / "metrics.jsonl")
    log.append({"kind": "valid", "step": 1, "ppl": math.inf, "loss": math.nan, "bpc": 2.5})
    (record,) = [strict_json(line) for line in log.path.read_text().splitlines()]
    assert record == {"kind": "valid", "step": 1, "ppl": None, "loss": None, "bpc": 2.5}
    assert strict_json(workdir_lib.json_dumps({"a": [1.0, -math.inf]})) == {"a": [1.0, None]}


def test_a_full_disk_while_appending_metrics_is_one_line(tmp_path, monkeypatch):
    import builtins
    import errno

    log = workdir_lib.MetricsLog(tmp_path / "metrics.jsonl")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(builtins, "open", full)
    with pytest.raises(workdir_lib.WorkdirWriteError) as info:
        log.append({"kind": "train", "step": 1})
    message = str(info.value)
    assert "\n" not in message and isinstance(info.value, UserError)
    assert message.startswith(f"cannot write {log.path}: no space left on device (it needs ")


def test_event_writers_opened_within_one_second_keep_separate_files(tmp_path, monkeypatch):
    """tensorboardX names an event file by the second and the host: a resume within the same
    second overwrote the first run's file (its steps vanished from TensorBoard)."""
    tensorboardX = pytest.importorskip("tensorboardX")
    monkeypatch.setattr("time.time", lambda: 1_700_000_000.25)  # one second for both writers
    first = workdir_lib.EventWriter(tensorboardX.SummaryWriter, tmp_path, start_step=0)
    first._scalars(1, {"train/bpc": 3.0})
    first.close()
    second = workdir_lib.EventWriter(tensorboardX.SummaryWriter, tmp_path, start_step=1)
    second._scalars(2, {"train/bpc": 2.5})
    second.close()
    files = sorted((tmp_path / workdir_lib.EventWriter.DIR).iterdir())
    assert len(files) == 2
    assert files[0].stat().st_size > 0 and files[1].stat().st_size > 0


@pytest.mark.parametrize("checkpoint", [None, 6])
def test_a_full_disk_says_what_the_checkpoints_hold_and_small_sizes_in_bytes(
    tmp_path, monkeypatch, checkpoint
):
    """With no checkpoint yet a full disk said "the checkpoints are intact" and "it needs
    about 0 kB"; now what the workdir holds, and bytes."""
    import errno
    import shutil

    if checkpoint:
        (tmp_path / "checkpoints" / str(checkpoint)).mkdir(parents=True)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage._replace(free=0))
    error = OSError(errno.ENOSPC, "No space left on device")
    message = str(workdir_lib._write_failure(tmp_path / "metrics.jsonl", 150, error))
    kept = (
        f"the checkpoints are intact (the latest: step {checkpoint})"
        if checkpoint
        else "no checkpoint has been written yet"
    )
    assert message == (
        f"cannot write {tmp_path}/metrics.jsonl: no space left on device (it needs about 150 "
        f"bytes, 0 bytes free); {kept}: free some space and run the same command again"
    )


def test_the_lock_is_taken_when_its_pid_cannot_be_written(tmp_path, monkeypatch):
    """On a full disk writing the pid into .lock raised a 26-line OSError traceback."""
    import errno
    import os

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    with workdir_lib.WorkdirLock(tmp_path) as lock:
        assert lock._fd is not None


text_file = train_cases.text_file  # a shared fixture (tests/train_cases.py)
trained = train_cases.trained  # a shared fixture (tests/train_cases.py)


# ----------------------------------------------------------------------------- through whole runs


def test_workdir_lock_refuses_a_second_run(tmp_path, text_file):
    workdir = tmp_path / "run"
    workdir.mkdir()
    lock = workdir_lib.WorkdirLock(workdir)
    lock.acquire()  # another run holds the workdir
    try:
        with pytest.raises(TrainError, match="in use by another run") as info:
            trainer.train_and_evaluate(tiny_config(text_file), workdir, log=quiet)
        assert str(os.getpid()) in str(info.value)
        assert not (workdir / "metrics.jsonl").exists()
    finally:
        lock.release()


def test_unwritable_workdir(tmp_path, text_file):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(TrainError, match="not a directory"):
        trainer.train_and_evaluate(tiny_config(text_file), blocker / "run", log=quiet)
    with pytest.raises(TrainError, match="not a directory"):
        trainer.train_and_evaluate(tiny_config(text_file), blocker, log=quiet)


def test_incompatible_config_json_without_checkpoint(tmp_path, text_file):
    workdir = tmp_path / "run"
    workdir.mkdir()
    other = tiny_config(text_file, model__depth=3)
    (workdir / "config.json").write_text(json.dumps(other.to_dict()))
    with pytest.raises(TrainError, match="model.depth=3"):
        trainer.train_and_evaluate(tiny_config(text_file), workdir, log=quiet)


@pytest.mark.parametrize("how", ["edited", "garbled", "deleted"])
def test_a_config_json_that_disagrees_with_the_checkpoint_is_one_warning(
    trained, tmp_path, text_file, capfd, how
):
    """config.json edited to another model size, garbled or deleted: train ran on with no
    word. Now one warning line naming the fields; the run follows the checkpoint."""
    import shutil

    workdir = tmp_path / "copy"
    shutil.copytree(trained[0], workdir)
    path = workdir / "config.json"
    if how == "edited":
        config = json.loads(path.read_text())
        config["model"]["hidden"], config["train"]["batch_size"] = 32, 5
        path.write_text(json.dumps(config))
    elif how == "garbled":
        path.write_text(path.read_text()[:100])
    else:
        path.unlink()
    capfd.readouterr()
    lines: list[str] = []
    trainer.train_and_evaluate(tiny_config(text_file), workdir, log=lines.append)
    warnings = capfd.readouterr().err.splitlines()
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: {path} "), warnings
    expected = {
        "edited": "differs from the checkpoint of step 6 in model.hidden (32 there, 16 in the "
        "checkpoint), train.batch_size (5 there, 4 in the checkpoint); following the checkpoint",
        "garbled": "does not read (not JSON); following the checkpoint of step 6",
        "deleted": "is missing; following the checkpoint of step 6",
    }[how]
    assert expected in warnings[0]
    assert any("already finished at step 6" in line for line in lines)


def test_files_share_one_mode(trained):
    """config.json / results.json are written like metrics.jsonl (0666 less the umask), not
    0600 as tempfile.mkstemp makes them."""
    workdir = trained[0]
    mode = (workdir / "metrics.jsonl").stat().st_mode & 0o777
    for name in ("config.json", "results.json"):
        assert (workdir / name).stat().st_mode & 0o777 == mode, name


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


# ----------------------------------------------------------------------------- TensorBoard events


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


def _meta(**train) -> dict:
    """A checkpoint's meta whose config is the tiny config with ``train`` fields."""
    saved = tiny_config(**{f"train__{k}": v for k, v in train.items()})
    return {"config": saved.to_dict(), "step": 40, "budget_steps": 0}


def test_a_budget_fixed_in_steps_cannot_change_on_resume(tmp_path):
    meta = {**_meta(budget_minutes=1.0), "budget_steps": 900}
    with pytest.raises(TrainError) as info:
        workdir_lib.resume_changes(tmp_path, tiny_config(train__budget_minutes=2.0), meta)
    assert "train.budget_minutes=1.0, this config has 2.0: its budget is fixed at 900" in str(
        info.value
    )
    not_fixed = {**meta, "budget_steps": 0}  # refused in the probe: the new budget applies
    assert workdir_lib.resume_changes(tmp_path, tiny_config(train__budget_minutes=2.0), not_fixed)
    assert workdir_lib.resume_changes(tmp_path, tiny_config(train__budget_minutes=1.0), meta) == []


def test_a_changed_step_size_on_resume_is_one_line_and_a_changed_warm_up_is_refused(tmp_path):
    lines = workdir_lib.resume_changes(
        tmp_path, tiny_config(train__learning_rate=1e-2), _meta(learning_rate=1e-3)
    )
    assert lines == ["resume: train.learning_rate 0.001 -> 0.01 from step 40 on"]
    cosine = dict(schedule="cosine", max_steps=500, warmup_steps=10)
    with pytest.raises(TrainError, match="train.warmup_steps=10, this config has 20: its sched"):
        workdir_lib.resume_changes(
            tmp_path,
            tiny_config(**{f"train__{k}": v for k, v in {**cosine, "warmup_steps": 20}.items()}),
            _meta(**cosine),
        )
    longer = tiny_config(**{f"train__{k}": v for k, v in {**cosine, "max_steps": 900}.items()})
    (line,) = workdir_lib.resume_changes(tmp_path, longer, _meta(**cosine))
    assert line.startswith("resume: train.max_steps 500 -> 900") and "keeps the length" in line


def test_an_existing_workdir_is_locked_at_start_up_and_the_run_keeps_that_lock(tmp_path):
    """The first run took its lock 9.8 s after it started: a second one started meanwhile was
    refused only after 32-49 s. The command line's workdir is locked before jax is imported."""
    workdir = tmp_path / "w"
    workdir.mkdir()
    trainer.check_workdir_free(["train.py", "--config=ptb:tiny", f"--workdir={workdir}"])
    with pytest.raises(outputs.WorkdirInUseError, match=f"process {os.getpid()}"):
        outputs.check_workdir_free(workdir)  # what a second run checks
    lock = workdir_lib.WorkdirLock(workdir)
    lock.acquire()  # the trainer takes over the lock held since start-up
    lock.release()
    outputs.check_workdir_free(workdir)  # released with the run


@pytest.mark.parametrize("step_seconds, refused", [(10.0, True), (0.001, False)])
def test_a_recorded_budget_refusal_stands_only_where_the_step_time_alone_refuses(
    tmp_path, step_seconds, refused
):
    """A budget its first steps' compilation made too short is measured again (a cached
    compile may fit it); one its step time alone cannot hold is refused at once."""
    from rhhjax.train import config as train_config

    train = train_config.default_config().train
    train.update(budget_minutes=1.0, schedule="cosine", warmup_steps=20)
    workdir_lib.record_budget_refusal(tmp_path, train, "cpu", "error line", step_seconds)
    if refused:
        with pytest.raises(TrainError, match="^error line \\(measured by an earlier run"):
            workdir_lib.check_budget_refusal(tmp_path, train, "cpu")
    else:
        workdir_lib.check_budget_refusal(tmp_path, train, "cpu")
    workdir_lib.check_budget_refusal(tmp_path, train, "NVIDIA H200")  # another device
    train.warmup_steps = 2
    workdir_lib.check_budget_refusal(tmp_path, train, "cpu")  # a changed budget field
