"""benchmarks/params_files.py: a run's parameters off a GPU machine in small float32 files,
and back into a workdir the tools read; a damaged export is one line, nothing written."""

from __future__ import annotations

import json
import subprocess
import sys

import jax
import numpy as np
import pytest
import train_cases
from benchmark_scripts import load
from helpers import ROOT, assert_trees_equal

from rhhjax.errors import UserError
from rhhjax.train import saved_run

params_files = load("params_files")
text_file = train_cases.text_file  # a shared fixture (tests/train_cases.py)
trained = train_cases.trained  # a shared fixture (tests/train_cases.py)


def test_exported_parts_import_as_the_same_best_checkpoint(trained, tmp_path):
    workdir, _, results, _ = trained
    files = params_files.export(workdir, tmp_path / "out", parts=3)
    assert [f.name for f in files] == ["params_0.npy", "params_1.npy", "params_2.npy"]
    sizes = [np.load(f).size for f in files]
    original = saved_run.load_run(workdir)
    n_params = sum(int(np.size(v)) for v in jax.tree.leaves(original.params))
    assert sum(sizes) == n_params and max(sizes) - min(sizes) <= 1
    index = json.loads((tmp_path / "out" / params_files.INDEX).read_text())
    assert index["meta"]["step"] == results["best_step"]

    imported = params_files.import_(tmp_path / "out", tmp_path / "back")
    back = saved_run.load_run(imported)
    assert_trees_equal(back.params, original.params)  # float32 in, float32 out: exact
    assert back.model == original.model


def test_a_part_missing_values_is_refused(trained, tmp_path):
    workdir, _, _, _ = trained
    params_files.export(workdir, tmp_path / "out", parts=2)
    part = tmp_path / "out" / "params_1.npy"
    np.save(part, np.load(part)[:-1])
    with pytest.raises(UserError, match="params_1.npy does not match its SHA-256"):
        params_files.load(tmp_path / "out")
    index_file = tmp_path / "out" / params_files.INDEX
    index = json.loads(index_file.read_text())
    del index["sha256"], index["part_sizes"]  # an export from before the checksums
    index_file.write_text(json.dumps(index))
    with pytest.raises(UserError, match="values, the model has"):
        params_files.load(tmp_path / "out")


def _damage(out, how: str) -> None:
    """Damage an export of 2 parts as a copy off a machine might."""
    first, second = out / "params_0.npy", out / "params_1.npy"
    if how == "swapped":
        a, b = first.read_bytes(), second.read_bytes()
        first.write_bytes(b)
        second.write_bytes(a)
    elif how == "missing":
        second.unlink()
    elif how == "truncated":
        second.write_bytes(second.read_bytes()[:100])


@pytest.mark.parametrize(
    "how, needle",
    [
        ("swapped", "params_0.npy does not match its SHA-256"),
        ("missing", "params_1.npy is missing: the export has 2 parts"),
        ("truncated", "params_1.npy does not match its SHA-256"),
    ],
)
def test_a_damaged_export_is_refused_in_one_line_writing_nothing(trained, tmp_path, how, needle):
    """Swapped parts built a wrong model without a word (valid BPC 5.19 instead of 3.49)."""
    workdir, _, _, _ = trained
    params_files.export(workdir, tmp_path / "out", parts=2)
    _damage(tmp_path / "out", how)
    with pytest.raises(UserError) as info:
        params_files.import_(tmp_path / "out", tmp_path / "back")
    assert needle in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "back").exists()


def test_an_import_into_an_existing_workdir_is_refused_before_reading(tmp_path):
    (tmp_path / "back").mkdir()
    with pytest.raises(UserError, match="back exists: import writes a new workdir"):
        params_files.import_(tmp_path / "no_such_folder", tmp_path / "back")


def test_importing_a_missing_folder_is_one_error_line_and_exit_1(tmp_path):
    script = ROOT / "benchmarks" / "params_files.py"
    args = [sys.executable, str(script), "import", str(tmp_path / "nope"), str(tmp_path / "w")]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"error: {tmp_path / 'nope'} is not a folder: give the OUT_DIR of params_files.py export"
    ]
    assert not (tmp_path / "w").exists()


def test_a_gpu_run_with_a_kernel_impl_imports_on_a_cpu(trained, tmp_path):
    workdir, _, _, _ = trained
    params_files.export(workdir, tmp_path / "out", parts=2)
    index_file = tmp_path / "out" / params_files.INDEX
    index = json.loads(index_file.read_text())
    index["meta"]["model"]["impl"] = "persistent"  # as a GPU run saves it
    index_file.write_text(json.dumps(index))
    params, meta = params_files.load(tmp_path / "out")
    assert meta["model"]["impl"] == "persistent"
    assert_trees_equal(params, saved_run.load_run(workdir).params)
