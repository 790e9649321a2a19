"""Checkpoint managers: bitwise round trip, retention of latest / best, pruning, read-only use,
a failed save, checksums written and checked; through whole runs: a kill between two saves, a
full disk, damaged checkpoints. (The checksum table alone: test_train_checksums.py; the
failure lines alone: test_train_checkpoint_failures.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import train_cases
from helpers import tiny_run_config as tiny_config
from train_cases import (
    assert_space_consistent,
    quiet,
    records,
)

from rhhjax.errors import UserError
from rhhjax.train import checkpoint as ckpt_lib
from rhhjax.train import checksums, trainer


def make_state(seed: int = 0):
    key = jax.random.key(seed)
    params = {
        "embed": {"embedding": jax.random.normal(key, (5, 3))},
        "head": {
            "kernel": jax.random.normal(jax.random.fold_in(key, 1), (3, 5)),
            "bias": jnp.arange(5, dtype=jnp.float32),
        },
    }
    tx = optax.adam(1e-3)
    opt_state = tx.init(params)
    _, opt_state = tx.update(params, opt_state, params)  # non-trivial moments and count
    carry = (jnp.ones((2, 4)), jnp.full((2, 3), 0.5))
    return params, opt_state, carry


def meta(step: int, **extra) -> dict:
    return {"version": ckpt_lib.META_VERSION, "step": step, "vocab": {"symbols": ["a"]}, **extra}


def assert_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_round_trip_is_bitwise(tmp_path):
    params, opt_state, carry = make_state()
    with ckpt_lib.Checkpoints(tmp_path, keep=2) as c:
        c.save_latest(7, params, opt_state, carry, meta(7, pending={"loss": [0.1, 1 / 3]}))
    templates = ckpt_lib.abstract(make_state(seed=1))
    with ckpt_lib.Checkpoints(tmp_path, keep=2) as c:
        assert c.latest_step() == 7
        p, o, k, m = c.restore_latest(7, *templates)
    assert_equal(p, params)
    assert_equal(o, opt_state)  # optax named tuples come back as such
    assert isinstance(o[0], optax.ScaleByAdamState)
    assert_equal(k, carry)
    assert m["pending"]["loss"] == [0.1, 1 / 3]  # floats survive JSON exactly


def test_bare_array_carry(tmp_path):
    """The plain RHN's carry is one array (not a tree)."""
    params, opt_state, _ = make_state()
    carry = jnp.arange(6.0).reshape(2, 3)
    with ckpt_lib.Checkpoints(tmp_path) as c:
        c.save_latest(1, params, opt_state, carry, meta(1))
        _, _, k, _ = c.restore_latest(1, *ckpt_lib.abstract((params, opt_state, carry)))
    assert_equal(k, carry)


def test_retention_and_prune(tmp_path):
    params, opt_state, carry = make_state()
    with ckpt_lib.Checkpoints(tmp_path, keep=2) as c:
        for step in (1, 2, 3, 4):
            c.save_latest(step, params, opt_state, carry, meta(step))
        c.save_best(2, params, meta(2))
        c.save_best(4, params, meta(4))
        assert c.steps("latest") == [3, 4]
        # the old best stays until the latest checkpoint records the new one (a kill between
        # the two saves must not leave the resumed run without its best)
        assert c.steps("best") == [2, 4]
        assert c.keep_only_best(4) == [2] and c.steps("best") == [4]
        c.save_latest(4, params, opt_state, carry, meta(4, again=True))  # same step: replaced
        assert c.read_meta("latest")["again"] is True
        assert sorted(c.prune_after(3)) == [4, 4]
        assert c.steps("latest") == [3] and c.steps("best") == []


