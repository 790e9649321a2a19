"""The checksum table of a checkpoint, ``<step>/checksums.json``: the size and SHA-256 of every
file, written after each save so a restore can tell a damaged file before orbax reads it."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

CHECKSUMS_FILE = "checksums.json"  # in each step's folder: {relative path: [bytes, sha256]}


class ChecksumFileError(ValueError):
    """A ``checksums.json`` that is not a table of [bytes, SHA-256]; the message is one line."""


def write_checksums(folder: Path) -> None:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != CHECKSUMS_FILE)
    table = {str(p.relative_to(folder)): [p.stat().st_size, sha256(p)] for p in files}
    tmp = folder / f".{CHECKSUMS_FILE}.tmp"
    tmp.write_text(json.dumps(table, indent=0, sort_keys=True) + "\n")
    os.replace(tmp, folder / CHECKSUMS_FILE)


def read_checksums(folder: Path) -> dict[str, tuple[int, str]]:
    path = folder / CHECKSUMS_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError) as e:
        raise ChecksumFileError(f"its {CHECKSUMS_FILE} does not read ({e})") from None
    if not text.strip():
        raise ChecksumFileError(f"its {CHECKSUMS_FILE} is empty")
    try:
        table = json.loads(text)
    except ValueError:
        raise ChecksumFileError(f"its {CHECKSUMS_FILE} is not valid JSON") from None
    ok = isinstance(table, dict) and all(
        isinstance(v, list) and len(v) == 2 and isinstance(v[0], int) and isinstance(v[1], str)
        for v in table.values()
    )
    if not ok:
        raise ChecksumFileError(f"its {CHECKSUMS_FILE} is not a table of [bytes, SHA-256]")
    return {name: (size, digest) for name, (size, digest) in table.items()}


def files_problem(folder: Path, expected: dict, items: tuple[str, ...]) -> str:
    """ "" when the files of ``items`` match ``expected``, else the first difference."""

    def read_now(name: str) -> bool:
        return "/" not in name or name.split("/", 1)[0] in items

    for name, (size, digest) in sorted(expected.items()):
        if read_now(name):
            problem = _file_problem(folder / name, size, digest)
            if problem:
                return f"{name} {problem}"
    on_disk = sorted(
        str(p.relative_to(folder))
        for p in folder.rglob("*")
        if p.is_file() and p.name != CHECKSUMS_FILE
    )
    unlisted = [name for name in on_disk if read_now(name) and name not in expected]
    if unlisted:
        return (
            f"its {CHECKSUMS_FILE} lists {len(expected)} files and not {unlisted[0]} "
            f"({len(unlisted)} unlisted): the checksum file itself is damaged"
        )
    return ""


def intact(folder: Path, items: tuple[str, ...]) -> bool:
    """Whether the files of ``items`` in ``folder`` match its checksums (True without any)."""
    try:
        expected = read_checksums(folder)
    except FileNotFoundError:
        return True
    except ChecksumFileError:
        return False
    return not files_problem(folder, expected, items)


def _file_problem(path: Path, size: int, digest: str) -> str:
    try:
        actual = path.stat().st_size
    except OSError:
        return "is missing"
    if actual != size:
        return f"has {actual:,} bytes, {size:,} when saved"
    if sha256(path) != digest:
        return "changed since it was saved (SHA-256 differs)"
    return ""


def sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, in hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
