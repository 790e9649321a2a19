"""rhhjax.outputs: output paths checked before any work (one line naming the flag), files
written whole or not at all."""

from __future__ import annotations

import pytest
from helpers import read_only_folder

from rhhjax import outputs


def test_a_file_path_may_be_new_with_new_folders_and_nothing_is_created(tmp_path):
    path = tmp_path / "a" / "b" / "r.json"
    assert outputs.check_file(path, "--output") == path
    assert outputs.check_folder(tmp_path / "c" / "d", "--out") == tmp_path / "c" / "d"
    assert sorted(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "check,make,needle",
    [
        (outputs.check_file, lambda t: t, "--output={t} is a folder, not a file"),
        (
            outputs.check_file,
            lambda t: t / "f" / "r.json",
            "--output={t}/f/r.json: {t}/f is a file",
        ),
        (outputs.check_folder, lambda t: t / "f", "--output={t}/f is a file, not a folder"),
        (outputs.check_folder, lambda t: t / "f" / "x", "--output={t}/f/x: {t}/f is a file"),
    ],
)
def test_a_file_where_a_folder_belongs_is_one_line(tmp_path, check, make, needle):
    (tmp_path / "f").write_text("x")
    with pytest.raises(outputs.OutputError) as info:
        check(make(tmp_path), "--output")
    assert str(info.value).startswith(needle.format(t=tmp_path)) and "\n" not in str(info.value)


@pytest.mark.parametrize("check", [outputs.check_file, outputs.check_folder])
def test_a_folder_that_cannot_be_written_is_one_line(tmp_path, check):
    folder = read_only_folder(tmp_path)
    with pytest.raises(outputs.OutputError, match=rf"--out={folder}/x: cannot write in {folder}"):
        check(folder / "x", "--out")


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "r.json"
    outputs.write_text(path, "old", "--output")
    with pytest.raises(RuntimeError), outputs.atomic_path(path, "--output") as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
    assert outputs.write_text(path, "new", "--output").read_text() == "new"
