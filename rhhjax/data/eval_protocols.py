"""Evaluation batches of a split: ``windows`` and ``stream`` score every symbol but the first
once, ``paper`` (the paper's) does not. A batch spans at most ``MAX_CHUNK`` steps; longer
windows come in pieces with the state carried. Definitions: docs/design.md."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from rhhjax.data.errors import DataError, check_int, check_tokens

EVAL_PROTOCOLS = ("windows", "stream", "paper")
PAPER_CHUNK = 51  # the paper's evaluation: rows of 101 symbols every 51
PAPER_SEQ_LEN = 100  # inputs (and targets) per row
MAX_CHUNK = 1000  # time steps of one evaluation batch at most (longer windows: in pieces)


class EvalBatch(NamedTuple):
    """One evaluation batch: ``[batch, time]`` inputs, targets and the mask of scored ones."""

    inputs: np.ndarray  # int32 [B, T], as targets
    targets: np.ndarray
    mask: np.ndarray  # float32 [B, T], 1 = scored
    reset: bool  # True -> zero the recurrent state before this batch


def _check_protocol(
    n_tokens: int, protocol: str, seq_len: int, min_context: int, paper_mask: int
) -> None:
    if protocol not in EVAL_PROTOCOLS:
        raise DataError(f"eval protocol must be one of {EVAL_PROTOCOLS}, got {protocol!r}")
    check_int("number of tokens", n_tokens, 0)
    if protocol == "paper":
        check_int("paper_mask", paper_mask, 0)
        if paper_mask >= PAPER_SEQ_LEN:
            raise DataError(f"paper_mask must be < {PAPER_SEQ_LEN}, got {paper_mask}")
        return
    check_int("seq_len", seq_len, 1)
    if protocol == "windows":
        check_int("min_context", min_context, 0)
        if min_context >= seq_len:
            raise DataError(f"min_context ({min_context}) must be < seq_len ({seq_len})")


def _paper_rows(n_tokens: int) -> int:
    if n_tokens < PAPER_SEQ_LEN + 1:
        return 0
    return (n_tokens - PAPER_SEQ_LEN - 1) // PAPER_CHUNK + 1


def _n_windows(n_tokens: int, seq_len: int, min_context: int) -> int:
    if n_tokens - 1 <= seq_len:
        return 1
    return 1 + -(-(n_tokens - 1 - seq_len) // (seq_len - min_context))


def scored_count(
    n_tokens: int,
    protocol: str,
    *,
    seq_len: int = 100,
    min_context: int = 50,
    paper_mask: int = 50,
) -> int:
    """Number of symbols ``eval_batches`` scores (``n_tokens - 1`` but for ``paper``)."""
    _check_protocol(n_tokens, protocol, seq_len, min_context, paper_mask)
    if protocol == "paper":
        return _paper_rows(n_tokens) * (PAPER_SEQ_LEN - paper_mask)
    return max(n_tokens - 1, 0)


def num_eval_batches(
    n_tokens: int,
    protocol: str,
    batch_size: int,
    seq_len: int = 100,
    min_context: int = 50,
    max_chunk: int = MAX_CHUNK,
) -> int:
    _check_protocol(n_tokens, protocol, seq_len, min_context, 50)
    batch_size = check_int("batch_size", batch_size, 1)
    width = min(seq_len, check_int("max_chunk", max_chunk, 1))
    if protocol == "paper":
        return -(-_paper_rows(n_tokens) // batch_size)
    if n_tokens < 2:
        return 0
    if protocol == "windows":
        stride = seq_len - min_context
        firsts = range(0, _n_windows(n_tokens, seq_len, min_context), batch_size)
        return sum(-(-_window_steps(n_tokens, seq_len, k * stride) // width) for k in firsts)
    row_len = -(-(n_tokens - 1) // batch_size)
    return -(-row_len // width)


def _window_steps(n_tokens: int, seq_len: int, start: int) -> int:
    return min(seq_len, n_tokens - 1 - start)


def _batch(
    tokens: np.ndarray, pos: np.ndarray, valid: np.ndarray, scored: np.ndarray, reset: bool
) -> EvalBatch:
    n = len(tokens)
    inputs = np.where(valid, tokens[np.clip(pos, 0, n - 1)], 0).astype(np.int32)
    targets = np.where(valid, tokens[np.clip(pos + 1, 0, n - 1)], 0).astype(np.int32)
    return EvalBatch(inputs, targets, (scored & valid).astype(np.float32), bool(reset))


def eval_batches(
    tokens,
    protocol: str,
    batch_size: int,
    seq_len: int,
    min_context: int = 50,
    paper_mask: int = 50,
    max_chunk: int = MAX_CHUNK,
) -> Iterator[EvalBatch]:
    """Evaluation batches ``[batch_size, min(seq_len, max_chunk)]`` of a split (100 for
    ``paper``); padding has mask 0. Exact definitions: docs/design.md."""
    tokens = check_tokens(tokens)
    batch_size = check_int("batch_size", batch_size, 1)
    max_chunk = check_int("max_chunk", max_chunk, 1)
    n = len(tokens)
    _check_protocol(n, protocol, seq_len, min_context, paper_mask)
    if protocol == "paper":
        if _paper_rows(n) == 0:
            raise DataError(
                f"the paper protocol needs at least {PAPER_SEQ_LEN + 1} tokens, got {n}"
            )
        return _paper_batches(tokens, batch_size, paper_mask)
    if n < 2:
        raise DataError(f"evaluation needs at least 2 tokens (one target), got {n}")
    width = min(seq_len, max_chunk)
    if protocol == "windows":
        return _window_batches(tokens, batch_size, seq_len, min_context, width)
    return _stream_batches(tokens, batch_size, width)


def _window_batches(
    tokens: np.ndarray, batch_size: int, seq_len: int, min_context: int, width: int
) -> Iterator[EvalBatch]:
    n = len(tokens)
    n_windows = _n_windows(n, seq_len, min_context)
    stride = seq_len - min_context
    for first in range(0, n_windows, batch_size):
        k = np.arange(first, first + batch_size)
        steps = _window_steps(n, seq_len, first * stride)
        for t0 in range(0, steps, width):
            t = t0 + np.arange(width)
            pos = (k * stride)[:, None] + t
            valid = (k < n_windows)[:, None] & (t < seq_len)[None, :] & (pos + 1 <= n - 1)
            scored = (t >= min_context)[None, :] | (k == 0)[:, None]
            yield _batch(tokens, pos, valid, scored, t0 == 0)


def _stream_batches(tokens: np.ndarray, batch_size: int, width: int) -> Iterator[EvalBatch]:
    n = len(tokens)
    row_len = -(-(n - 1) // batch_size)
    rows = np.arange(batch_size)[:, None] * row_len
    for c in range(-(-row_len // width)):
        offset = c * width + np.arange(width)[None, :]
        pos = rows + offset
        valid = (offset < row_len) & (pos + 1 <= n - 1)
        yield _batch(tokens, pos, valid, valid, c == 0)


def _paper_batches(tokens: np.ndarray, batch_size: int, paper_mask: int) -> Iterator[EvalBatch]:
    n_rows = _paper_rows(len(tokens))
    t = np.arange(PAPER_SEQ_LEN)
    for first in range(0, n_rows, batch_size):
        i = np.arange(first, first + batch_size)
        pos = (i * PAPER_CHUNK)[:, None] + t
        valid = np.broadcast_to((i < n_rows)[:, None], pos.shape)
        scored = np.broadcast_to((t >= paper_mask)[None, :], pos.shape)
        yield _batch(tokens, pos, valid, scored, True)
