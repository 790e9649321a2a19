"""`rhhjax.train.trainer.train_and_evaluate` end to end on the tiny config: a run's outputs and
start-up line, real PTB, a rerun of a finished run, a workdir of another config refused, and an
out-of-memory error as one line. Shared data and run: tests/train_cases.py. Then the program
(train.py, rhhjax-train, python -m rhhjax.train): its default workdir, a missing --config as one
line, --help, the checks before jax is imported. Signals and resuming through the command line:
tests/test_tools_command_lines.py.
"""

from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest
import train_cases
from helpers import PTB_CONFIG, PTB_DIR, ROOT, tiny_run_config
from helpers import tiny_run_config as tiny_config
from train_cases import (
    HAS_TENSORBOARDX,
    quiet,
    records,
    wrap_train_step,
)

from rhhjax import configs
from rhhjax import data as data_lib
from rhhjax.errors import UserError
from rhhjax.train import checkpoint as ckpt_lib
from rhhjax.train import loop as train_loop
from rhhjax.train import trainer
from rhhjax.train.config import TrainError

text_file = train_cases.text_file  # a shared fixture (tests/train_cases.py)
trained = train_cases.trained  # a shared fixture (tests/train_cases.py)


# ---------------------------------------------------------------------------- a run and its outputs


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


def test_start_up_says_which_implementation_auto_picked_and_why(trained):
    """model.impl=auto (the default) is resolved once; the run says in one line what runs."""
    _, cfg, _, lines = trained
    assert cfg.model.impl == "auto"
    chosen = [line for line in lines if line.startswith("model.impl=")]
    expected = "scan" if jax.default_backend() == "cpu" else "fused"
    assert len(chosen) == 1 and chosen[0].startswith(f"model.impl=auto runs {expected}: ")
    assert "results/bench_" in chosen[0]  # the measurements it rests on


def ptb_config(variant: str = "tiny"):
    return configs.load(f"ptb:{variant}")


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


# ----------------------------------------------------------------------------- a rerun


def snapshot(workdir: Path) -> dict[str, bytes]:
    """Every file of ``workdir`` (relative path -> bytes) but ``.lock``, which holds the pid of
    the last program that held it (train.py locks an existing workdir at start-up)."""
    files = {str(p.relative_to(workdir)): p.read_bytes() for p in workdir.rglob("*") if p.is_file()}
    files.pop(".lock", None)
    return files


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


def test_a_finished_run_answers_already_finished_before_any_writability_check(
    trained, text_file, monkeypatch
):
    """A finished run on a read-only workdir exited 1 ("not writable"); the docs promise
    "already finished" and exit 0 (a rerun of a finished run writes nothing)."""
    from rhhjax.train import setup

    def read_only(workdir):
        raise TrainError(f"workdir {workdir} is not writable (Read-only file system)")

    monkeypatch.setattr(setup.workdir_lib, "check_workdir_writable", read_only)
    workdir, _, results, _ = trained
    lines: list[str] = []
    again = trainer.train_and_evaluate(tiny_config(text_file), workdir, log=lines.append)
    assert again["final"] == results["final"] and again.get("exit_code", 0) == 0
    assert any("already finished at step 6" in line for line in lines)


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
        with pytest.raises(TrainError, match=needle):
            trainer.train_and_evaluate(tiny_config(text_file, **overrides), workdir, log=quiet)
    assert sorted(p.name for p in workdir.rglob("*")) == before


# ----------------------------------------------------------------------------- out of memory


def test_an_out_of_memory_in_a_training_step_is_one_line_naming_the_field(
    tmp_path, text_file, monkeypatch
):
    """A RESOURCE_EXHAUSTED at run time was a 40-48-line traceback; now one line: the phase,
    what is kept (the checkpoint of step 3) and the field to lower."""

    def wrap(fn):
        def wrapped(*args):
            if int(args[6]) == 4:  # the 5th step
                raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 9")
            return fn(*args)

        return wrapped

    wrap_train_step(monkeypatch, wrap)
    workdir = tmp_path / "oom"
    with pytest.raises(UserError) as info:
        trainer.train_and_evaluate(tiny_config(text_file), workdir, log=quiet)
    assert str(info.value) == (
        "out of memory during training (JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory "
        f"allocating 9); the last checkpoint (step 3) is intact in {workdir}; lower "
        "train.batch_size (or train.seq_len)"
    )
    with ckpt_lib.Checkpoints(workdir, read_only=True) as c:
        assert c.steps("latest") == [3]


def test_an_out_of_host_memory_in_validation_names_eval_batch_size(
    tmp_path, text_file, monkeypatch
):
    """numpy's ArrayMemoryError during validation was a 36-line traceback."""

    def no_memory(*args, **kwargs):
        raise MemoryError("Unable to allocate 5.96 GiB for an array with shape (8, 100000000)")

    monkeypatch.setattr(train_loop.eval_lib, "evaluate_tokens", no_memory)
    with pytest.raises(UserError) as info:
        trainer.train_and_evaluate(tiny_config(text_file), tmp_path / "oom", log=quiet)
    message = str(info.value)
    assert message.startswith("out of memory during validation (MemoryError: Unable to ")
    assert message.endswith("; no checkpoint was written yet; lower eval.batch_size")


