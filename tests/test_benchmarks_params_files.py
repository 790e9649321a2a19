"""benchmarks/params_files.py: a run's parameters out of a GPU loan in small float32 files,
and back into a workdir the tools read."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
import train_cases
from benchmark_scripts import load
from helpers import assert_trees_equal

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
    with pytest.raises(ValueError, match="values, the model has"):
        params_files.load(tmp_path / "out")


def test_a_gpu_run_with_a_kernel_impl_imports_on_a_cpu(trained, tmp_path):
    workdir, _, _, _ = trained
    params_files.export(workdir, tmp_path / "out", parts=2)
    index_file = tmp_path / "out" / params_files.INDEX
    index = json.loads(index_file.read_text())
    index["meta"]["model"]["impl"] = "persistent"  # as a GPU loan's run saves it
    index_file.write_text(json.dumps(index))
    params, meta = params_files.load(tmp_path / "out")
    assert meta["model"]["impl"] == "persistent"
    assert_trees_equal(params, saved_run.load_run(workdir).params)
