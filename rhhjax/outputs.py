"""The files and folders the programs write: checked before any work, written whole or not at all.

    outputs.check_file(path, "--output")   # before loading or computing anything
    outputs.check_folder(path, "--out")
    outputs.write_text(path, text, "--output")   # a temporary file renamed over ``path``
    with outputs.atomic_path(path, "--out") as tmp:  # for writers that take a path (savefig)
        fig.savefig(tmp)

Every problem is an ``OutputError`` (a ``UserError``): one line naming the flag and the path,
e.g. ``--out=/tmp/a_file is a file, not a folder`` or ``--output=/ro/r.json: cannot write in
/ro (Read-only file system)``. No jax here: the programs check their outputs before importing
anything heavy.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from rhhjax.errors import UserError


class OutputError(UserError):
    """An output path that is a file where a folder is needed (or the reverse), or that cannot
    be written; the message is one line."""


def _reason(error: OSError) -> str:
    """The OS's words for ``error`` ("Read-only file system", "Permission denied")."""
    return error.strerror or errno.errorcode.get(error.errno or 0, "") or str(error)


def _existing_ancestor(path: Path) -> Path:
    """The nearest of ``path`` and its parents that exists."""
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    return probe


def _check_writable_folder(folder: Path, label: str) -> None:
    """OutputError unless a file can be created in ``folder`` (an existing folder)."""
    try:
        fd, name = tempfile.mkstemp(prefix=".rhhjax-write-test.", dir=folder)
    except OSError as e:
        raise OutputError(f"{label}: cannot write in {folder} ({_reason(e)})") from None
    os.close(fd)
    os.unlink(name)


def _check_parents(path: Path, label: str) -> None:
    """OutputError unless the folders up to ``path`` exist or can be created and written."""
    ancestor = _existing_ancestor(path)
    if not ancestor.is_dir():
        raise OutputError(f"{label}: {ancestor} is a file, not a folder")
    _check_writable_folder(ancestor, label)


def check_file(path: str | os.PathLike, flag: str) -> Path:
    """``path`` as a Path, checked for writing a file there (its folder may not exist yet):
    OutputError when it is a folder, a parent is a file, or the folder is not writable."""
    path = Path(path)
    label = f"{flag}={path}"
    if path.is_dir():
        raise OutputError(f"{label} is a folder, not a file")
    _check_parents(path.parent, label)
    return path


def check_folder(path: str | os.PathLike, flag: str) -> Path:
    """``path`` as a Path, checked for writing files into it (it may not exist yet):
    OutputError when it or a parent is a file, or it cannot be created or written."""
    path = Path(path)
    label = f"{flag}={path}"
    if path.exists() and not path.is_dir():
        raise OutputError(f"{label} is a file, not a folder")
    _check_parents(path, label)
    return path


def make_folder(path: str | os.PathLike, flag: str) -> Path:
    """``path`` created (with its parents) after ``check_folder``; OutputError if it fails."""
    path = check_folder(path, flag)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"{flag}={path}: cannot create it ({_reason(e)})") from None
    return path


def file_mode() -> int:
    """0o666 less the process umask (what ``open()`` gives a new file)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, flag: str) -> Iterator[Path]:
    """A temporary path beside ``path`` to write; renamed over ``path`` when the block ends
    without an error, deleted otherwise (``path`` keeps its old content). The folder is
    created. A failed write is an OutputError (one line)."""
    path = Path(path)
    make_folder(path.parent, flag)
    tmp = None
    try:
        suffix = f".tmp{path.suffix}"  # writers that infer the format from it (savefig)
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
        os.close(fd)
        tmp = Path(name)
        yield tmp
        os.chmod(tmp, file_mode())  # mkstemp makes 0600
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        raise OutputError(f"cannot write {flag}={path}: {_reason(e)}") from None
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)


def write_text(path: str | os.PathLike, text: str, flag: str) -> Path:
    """Write ``text`` to ``path`` whole or not at all (``atomic_path``); returns the path."""
    with atomic_path(path, flag) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)
