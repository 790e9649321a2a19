"""One base class for every error a user can fix, and the one way a program reports it.

Every error raised for bad input (a config field, a data file, a workdir, a checkpoint, a sweep
or analysis argument) derives from ``UserError`` and carries a one-line message. Programs catch
``UserError`` and call ``exit_with_error``: ``error: <message>`` on stderr, exit status 1, no
traceback. Anything else is a bug and keeps its traceback. ``warn`` is the one way to say
something is off while the program goes on: ``warning: <message>`` on stderr.
"""

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
    """Print ``error: <one line>`` on stderr and end the process with ``code`` at once.

    ``os._exit`` skips interpreter shutdown, where the background threads of a failed
    checkpoint write (orbax, asyncio) would otherwise print pages of tracebacks.
    """
    sys.stdout.flush()
    sys.stderr.write(f"error: {one_line(e)}\n")
    sys.stderr.flush()
    os._exit(code)


def warn(message: str) -> None:
    """Print ``warning: <one line>`` on stderr (the program goes on)."""
    sys.stdout.flush()
    sys.stderr.write(f"warning: {one_line(message)}\n")
    sys.stderr.flush()
