"""The one-line failures of a checkpoint save or restore: orbax's error records and
tensorstore's closed-loop tracebacks dropped (and nothing else), orbax's read errors
shortened, the space a failed write needs said without contradicting itself."""

from __future__ import annotations

import sys

import pytest

from rhhjax.train import checkpoint_failures as failures


def test_orbax_error_records_are_dropped_during_a_save():
    """orbax's writer threads log each failed write (with a traceback) before the save
    raises; inside quiet_orbax_errors those records are dropped, other records are kept."""
    import logging

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    logger = logging.getLogger("absl")
    handler = Keep()
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)

    def log(pathname: str, level: int, message: str) -> None:
        logger.handle(logger.makeRecord("absl", level, pathname, 1, message, (), None))

    try:
        with failures.quiet_orbax_errors():
            log("/x/site-packages/orbax/checkpoint/_src/futures/future.py", logging.ERROR, "a")
            log("/x/site-packages/orbax/checkpoint/_src/futures/future.py", logging.INFO, "b")
            log("/x/rhhjax/trainer.py", logging.ERROR, "c")
        log("/x/site-packages/orbax/checkpoint/_src/futures/future.py", logging.ERROR, "d")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    assert seen == ["b", "c", "d"]


def test_space_needed_never_contradicts_itself(tmp_path, monkeypatch):
    """A failed save said "needs about 63 kB, 90 kB free": an estimate below the free space
    becomes "more than the free space" (the write failed, so it needed more)."""
    import shutil

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(failures.shutil, "disk_usage", lambda _: usage._replace(free=90_000))
    assert failures.space_needed(tmp_path, 63_000) == "it needs more than the 90 kB free"
    assert failures.space_needed(tmp_path, 2_000_000) == "it needs about 2.0 MB, 90 kB free"


def test_only_tensorstores_closed_loop_noise_is_silenced(monkeypatch):
    """A failed write or read made tensorstore's threads print 0-160 lines of "Event loop is
    closed" tracebacks around the one-line error; those (and nothing else) are dropped."""
    import types

    seen: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(str(u.exc_value)))
    monkeypatch.setattr(failures, "_SILENCED", False)
    failures.silence_closed_loop_noise()
    failures.silence_closed_loop_noise()  # once is enough: not wrapped twice
    for error in (RuntimeError("Event loop is closed"), RuntimeError("other"), ValueError("x")):
        sys.unraisablehook(types.SimpleNamespace(exc_value=error))
    assert seen == ["other", "x"]


def test_a_read_error_is_one_readable_line():
    """tensorstore's messages end in a pointer to "full TensorStore details" and a bound
    method's repr: both go, and the line is at most about 200 characters."""
    error = ValueError(
        "DATA_LOSS: Error reading params/d/abc:\n  unexpected end of file. "
        "See full TensorStore details <bound method X.details of <X object at 0x1>>"
    )
    assert (
        failures.read_error(error)
        == "DATA_LOSS: Error reading params/d/abc: unexpected end of file"
    )
    assert failures.read_error(ValueError()) == "ValueError"
    assert len(failures.read_error(ValueError("word " * 100))) <= 204


@pytest.mark.parametrize(
    "n,words", [(0, "0 bytes"), (150, "150 bytes"), (2_500, "2 kB"), (61_200_000, "61.2 MB")]
)
def test_sizes_below_a_kilobyte_are_bytes_not_zero_kb(n, words):
    """A full disk said "it needs about 0 kB" for a 150-byte metrics line."""
    assert failures._size(n) == words
