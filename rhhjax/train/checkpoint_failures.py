"""A checkpoint save or restore that fails, in one line: orbax's and tensorstore's logged
tracebacks are dropped; ``failed_save`` and ``read_error`` give the ``CheckpointError`` lines."""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax


class _OrbaxErrorFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno >= logging.ERROR and "orbax" in record.pathname)


@contextlib.contextmanager
def quiet_orbax_errors() -> Iterator[None]:
    logger = logging.getLogger("absl")
    quiet = _OrbaxErrorFilter()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def _closed_loop_noise(unraisable) -> bool:
    return isinstance(unraisable.exc_value, RuntimeError) and "Event loop is closed" in str(
        unraisable.exc_value
    )


_SILENCED = False


def silence_closed_loop_noise() -> None:
    """Drop tensorstore's "Event loop is closed" tracebacks after a failed call."""
    global _SILENCED
    if _SILENCED:
        return
    _SILENCED = True
    previous = sys.unraisablehook

    def hook(unraisable):
        if not _closed_loop_noise(unraisable):
            previous(unraisable)

    sys.unraisablehook = hook


def read_error(error: BaseException) -> str:
    """A readable line for orbax / tensorstore failing on a damaged file."""
    text = " ".join(str(error).split())
    text = re.split(r"\s*See full TensorStore details", text)[0]
    text = re.sub(r"<bound method [^>]*>?", "", text).strip(" .;:")
    if len(text) > 200:
        text = text[:200].rsplit(" ", 1)[0] + " ..."
    return text or type(error).__name__


def tree_bytes(tree: Any) -> int:
    return int(sum(getattr(x, "nbytes", 0) for x in jax.tree.leaves(tree)))


def failed_save(manager: Any, latest: Any, step: int, nbytes: int, error: BaseException) -> str:
    """The line for a failed save of ``step``, after removing orbax's unfinished folders."""
    folder = Path(manager.directory)
    _remove_unfinished(folder)
    for other in (manager, latest):
        previous = [s for s in other.all_steps() if s != step] if other else []
        if previous:
            where = Path(other.directory) / str(max(previous))
            nbytes = max(nbytes, _folder_bytes(where))
            break
    kept = [s for s in latest.all_steps() if s != step] if latest else []
    return _save_failure(folder, step, nbytes, error, max(kept) if kept else None)


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _remove_unfinished(folder: Path) -> None:
    if not folder.is_dir():
        return
    for path in folder.iterdir():
        if path.is_dir() and ".orbax-checkpoint-tmp" in path.name:
            shutil.rmtree(path, ignore_errors=True)


def _save_failure(
    folder: Path, step: int, nbytes: int, error: BaseException, last: int | None
) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    left = (
        f"the last checkpoint (step {last}) is intact"
        if last is not None
        else "no checkpoint was written before"
    )
    need = space_needed(folder, nbytes)
    no_space = "no space left on device" in text.lower() or "enospc" in text.lower()
    if no_space:
        return (
            f"cannot write the checkpoint of step {step} to {folder}: no space left on device "
            f"({need}); {left}; free some space and run the same command again to resume"
        )
    if len(text) > 300:
        text = text[:300] + "..."
    return (
        f"cannot write the checkpoint of step {step} to {folder} ({need}): {text}; {left}; "
        f"run the same command again to resume"
    )


def space_needed(folder: Path, nbytes: int) -> str:
    """ "it needs about X, Y free" for a failed write of ``nbytes`` into ``folder``."""
    try:
        free = shutil.disk_usage(folder if folder.exists() else folder.parent).free
    except OSError:
        return f"it needs about {_size(nbytes)}"
    if nbytes > free:
        return f"it needs about {_size(nbytes)}, {_size(free)} free"
    return f"it needs more than the {_size(free)} free"


def _size(n: int) -> str:
    if n < 1e3:
        return f"{max(n, 0)} bytes"
    if n < 1e6:
        return f"{max(n, 0) / 1e3:,.0f} kB"
    if n < 1e9:
        return f"{n / 1e6:,.1f} MB"
    return f"{n / 1e9:,.1f} GB"
