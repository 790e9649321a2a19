"""SIGTERM / SIGINT as a flag the training loop polls (``SignalCatcher``); it imports nothing
that starts threads (a thread started before the signals are blocked would die of them)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

from rhhjax.errors import exit_with_error


class SignalCatcher:
    """SIGTERM / SIGINT set ``signum``; the loop stops after the step in flight. A second
    signal: ``hard_abort`` exits 128 + signum, else ``KeyboardInterrupt``; ``thread=True``: a
    ``sigwait`` watcher thread; ``abort``: the first signal ends the program."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(
        self,
        log: Callable[[str], None] | None = None,
        *,
        hard_abort: bool = False,
        thread: bool = False,
        abort: str | None = None,
    ):
        self.signum: int | None = None
        self.phase = "startup"
        self.log = log or _print
        self.hard_abort = hard_abort
        self.thread = thread
        self.abort = abort
        self._previous: dict = {}
        self._watcher: threading.Thread | None = None
        self._active = False

    def _first_message(self, name: str) -> str:
        if self.phase == "startup":
            return f"received {name} while starting up: stopping before training starts"
        if self.phase == "evaluation":
            return (
                f"received {name}: stopping the final evaluation after the current batch "
                f"(send {name} again to abort now)"
            )
        return (
            f"received {name}: stopping after the current step and saving a checkpoint; "
            f"compiling or running a step can take minutes; send {name} again to abort now "
            f"(the last checkpoint is kept)"
        )

    def handle(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self.abort is not None:
            exit_with_error(self.abort.format(name=name), 128 + signum)
        if self.signum is not None:
            if self.hard_abort:
                exit_with_error(
                    f"aborted by a second {name}; work since the last checkpoint is lost; run "
                    f"the same command again to resume from it",
                    128 + signum,
                )
            raise KeyboardInterrupt(f"second signal {name}")
        self.signum = signum
        self.log(self._first_message(name))

    def stop_agreed(self) -> bool:
        """Whether a signal arrived: process 0's answer on every process (a broadcast)."""
        # not at import time: train.py enters a catcher before jax or numpy start threads
        import jax
        import numpy as np

        flag = self.signum is not None
        if jax.process_count() == 1:
            return flag
        from jax.experimental import multihost_utils

        return bool(multihost_utils.broadcast_one_to_all(np.int32(flag)))

    def interrupted(self, step: int | None, message: str) -> dict:
        signum = self.signum or signal.SIGTERM
        self.log(message.format(name=signal.Signals(signum).name))
        return {"status": "interrupted", "exit_code": 128 + signum, "step": step}

    def _handler(self, signum, frame):
        del frame
        self.handle(signum)

    def _watch(self) -> None:
        while self._active:
            signum = signal.sigwait(self.SIGNALS)
            if not self._active:
                break
            self.handle(signum)

    def __enter__(self) -> SignalCatcher:
        if threading.current_thread() is not threading.main_thread():
            return self
        self._active = True
        if self.thread:
            signal.pthread_sigmask(signal.SIG_BLOCK, self.SIGNALS)
            self._watcher = threading.Thread(target=self._watch, name="signals", daemon=True)
            self._watcher.start()
        else:
            for s in self.SIGNALS:
                self._previous[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        if not self._active:
            return
        self._active = False
        if self.thread:
            return
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def _print(message: str) -> None:
    print(message, flush=True)