def test_read_only_and_inference_loading(tmp_path):
    with pytest.raises(ckpt_lib.CheckpointError, match="does not exist"):
        ckpt_lib.load_for_inference(tmp_path / "missing")
    with pytest.raises(ckpt_lib.CheckpointError, match="no checkpoint"):
        ckpt_lib.load_for_inference(tmp_path)
    assert not ckpt_lib.has_checkpoint(tmp_path)
    params, opt_state, carry = make_state()
    with ckpt_lib.Checkpoints(tmp_path, keep=3) as c:
        c.save_latest(5, params, opt_state, carry, meta(5))
    # no best yet: "best" falls back to the latest
    p, m, used = ckpt_lib.load_for_inference(tmp_path, "best")
    assert used == "latest" and m["step"] == 5
    assert_equal(p, params)
    with ckpt_lib.Checkpoints(tmp_path, keep=3) as c:
        c.save_best(3, jax.tree.map(lambda x: x + 1, params), meta(3))
    p, m, used = ckpt_lib.load_for_inference(tmp_path, "best")
    assert used == "best" and m["step"] == 3
    assert_equal(p, jax.tree.map(lambda x: x + 1, params))
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    with ckpt_lib.Checkpoints(tmp_path, read_only=True) as c:
        assert c.latest_step() == 5 and c.best_step() == 3
        with pytest.raises(ckpt_lib.CheckpointError, match="read-only"):
            c.save_best(9, params, meta(9))
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def test_unfinished_save_is_ignored(tmp_path):
    """A temporary folder left by kill -9 during a save is not a checkpoint."""
    (tmp_path / "checkpoints" / "12.orbax-checkpoint-tmp-1").mkdir(parents=True)
    assert not ckpt_lib.has_checkpoint(tmp_path)
    params, opt_state, carry = make_state()
    with ckpt_lib.Checkpoints(tmp_path) as c:
        assert c.latest_step() is None
        c.save_latest(3, params, opt_state, carry, meta(3))
        assert c.steps("latest") == [3]


def test_failed_save_is_one_line_and_cleans_up(tmp_path, monkeypatch):
    """A save that fails mid-way (ENOSPC from the storage layer) raises CheckpointError with
    one line naming the folder, the step, the space needed and the checkpoint left; orbax's
    unfinished folder is removed."""
    import orbax.checkpoint as ocp

    params, opt_state, carry = make_state()
    real_save = ocp.CheckpointManager.save

    def failing(self, step, *args, **kwargs):
        (Path(self.directory) / f"{step}.orbax-checkpoint-tmp-99").mkdir()
        raise ValueError("RESOURCE_EXHAUSTED: write failed: No space left on device")

    with ckpt_lib.Checkpoints(tmp_path, keep=3) as c:
        c.save_latest(1, params, opt_state, carry, meta(1))
        monkeypatch.setattr(ocp.CheckpointManager, "save", failing)
        with pytest.raises(ckpt_lib.CheckpointError) as info:
            c.save_latest(2, params, opt_state, carry, meta(2))
        monkeypatch.setattr(ocp.CheckpointManager, "save", real_save)
        assert c.steps("latest") == [1]
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        f"cannot write the checkpoint of step 2 to {tmp_path.absolute() / 'checkpoints'}: "
        "no space left on device (it needs "
    )
    assert message.endswith(
        "the last checkpoint (step 1) is intact; free some space and run the same command "
        "again to resume"
    )
    assert not any("tmp" in p.name for p in (tmp_path / "checkpoints").iterdir())


def _saved(tmp_path):
    """Latest checkpoints 1 and 2 and a best one at 2 in ``tmp_path``."""
    params, opt_state, carry = make_state()
    with ckpt_lib.Checkpoints(tmp_path, keep=3) as c:
        for step in (1, 2):
            c.save_latest(step, params, opt_state, carry, meta(step))
        c.save_best(2, params, meta(2))
    return params


def _params_files(step_dir: Path) -> list[Path]:
    return sorted(p for p in (step_dir / "params").rglob("*") if p.is_file())


