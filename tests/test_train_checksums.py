"""The checksum table of a checkpoint folder: written for every file, read back, and each
kind of damage named in words (a file cut short, changed, missing or unlisted; a damaged
table); a folder without a table is taken as it is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rhhjax.train import checksums


def make_step(folder: Path) -> Path:
    """A checkpoint-like folder: a file of the step and two items, checksums written."""
    (folder / "params" / "d").mkdir(parents=True)
    (folder / "meta").mkdir()
    (folder / "_CHECKPOINT_METADATA").write_text("{}")
    (folder / "params" / "d" / "abc").write_bytes(bytes(range(200)))
    (folder / "meta" / "metadata").write_text('{"step": 3}')
    checksums.write_checksums(folder)
    return folder


def test_the_table_lists_every_file_with_its_size(tmp_path):
    folder = make_step(tmp_path)
    table = checksums.read_checksums(folder)
    assert sorted(table) == ["_CHECKPOINT_METADATA", "meta/metadata", "params/d/abc"]
    assert table["params/d/abc"][0] == 200
    assert not list(folder.glob(".*.tmp"))  # written atomically
    assert checksums.files_problem(folder, table, ("params", "meta")) == ""
    assert checksums.intact(folder, ("params", "meta"))


@pytest.mark.parametrize(
    "damage,problem",
    [
        (lambda f: f.write_bytes(b"x" * 10), "params/d/abc has 10 bytes, 200 when saved"),
        (lambda f: f.write_bytes(b"x" * 200), "params/d/abc changed since it was saved"),
        (lambda f: f.unlink(), "params/d/abc is missing"),
    ],
)
def test_a_damaged_file_is_named_with_what_differs(tmp_path, damage, problem):
    folder = make_step(tmp_path)
    damage(folder / "params" / "d" / "abc")
    table = checksums.read_checksums(folder)
    assert checksums.files_problem(folder, table, ("params",)).startswith(problem)
    assert checksums.files_problem(folder, table, ("meta",)) == ""  # not read now
    assert not checksums.intact(folder, ("params",))


def test_an_unlisted_file_means_the_table_is_damaged(tmp_path):
    folder = make_step(tmp_path)
    (folder / "params" / "d" / "new").write_text("x")
    problem = checksums.files_problem(folder, checksums.read_checksums(folder), ("params",))
    assert problem == (
        "its checksums.json lists 3 files and not params/d/new (1 unlisted): the checksum "
        "file itself is damaged"
    )


@pytest.mark.parametrize(
    "text,line",
    [
        ("", "its checksums.json is empty"),
        ("{", "its checksums.json is not valid JSON"),
        (json.dumps({"a": [1]}), "its checksums.json is not a table of [bytes, SHA-256]"),
    ],
)
def test_a_damaged_table_is_one_line(tmp_path, text, line):
    folder = make_step(tmp_path)
    (folder / checksums.CHECKSUMS_FILE).write_text(text)
    with pytest.raises(checksums.ChecksumFileError) as info:
        checksums.read_checksums(folder)
    assert str(info.value) == line
    assert not checksums.intact(folder, ("params",))


def test_a_folder_without_a_table_has_nothing_to_check(tmp_path):
    folder = make_step(tmp_path)
    (folder / checksums.CHECKSUMS_FILE).unlink()
    with pytest.raises(FileNotFoundError):
        checksums.read_checksums(folder)
    assert checksums.intact(folder, ("params",))
