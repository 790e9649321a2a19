"""A checkpoint save or restore that fails, said in one line: orbax's and tensorstore's log
records and late tracebacks are dropped (``quiet_orbax_errors``,
``silence_closed_loop_noise``); ``failed_save`` and ``read_error`` give the lines that
``rhhjax.train.checkpoint`` raises as ``CheckpointError``; ``space_needed`` serves every write
of a workdir.
"""

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

# -- orbax's and tensorstore's noise ---------------------------------------------------------


class _OrbaxErrorFilter(logging.Filter):
    """Drops the error records (with tracebacks) orbax's writer threads log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno >= logging.ERROR and "orbax" in record.pathname)


@contextlib.contextmanager
def quiet_orbax_errors() -> Iterator[None]:
    """Drop orbax's logged tracebacks of failed writes during a save."""
    logger = logging.getLogger("absl")
    quiet = _OrbaxErrorFilter()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def _closed_loop_noise(unraisable) -> bool:
    """tensorstore's harmless late callbacks into the closed loop of a failed orbax call."""
    return isinstance(unraisable.exc_value, RuntimeError) and "Event loop is closed" in str(
        unraisable.exc_value
    )


_SILENCED = False


def silence_closed_loop_noise() -> None:
    """From the first save or restore on, drop the "Event loop is closed" tracebacks
    tensorstore's threads print after a failed write or read; nothing else."""
    global _SILENCED
    if _SILENCED:
        return
    _SILENCED = True
    previous = sys.unraisablehook

    def hook(unraisable):
        if not _closed_loop_noise(unraisable):
            previous(unraisable)

    sys.unraisablehook = hook


# -- a failed restore ----------------------------------------------------------------------


def read_error(error: BaseException) -> str:
    """A readable line for orbax / tensorstore failing on a damaged file."""
    text = " ".join(str(error).split())
    text = re.split(r"\s*See full TensorStore details", text)[0]
    text = re.sub(r"<bound method [^>]*>?", "", text).strip(" .;:")
    if len(text) > 200:
        text = text[:200].rsplit(" ", 1)[0] + " ..."
    return text or type(error).__name__


# -- a failed save -------------------------------------------------------------------------


def tree_bytes(tree: Any) -> int:
    """Bytes of the arrays in ``tree`` (what a checkpoint of it needs, metadata aside)."""
    return int(sum(getattr(x, "nbytes", 0) for x in jax.tree.leaves(tree)))


def failed_save(manager: Any, latest: Any, step: int, nbytes: int, error: BaseException) -> str:
    """The line for ``manager``'s failed save of ``step``, once orbax's unfinished folders are
    removed; ``latest``: the ``checkpoints/`` manager, whose newest other step is left."""
    folder = Path(manager.directory)
    _remove_unfinished(folder)
    for other in (manager, latest):  # a finished checkpoint: its size on disk
        previous = [s for s in other.all_steps() if s != step] if other else []
        if previous:
            where = Path(other.directory) / str(max(previous))
            nbytes = max(nbytes, _folder_bytes(where))
            break
    kept = [s for s in latest.all_steps() if s != step] if latest else []
    return _save_failure(folder, step, nbytes, error, max(kept) if kept else None)


def _folder_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder``."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _remove_unfinished(folder: Path) -> None:
    """Delete orbax's temporary folders of unfinished saves (the space a retry needs)."""
    if not folder.is_dir():
        return
    for path in folder.iterdir():
        if path.is_dir() and ".orbax-checkpoint-tmp" in path.name:
            shutil.rmtree(path, ignore_errors=True)


def _save_failure(
    folder: Path, step: int, nbytes: int, error: BaseException, last: int | None
) -> str:
    """One line for a failed save; ``last``: the latest training checkpoint's step left."""
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
    """ "it needs about X, Y free" for a failed write of about ``nbytes`` into ``folder`` (or
    "more than the Y free" when the estimate is not above it)."""
    try:
        free = shutil.disk_usage(folder if folder.exists() else folder.parent).free
    except OSError:
        return f"it needs about {_size(nbytes)}"
    if nbytes > free:
        return f"it needs about {_size(nbytes)}, {_size(free)} free"
    return f"it needs more than the {_size(free)} free"


def _size(n: int) -> str:
    """Bytes for people: "150 bytes", "23 kB", "61.2 MB", "3.1 GB"."""
    if n < 1e3:
        return f"{max(n, 0)} bytes"
    if n < 1e6:
        return f"{max(n, 0) / 1e3:,.0f} kB"
    if n < 1e9:
        return f"{n / 1e6:,.1f} MB"
    return f"{n / 1e9:,.1f} GB"
