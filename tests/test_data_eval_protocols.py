"""Tests of rhhjax.data.eval_protocols: windows / stream score every symbol once, the paper
protocol's rows and counts, bad arguments."""

from __future__ import annotations

import numpy as np
import pytest

from rhhjax.data import DataError
from rhhjax.data.eval_protocols import eval_batches, num_eval_batches, scored_count

EVAL_CASES = [
    # (N, B, T, m)
    (2, 1, 1, 0),
    (2, 3, 5, 4),
    (11, 1, 10, 0),
    (12, 1, 10, 9),
    (101, 4, 10, 3),
    (1000, 7, 33, 32),
    (1000, 1, 100, 50),
    (1001, 8, 100, 50),
    (57, 64, 8, 7),
    (5000, 5, 7, 0),
]


def _scored_positions(batches) -> np.ndarray:
    """Target positions (tokens = arange) of every scored entry, in order."""
    return np.concatenate([b.targets[b.mask == 1] for b in batches])


@pytest.mark.parametrize("n,b,t,m", EVAL_CASES)
def test_windows_protocol_scores_every_position_once_with_min_context(n, b, t, m):
    batches = list(eval_batches(np.arange(n), "windows", b, t, min_context=m))
    assert len(batches) == num_eval_batches(n, "windows", b, t, m)
    for batch in batches:
        assert batch.inputs.shape == batch.targets.shape == batch.mask.shape == (b, t)
        assert batch.inputs.dtype == np.int32 and batch.mask.dtype == np.float32 and batch.reset
        on = batch.mask == 1
        np.testing.assert_array_equal(batch.targets[on], batch.inputs[on] + 1)
    total = sum(float(x.mask.sum()) for x in batches)
    assert total == scored_count(n, "windows", seq_len=t, min_context=m) == n - 1
    positions = _scored_positions(batches)
    np.testing.assert_array_equal(np.sort(positions), np.arange(1, n))
    # window k starts at k * (t - m); window 0 scores from position 0, later ones from m
    inputs = np.concatenate([x.inputs for x in batches])
    masks = np.concatenate([x.mask for x in batches])
    for w in np.flatnonzero(masks.any(axis=1)):
        scored = np.flatnonzero(masks[w])
        assert inputs[w, 0] == w * (t - m)
        assert scored.min() == (0 if w == 0 else m)
        np.testing.assert_array_equal(inputs[w, scored], w * (t - m) + scored)


@pytest.mark.parametrize("n,b,t,m", EVAL_CASES)
def test_stream_protocol_scores_every_position_once_with_carried_state(n, b, t, m):
    batches = list(eval_batches(np.arange(n), "stream", b, t, min_context=m))
    assert len(batches) == num_eval_batches(n, "stream", b, t, m)
    assert [x.reset for x in batches] == [True] + [False] * (len(batches) - 1)
    total = sum(float(x.mask.sum()) for x in batches)
    assert total == scored_count(n, "stream", seq_len=t) == n - 1
    np.testing.assert_array_equal(np.sort(_scored_positions(batches)), np.arange(1, n))
    # each row is a contiguous stream: concatenating the chunks gives consecutive inputs
    inputs = np.concatenate([x.inputs for x in batches], axis=1)
    mask = np.concatenate([x.mask for x in batches], axis=1)
    targets = np.concatenate([x.targets for x in batches], axis=1)
    np.testing.assert_array_equal(targets[mask == 1], inputs[mask == 1] + 1)
    row_len = -(-(n - 1) // b)
    for r in range(b):
        scored = np.flatnonzero(mask[r])
        if scored.size:
            np.testing.assert_array_equal(scored, np.arange(scored.size))
            np.testing.assert_array_equal(inputs[r, scored], r * row_len + scored)


@pytest.mark.parametrize("n", [100, 101, 152, 153, 1000])
@pytest.mark.parametrize("paper_mask", [0, 50, 95])
def test_paper_protocol_rows_and_counts(n, paper_mask):
    tokens = np.arange(n)
    if n < 101:
        with pytest.raises(DataError, match="101"):
            eval_batches(tokens, "paper", 4, seq_len=7)
        assert scored_count(n, "paper", paper_mask=paper_mask) == 0
        return
    batches = list(eval_batches(tokens, "paper", 4, seq_len=7, paper_mask=paper_mask))
    rows = (n - 101) // 51 + 1
    inputs = np.concatenate([x.inputs for x in batches])
    mask = np.concatenate([x.mask for x in batches])
    assert inputs.shape[1] == 100 and all(x.reset for x in batches)
    np.testing.assert_array_equal(inputs[:rows], 51 * np.arange(rows)[:, None] + np.arange(100))
    assert not mask[rows:].any()
    total = sum(float(x.mask.sum()) for x in batches)
    assert total == scored_count(n, "paper", paper_mask=paper_mask)
    assert total == rows * (100 - paper_mask)
    scored = _scored_positions(batches)
    if paper_mask >= 50:  # rows overlap by 50 symbols: a mask >= 50 scores no symbol twice
        assert len(np.unique(scored)) == len(scored)
    if paper_mask == 50:
        assert not np.any(scored % 51 == 50)  # the 51st symbol of every chunk is never scored


def test_eval_rejects_bad_protocol_and_min_context():
    with pytest.raises(DataError, match="protocol"):
        eval_batches(np.arange(50), "sliding", 2, 10)
    with pytest.raises(DataError, match="min_context"):
        eval_batches(np.arange(50), "windows", 2, 10, min_context=10)


@pytest.mark.parametrize("protocol", ["windows", "stream"])
@pytest.mark.parametrize(
    "n,b,t,m,chunk", [(1001, 3, 100, 50, 7), (57, 2, 30, 5, 30), (400, 4, 90, 10, 25)]
)
def test_long_windows_come_in_pieces_that_score_the_same_targets(protocol, n, b, t, m, chunk):
    whole = list(eval_batches(np.arange(n), protocol, b, t, min_context=m, max_chunk=10**6))
    pieces = list(eval_batches(np.arange(n), protocol, b, t, min_context=m, max_chunk=chunk))
    assert len(pieces) == num_eval_batches(n, protocol, b, t, m, max_chunk=chunk)
    assert all(p.inputs.shape == (b, min(t, chunk)) for p in pieces)
    assert sum(float(p.mask.sum()) for p in pieces) == n - 1
    np.testing.assert_array_equal(
        np.sort(_scored_positions(pieces)), np.sort(_scored_positions(whole))
    )
    if protocol == "windows":  # a window's state is reset at its first piece only
        assert [p.reset for p in pieces].count(True) == len(whole)
        assert all(p.reset == (p.inputs[0, 0] % (t - m) == 0) for p in pieces if p.mask.any())


@pytest.mark.parametrize("protocol", ["windows", "stream"])
def test_a_huge_seq_len_needs_memory_of_one_chunk_and_stops_at_the_end_of_the_split(protocol):
    """eval.seq_len=100000000 once built [batch, 1e8] arrays (a 6 GB int64 index for batch 8,
    then an out-of-memory kill); now each batch holds MAX_CHUNK steps and no piece is made
    past the split's last target (10**6 here: what the old code built stays small)."""
    from rhhjax.data.eval_protocols import MAX_CHUNK

    n = 3000
    batches = list(eval_batches(np.arange(n), protocol, 8, 10**6, min_context=5))
    assert all(x.inputs.shape == (8, MAX_CHUNK) for x in batches)
    assert len(batches) <= -(-n // MAX_CHUNK)
    assert sum(float(x.mask.sum()) for x in batches) == n - 1
