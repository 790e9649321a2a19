"""`benchmarks/kernel_source.py`: the hash covers exactly the kernels and their ops, and a
record stands only for the source that passed."""

from __future__ import annotations

import json
import shutil

import pytest
from benchmark_scripts import load

kernel_source = load("kernel_source")
PASSED = "==== 21 passed, 3 skipped in 75.40s ===="


@pytest.fixture
def tree(tmp_path):
    """A copy of the hashed folders and one file outside them."""
    for folder in kernel_source.SOURCES:
        shutil.copytree(kernel_source.ROOT / folder, tmp_path / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    (tmp_path / "README.md").write_text("docs\n")
    return tmp_path


def test_the_hash_of_a_copy_is_the_trees_and_names_every_kernel_and_op_file(tree):
    copied = kernel_source.source_hash(tree)
    assert copied == kernel_source.source_hash()
    assert "rhhjax/ops/persistent.py" in copied["files"]
    assert any(p.startswith("kernels/mosaic/") for p in copied["files"])


@pytest.mark.parametrize(
    "path", ["kernels/mosaic/gemm.py", "rhhjax/ops/persistent.py", "kernels/mosaic/new.py"]
)
def test_any_kernel_or_op_edit_changes_the_hash_and_check_names_it(tree, path):
    out = tree / "gpu_tested.json"
    kernel_source.record(out, PASSED, "NVIDIA H200", None, root=tree)
    assert kernel_source.check(out, tree)[0] == 0
    with open(tree / path, "a") as f:
        f.write("\n# edited\n")
    code, line = kernel_source.check(out, tree)
    assert code == 1 and path in line and "NVIDIA H200" in line


def test_an_edit_outside_the_kernels_and_ops_keeps_the_record(tree):
    out = tree / "gpu_tested.json"
    kernel_source.record(out, PASSED, "NVIDIA H100", None, root=tree)
    (tree / "README.md").write_text("other docs\n")
    code, line = kernel_source.check(out, tree)
    assert code == 0 and line.startswith("kernels unchanged since the GPU run of")


@pytest.mark.parametrize(
    "log",
    [
        "",
        "tests/test_ops_persistent.py::test_x PASSED\n(cut by the time limit)",
        "==== 20 passed, 1 failed in 80.00s ====",
        "==== 20 passed, 1 error in 80.00s ====",
        "==== 3 skipped in 1.00s ====",
    ],
)
def test_a_log_without_every_test_passed_records_nothing(tmp_path, log):
    out = tmp_path / "gpu_tested.json"
    with pytest.raises(ValueError, match="did not all pass"):
        kernel_source.record(out, log, "NVIDIA H200", None)
    assert not out.exists()


def test_the_record_keeps_the_device_and_the_autotune_winners(tmp_path):
    out = tmp_path / "gpu_tested.json"
    winners = {"paper bfloat16": "layout=rowgroup"}
    kernel_source.record(out, PASSED, "NVIDIA H200", {"winners": winners})
    saved = json.loads(out.read_text())
    assert saved["device"] == "NVIDIA H200" and saved["autotune_winners"] == winners
    assert saved["sha256"] == kernel_source.source_hash()["sha256"]


@pytest.mark.parametrize("content", [None, "not json", "{}"])
def test_check_of_a_missing_or_bad_record_is_exit_2_in_one_line(tmp_path, content):
    out = tmp_path / "gpu_tested.json"
    if content is not None:
        out.write_text(content)
    code, line = kernel_source.check(out)
    assert code == 2 and "\n" not in line and str(out) in line
