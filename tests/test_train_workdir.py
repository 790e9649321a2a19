"""rhhjax.train.workdir: the workdir's JSON files stay valid with non-finite values; a full
disk is one line. (The lock, file modes and resume checks run through whole runs:
tests/test_train_trainer.py.)"""

import json
import math

import pytest

from rhhjax.errors import UserError
from rhhjax.train import workdir as workdir_lib


def strict_json(text: str):
    def refuse(name):
        raise ValueError(f"invalid JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


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