def test_every_saved_checkpoint_has_checksums_of_all_its_files(tmp_path):
    _saved(tmp_path)
    for step_dir in (tmp_path / "checkpoints" / "1", tmp_path / "best" / "2"):
        table = json.loads((step_dir / checksums.CHECKSUMS_FILE).read_text())
        files = {
            str(p.relative_to(step_dir))
            for p in step_dir.rglob("*")
            if p.is_file() and p.name != checksums.CHECKSUMS_FILE
        }
        assert set(table) == files and any(name.startswith("params/") for name in table)


@pytest.mark.parametrize("how", ["truncated", "overwritten", "missing"])
def test_a_damaged_best_checkpoint_is_one_error_naming_it_and_the_undamaged_ones(tmp_path, how):
    """evaluate / sample read the best checkpoint through load_for_inference: a damaged one is
    a DamagedCheckpointError (a UserError, one line) naming it and the other checkpoints,
    raised before orbax reads it."""
    _saved(tmp_path)
    target = max(_params_files(tmp_path / "best" / "2"), key=lambda p: p.stat().st_size)
    if how == "truncated":
        target.write_bytes(target.read_bytes()[:10])
    elif how == "overwritten":
        data = bytearray(target.read_bytes())
        data[-8:] = b"\x00" * 8
        target.write_bytes(bytes(data))
    else:
        target.unlink()
    with pytest.raises(ckpt_lib.DamagedCheckpointError) as info:
        ckpt_lib.load_for_inference(tmp_path, "best")
    message = str(info.value)
    assert isinstance(info.value, UserError) and "\n" not in message
    assert message.startswith(f"checkpoint {tmp_path / 'best' / '2'} is damaged (params/")
    assert message.endswith(f"undamaged checkpoints in {tmp_path}: checkpoints/2, checkpoints/1")
    assert info.value.which == "best" and info.value.step == 2
    assert info.value.alternatives == (("latest", 2), ("latest", 1))
    params, _, used = ckpt_lib.load_for_inference(tmp_path, "latest")  # the others still load
    assert used == "latest"


def test_a_checkpoint_without_checksums_must_hold_finite_parameters(tmp_path):
    """Checkpoints of older versions have no checksums: non-finite parameters (what
    overwritten bytes read as) are refused instead of loading silently."""
    params, opt_state, carry = make_state()
    bad = jax.tree.map(lambda x: x.at[0].set(jnp.nan), params)
    with ckpt_lib.Checkpoints(tmp_path) as c:
        c.save_latest(1, params, opt_state, carry, meta(1))
        c.save_latest(2, bad, opt_state, carry, meta(2))
    for step in (1, 2):
        (tmp_path / "checkpoints" / str(step) / checksums.CHECKSUMS_FILE).unlink()
    with ckpt_lib.Checkpoints(tmp_path, read_only=True) as c:
        with pytest.raises(ckpt_lib.DamagedCheckpointError, match="non-finite parameters"):
            c.restore_params("latest", 2)
        restored, _ = c.restore_params("latest", 1)
    assert_equal(restored, params)


def test_a_damaged_checkpoint_lists_only_the_undamaged_others(tmp_path):
    """The list of other checkpoints named damaged ones too (a dead end for the user)."""
    _saved(tmp_path)
    for step_dir in (tmp_path / "best" / "2", tmp_path / "checkpoints" / "1"):
        target = max(_params_files(step_dir), key=lambda p: p.stat().st_size)
        target.write_bytes(target.read_bytes()[:10])
    with pytest.raises(ckpt_lib.DamagedCheckpointError) as info:
        ckpt_lib.load_for_inference(tmp_path, "best")
    assert str(info.value).endswith(f"undamaged checkpoints in {tmp_path}: checkpoints/2")
    assert info.value.alternatives == (("latest", 2),)


text_file = train_cases.text_file  # a shared fixture (tests/train_cases.py)
trained = train_cases.trained  # a shared fixture (tests/train_cases.py)


# ----------------------------------------------------------------------------- through whole runs


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
