"""``UserError``, the base of every error a user can fix (a one-line message), and how a program
reports it: ``exit_with_error`` (``error: <message>``, exit 1) and ``warn`` (``warning:``)."""

from __future__ import annotations

import os
import sys


class UserError(ValueError):
    """Bad input: the message says what is wrong and how to fix it, in one line."""


def one_line(e: BaseException | str) -> str:
    text = str(e)
    if isinstance(e, KeyError) and len(e.args) == 1 and isinstance(e.args[0], str):
        text = e.args[0]
    return " ".join(text.split())


def exit_with_error(e: BaseException | str, code: int = 1) -> None:
    """Print ``error: <one line>``, exit with ``code`` at once (``os._exit``: no thread noise)."""
    sys.stdout.flush()
    sys.stderr.write(f"error: {one_line(e)}\n")
    sys.stderr.flush()
    os._exit(code)


def warn(message: str) -> None:
    sys.stdout.flush()
    sys.stderr.write(f"warning: {one_line(message)}\n")
    sys.stderr.flush()
