"""The evaluate program (`rhhjax.tools.evaluate`) on the shared trained run: the checkpoint's
results again, data that has moved.
"""

from __future__ import annotations

import pytest
import train_cases
from train_cases import (
    quiet,
)

from rhhjax import data as data_lib
from rhhjax.errors import UserError
from rhhjax.tools import evaluate as evaluate_tool

text_file = train_cases.text_file  # a shared fixture (tests/train_cases.py)
trained = train_cases.trained  # a shared fixture (tests/train_cases.py)


def test_evaluate_checkpoint_matches_training_results(trained):
    workdir, _, results, _ = trained
    out = evaluate_tool.run(str(workdir), split="all", protocol="all", which="best", log=quiet)
    assert out["checkpoint"] == "best" and out["step"] == results["best_step"]
    assert out["results"] == results["final"]
    latest = evaluate_tool.run(
        str(workdir), split="test", protocol="stream", which="latest", log=quiet
    )
    assert latest["step"] == 6 and set(latest["results"]) == {"test"}


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


def test_sigterm_during_an_evaluation_is_one_line_saying_nothing_was_written(trained, tmp_path):
    """SIGTERM during rhhjax-evaluate exited 143 without a word. The run's
    text is given as a named pipe, so the program blocks reading it (after its signal catcher
    started) until the test has sent the signal: deterministic on a loaded machine."""
    import os
    import signal
    import subprocess
    import sys

    workdir = trained[0]
    fifo = tmp_path / "text.fifo"
    os.mkfifo(fifo)
    output = tmp_path / "out.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rhhjax.tools.evaluate", f"--workdir={workdir}",
         f"--text_files={fifo}", f"--output={output}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    with open(fifo, "wb"):  # returns once the program has opened the pipe for reading
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert stderr.splitlines() == [
        "error: stopped by SIGTERM during the evaluation; nothing was written"
    ]
    assert not output.exists()


def test_a_moved_text_file_names_the_flag_that_points_at_it(trained, tmp_path):
    """Evaluating a run whose text file has moved was one line without a
    hint of --text_files."""
    from rhhjax.train import saved_run

    run = saved_run.load_run(str(trained[0]), "best")
    moved = str(tmp_path / "gone" / "shake.txt")
    run.config.data.text_files = moved  # the run's data section names a file no longer there
    with pytest.raises(data_lib.DataError) as info:
        run.corpus()
    message = str(info.value)
    assert message.startswith(f"cannot read text file {moved}: ")
    assert message.endswith(
        "; if the run's data has moved, give its new place with --text_files=FILE (or "
        "FILE,FILE,FILE)"
    )


def test_a_place_given_by_flag_that_fails_is_not_advised_again(trained):
    """--text_files / --data_dir naming a bad place advised giving that flag."""
    with pytest.raises(data_lib.DataError) as info:
        evaluate_tool.run(str(trained[0]), "test", "stream", log=quiet, text_files="/nowhere.txt")
    assert "give its new place" not in str(info.value)


def test_an_impl_that_cannot_run_here_names_the_impl_flag(trained, monkeypatch):
    """evaluate --impl=persistent on a CPU advised model.impl, a field evaluate has no flag for."""
    from rhhjax.ops import spec

    monkeypatch.setattr(spec.jax, "default_backend", lambda: "cpu")
    with pytest.raises(UserError) as info:
        evaluate_tool.run(str(trained[0]), "test", "stream", impl="persistent", log=quiet)
    assert str(info.value).startswith("--impl='persistent' compiles")
    assert "use --impl=fused or scan" in str(info.value) and "model.impl" not in str(info.value)