def test_a_finished_run_without_its_config_json_is_already_finished_from_the_command_line(
    trained, text_file, tmp_path
):
    """``config.json`` deleted from a finished run, then the same command
    again: "already finished", read from the checkpoint (its meta holds the config); nothing
    re-evaluated, nothing written (config.json stays missing), one warning line."""
    import shutil

    workdir = tmp_path / "run"
    shutil.copytree(trained[0], workdir)
    (workdir / "config.json").unlink()
    before = snapshot(workdir)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "--config=ptb:tiny",
         "--config.data.format=text", f"--config.data.text_files={text_file}",
         "--config.data.hutter_holdout=3000", f"--workdir={workdir}"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"{workdir} already finished at step 6: nothing to do" in proc.stdout
    assert "final evaluation" not in proc.stdout and "evaluating" not in proc.stdout
    assert proc.stderr.splitlines() == [
        f"warning: {workdir / 'config.json'} is missing; following the checkpoint of step 6"
    ]
    assert snapshot(workdir) == before


# ---------------------------------------------------- the program: train.py, rhhjax-train, -m


@pytest.mark.parametrize(
    "config, workdir",
    [("configs/ptb.py:cpu", "workdirs/ptb_cpu"), ("ptb", "workdirs/ptb"),
     ("/x/enwik8.py", "workdirs/enwik8")],
)  # fmt: skip
def test_the_default_workdir_is_named_after_the_config(config, workdir):
    assert trainer.default_workdir(config) == workdir


def run(args):
    return subprocess.run(args, env=dict(os.environ), cwd=ROOT, capture_output=True, text=True,
                          timeout=240)  # fmt: skip


def test_a_missing_config_is_one_line():
    proc = run([sys.executable, str(ROOT / "train.py")])
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: --config is required, e.g. --config=ptb:cpu or --config=FILE.py"
    ]


def test_help_lists_variants_and_fields_and_exits_0():
    proc = run([sys.executable, str(ROOT / "train.py"), f"--config={PTB_CONFIG}:cpu", "--help"])
    assert proc.returncode == 0, proc.stderr
    assert "Exit status:" in proc.stdout and f"{PTB_CONFIG}:tiny" in proc.stdout
    assert "  model.depth = 3" in proc.stdout  # the cpu variant's value
    assert "  train.checkpoint_every_minutes = " in proc.stdout


def test_a_second_run_on_a_workdir_in_use_is_refused_before_jax_is_imported(tmp_path):
    """A second train on a workdir in use was refused only after 17 s (the
    trainer takes the lock after loading data and initialising)."""
    import fcntl

    from helpers import write_text

    text = write_text(tmp_path / "t.txt", 10_000)
    workdir = tmp_path / "w"
    workdir.mkdir()
    with open(workdir / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("4242\n")
        held.flush()
        proc = run([sys.executable, "-X", "importtime", str(ROOT / "train.py"),
                    "--config=ptb:tiny", "--config.data.format=text",
                    f"--config.data.text_files={text}", f"--workdir={workdir}"])  # fmt: skip
    lines = proc.stderr.splitlines()
    errors = [line for line in lines if not line.startswith("import time:")]
    assert proc.returncode == 1 and errors == [
        f"error: workdir {workdir} is in use by another run (process 4242); wait for it to "
        f"finish or use another --workdir"
    ], proc.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import")}
    assert "jax" not in imported and "numpy" not in imported
    assert sorted(p.name for p in workdir.iterdir()) == [".lock"]  # nothing written


def test_train_py_of_a_checkout_shadowing_a_non_editable_install_says_pip_install_e(tmp_path):
    """``python train.py`` in a checkout whose rhhjax is installed
    non-editable failed with "No module named 'rhhjax.configs'" (the checkout's rhhjax/ comes
    first on the path and has no configs/). ``python -S`` leaves out the editable install's
    finder, as a non-editable install has none."""
    import shutil
    import sysconfig

    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT / "rhhjax", checkout / "rhhjax",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    shutil.copytree(ROOT / "configs", checkout / "configs")
    shutil.copy(ROOT / "train.py", checkout / "train.py")
    proc = subprocess.run(
        [sys.executable, "-S", "train.py", "--config=configs/ptb.py:tiny"],
        env={**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"]},
        cwd=checkout, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f"error: {checkout / 'rhhjax'} has no rhhjax.configs: this checkout is not installed "
        f"editable (a non-editable install does not serve its train.py): run pip install -e . "
        f"in {checkout}"
    ]


def test_the_install_check_passes_an_install_with_its_configs():
    trainer.check_install()  # this checkout: installed editable
    with pytest.raises(UserError, match=r"run pip install -e \. in "):
        trainer.check_install(find_spec=lambda name: None)


def test_from_train_py_the_loss_is_three_files_away():
    """train.py runs this module (the program and ``train_and_evaluate``), which takes the
    Loop from loop.py and the step with the loss (``make_train_step``) from step.py: three
    files. A program module of its own between train.py and this one would make it four."""
    (runs,) = [n.module for n in ast.parse((ROOT / "train.py").read_text()).body
               if isinstance(n, ast.ImportFrom)]  # fmt: skip
    assert runs == "rhhjax.train.trainer"
    tree = ast.parse(Path(trainer.__file__).read_text())
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert {"console", "main", "train_and_evaluate"} <= defined
    imported = {(n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                for a in n.names}  # fmt: skip
    assert {("rhhjax.train.loop", "Loop"), ("rhhjax.train", "step")} <= imported
    assert "step_lib.make_train_step(" in ast.unparse(tree)  # the loss's step, from step.py


def test_a_finished_budget_run_is_not_told_to_raise_max_steps(tmp_path):
    """Raising max_steps does nothing to a run its budget stopped: the line says so."""
    train = tiny_run_config(train__budget_minutes=8.0).train
    budget = trainer.finished_line(tmp_path, {"step": 700, "stop_reason": "budget"}, train)
    assert "raise train.max_steps" not in budget and "another --workdir" in budget
    steps = trainer.finished_line(tmp_path, {"step": 6, "stop_reason": "max_steps"}, train)
    assert "raise train.max_steps / max_epochs / max_minutes" in steps
