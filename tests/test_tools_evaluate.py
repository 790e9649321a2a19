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
