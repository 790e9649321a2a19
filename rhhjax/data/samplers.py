"""Training samplers of ``[batch_size, seq_len]`` inputs and targets: ``WindowSampler`` (the
paper's random windows) and ``StreamSampler`` (truncated-BPTT streams, state carried); both are
functions of ``(seed, step)``, resumable by ``state()`` / ``restore()``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np

from rhhjax.data.errors import DataError, check_int, check_tokens

SAMPLERS = ("windows", "stream")


class TrainBatch(NamedTuple):
    inputs: np.ndarray  # int32 [B, T]
    targets: np.ndarray
    reset: bool  # True -> zero the recurrent state before this batch
    step: int
    epoch: int


def _rng(seed: int, index: int) -> np.random.Generator:
    """PCG64 seeded with SeedSequence((seed, index)): batch / epoch ``index`` of ``seed``."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence((seed, index))))


class _Sampler:
    """Iteration, epoch and resumable state shared by the samplers (``batch_at`` differs)."""

    _kind = ""

    tokens: np.ndarray
    batch_size: int
    seq_len: int
    seed: int
    step: int
    batches_per_epoch: int

    def batch_at(self, step: int) -> TrainBatch:
        raise NotImplementedError

    @property
    def epoch(self) -> int:
        return self.step // self.batches_per_epoch

    def __iter__(self) -> Iterator[TrainBatch]:
        return self

    def __next__(self) -> TrainBatch:
        batch = self.batch_at(self.step)
        self.step += 1
        return batch

    def _state_extra(self) -> dict:
        return {}

    def state(self) -> dict:
        """JSON-able state; ``restore`` of it continues exactly here."""
        return {
            "sampler": self._kind,
            "seed": self.seed,
            "step": self.step,
            "n_tokens": int(len(self.tokens)),
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            **self._state_extra(),
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        mine = self.state()
        for key in mine:
            if key not in state:
                raise DataError(f"sampler state lacks {key!r}: not from {type(self).__name__}")
        for key in mine:
            if key not in ("seed", "step") and state[key] != mine[key]:
                raise DataError(
                    f"sampler state does not match this sampler: {key}={state[key]!r} in the "
                    f"state, {mine[key]!r} here"
                )
        self.seed = check_int("seed", state["seed"], 0)
        self.step = check_int("step", state["step"], 0)


class WindowSampler(_Sampler):
    """The paper's sampler: random windows of ``seq_len + 1``, batch ``step`` from its seed."""

    _kind = "window"

    def __init__(self, tokens, batch_size: int, seq_len: int = 100, seed: int = 0, step: int = 0):
        self.tokens = check_tokens(tokens)
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.seq_len = check_int("seq_len", seq_len, 1)
        self.seed = check_int("seed", seed, 0)
        self.step = check_int("step", step, 0)
        n = len(self.tokens)
        if n < self.seq_len + 1:
            raise DataError(f"{n} tokens are fewer than one window of seq_len + 1 = {seq_len + 1}")
        self.batches_per_epoch = max(1, n // (self.batch_size * self.seq_len))
        self._offsets = np.arange(self.seq_len + 1)

    def batch_at(self, step: int) -> TrainBatch:
        step = check_int("step", step, 0)
        n = len(self.tokens)
        starts = _rng(self.seed, step).integers(0, n - self.seq_len, size=self.batch_size)
        windows = self.tokens[starts[:, None] + self._offsets].astype(np.int32)
        return TrainBatch(
            windows[:, :-1], windows[:, 1:], True, step, step // self.batches_per_epoch
        )


class StreamSampler(_Sampler):
    """Contiguous truncated-BPTT streams (Zilly et al.): batch ``c + 1`` continues batch
    ``c`` row by row; ``random_offset`` shifts each epoch's start by ``(seed, epoch)``."""

    _kind = "stream"

    def __init__(
        self,
        tokens,
        batch_size: int,
        seq_len: int,
        seed: int = 0,
        random_offset: bool = True,
        step: int = 0,
    ):
        self.tokens = check_tokens(tokens)
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.seq_len = check_int("seq_len", seq_len, 1)
        self.seed = check_int("seed", seed, 0)
        self.step = check_int("step", step, 0)
        self.random_offset = bool(random_offset)
        self.max_offset = self.seq_len - 1 if self.random_offset else 0
        n = len(self.tokens)
        self.batches_per_epoch = (n - 1 - self.max_offset) // (self.batch_size * self.seq_len)
        if self.batches_per_epoch < 1:
            raise DataError(
                f"{n} tokens are too few for one stream batch of {self.batch_size} rows x "
                f"{self.seq_len} steps"
            )
        self.row_len = self.batches_per_epoch * self.seq_len
        self._rows = np.arange(self.batch_size) * self.row_len
        self._offsets = np.arange(self.seq_len + 1)

    def _state_extra(self) -> dict:
        return {"random_offset": self.random_offset}

    def epoch_offset(self, epoch: int) -> int:
        if not self.random_offset:
            return 0
        return int(_rng(self.seed, check_int("epoch", epoch, 0)).integers(0, self.max_offset + 1))

    def batch_at(self, step: int) -> TrainBatch:
        step = check_int("step", step, 0)
        epoch, chunk = divmod(step, self.batches_per_epoch)
        base = self.epoch_offset(epoch) + self._rows + chunk * self.seq_len
        window = self.tokens[base[:, None] + self._offsets].astype(np.int32)
        return TrainBatch(window[:, :-1], window[:, 1:], chunk == 0, step, epoch)
