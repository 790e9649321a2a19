"""The files and folders the programs write: checked before any work, written whole or
not at all; every problem a one-line ``OutputError``. No jax here."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from rhhjax.errors import UserError


class OutputError(UserError):
    """An output path of the wrong kind (file / folder) or that cannot be written."""


def _reason(error: OSError) -> str:
    return error.strerror or errno.errorcode.get(error.errno or 0, "") or str(error)


def _existing_ancestor(path: Path) -> Path:
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    return probe


def _check_writable_folder(folder: Path, label: str) -> None:
    try:
        fd, name = tempfile.mkstemp(prefix=".rhhjax-write-test.", dir=folder)
    except OSError as e:
        raise OutputError(f"{label}: cannot write in {folder} ({_reason(e)})") from None
    os.close(fd)
    os.unlink(name)


def _check_parents(path: Path, label: str) -> None:
    ancestor = _existing_ancestor(path)
    if not ancestor.is_dir():
        raise OutputError(f"{label}: {ancestor} is a file, not a folder")
    _check_writable_folder(ancestor, label)


def check_file(path: str | os.PathLike, flag: str) -> Path:
    """``path`` as a Path, checked for writing a file there (its folder may not exist yet)."""
    path = Path(path)
    label = f"{flag}={path}"
    if path.is_dir():
        raise OutputError(f"{label} is a folder, not a file")
    _check_parents(path.parent, label)
    return path


def check_folder(path: str | os.PathLike, flag: str) -> Path:
    """``path`` as a Path, checked for writing files into it (it may not exist yet)."""
    path = Path(path)
    label = f"{flag}={path}"
    if path.exists() and not path.is_dir():
        raise OutputError(f"{label} is a file, not a folder")
    _check_parents(path, label)
    return path


def make_folder(path: str | os.PathLike, flag: str) -> Path:
    path = check_folder(path, flag)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"{flag}={path}: cannot create it ({_reason(e)})") from None
    return path


def file_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, flag: str) -> Iterator[Path]:
    """A temporary path beside ``path``, renamed over it if the block succeeds, else deleted."""
    path = Path(path)
    make_folder(path.parent, flag)
    tmp = None
    try:
        suffix = f".tmp{path.suffix}"
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
        os.close(fd)
        tmp = Path(name)
        yield tmp
        os.chmod(tmp, file_mode())
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


WORKDIR_LOCK = ".lock"  # the file a running training holds an flock on (the trainer takes it)


class WorkdirInUseError(OutputError):
    """Another process holds the workdir's lock; one line."""


def in_use_message(workdir: Path, fd: int) -> str:
    holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
    return (
        f"workdir {workdir} is in use by another run (process {holder}); wait for it to finish "
        f"or use another --workdir"
    )


_HELD: dict[str, int] = {}  # resolved lock path -> the fd of a lock taken at start-up


def hold_workdir(workdir: str | os.PathLike) -> None:
    """Lock an existing workdir before the heavy imports; WorkdirInUseError if in use."""
    import fcntl

    lock = Path(workdir) / WORKDIR_LOCK
    if not lock.parent.is_dir():
        return
    mask = os.umask(0)
    os.umask(mask)
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666 & ~mask)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BlockingIOError:
        message = in_use_message(lock.parent, fd)
        os.close(fd)
        raise WorkdirInUseError(message) from None
    except OSError:
        os.close(fd)
        return
    _HELD[str(lock.resolve())] = fd


def take_held(lock: Path) -> int | None:
    """The fd of the lock ``hold_workdir`` took on ``lock`` (None: none)."""
    return _HELD.pop(str(Path(lock).resolve()), None)


def check_workdir_free(workdir: str | os.PathLike) -> None:
    import fcntl

    path = Path(workdir)
    try:
        fd = os.open(path / WORKDIR_LOCK, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise WorkdirInUseError(in_use_message(path, fd)) from None
    except OSError:
        pass
    finally:
        os.close(fd)
