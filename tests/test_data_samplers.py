"""Tests of rhhjax.data.samplers: shapes, shifted targets, determinism, resume, stream rows."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rhhjax.data import DataError
from rhhjax.data.samplers import StreamSampler, WindowSampler


def test_window_sampler_shapes_dtypes_and_shifted_targets():
    tokens = np.arange(5000) % 251
    sampler = WindowSampler(tokens.astype(np.uint8), batch_size=8, seq_len=100, seed=3)
    assert sampler.batches_per_epoch == 5000 // 800
    batch = next(sampler)
    assert batch.inputs.shape == batch.targets.shape == (8, 100)
    assert batch.inputs.dtype == batch.targets.dtype == np.int32 and batch.reset
    np.testing.assert_array_equal(batch.targets[:, :-1], batch.inputs[:, 1:])
    big = WindowSampler(np.arange(5000), batch_size=64, seq_len=100, seed=3)
    b = big.batch_at(7)
    np.testing.assert_array_equal(b.inputs, b.inputs[:, :1] + np.arange(100))
    np.testing.assert_array_equal(b.targets, b.inputs + 1)


def test_window_sampler_is_deterministic_from_the_seed():
    tokens = np.arange(3000)
    a = [next(WindowSampler(tokens, 4, 50, seed=1)).inputs for _ in range(2)]
    s1, s2, s3 = (WindowSampler(tokens, 4, 50, seed=s) for s in (1, 1, 2))
    first = [next(s1).inputs for _ in range(5)]
    np.testing.assert_array_equal(a[0], a[1])
    assert all(np.array_equal(x, next(s2).inputs) for x in first)
    assert not all(np.array_equal(x, next(s3).inputs) for x in first)


@pytest.mark.parametrize("kind", ["window", "stream"])
def test_sampler_restore_continues_like_an_uninterrupted_sampler(kind):
    tokens = np.arange(4000) % 200

    def make(seed=0):
        if kind == "window":
            return WindowSampler(tokens, 4, 30, seed=seed)
        return StreamSampler(tokens, 4, 30, seed=seed)

    reference = make(seed=5)
    expected = [next(reference) for _ in range(25)]
    interrupted = make(seed=5)
    for _ in range(11):
        next(interrupted)
    state = json.loads(json.dumps(interrupted.state()))
    resumed = make(seed=0)  # the seed comes back with the state
    resumed.restore(state)
    for want in expected[11:]:
        got = next(resumed)
        np.testing.assert_array_equal(got.inputs, want.inputs)
        np.testing.assert_array_equal(got.targets, want.targets)
        assert (got.reset, got.step, got.epoch) == (want.reset, want.step, want.epoch)
    with pytest.raises(DataError, match="batch_size"):
        (WindowSampler if kind == "window" else StreamSampler)(tokens, 5, 30).restore(state)


@pytest.mark.parametrize("random_offset", [False, True])
def test_stream_sampler_rows_continue_across_batches_and_reset_each_epoch(random_offset):
    n, b, t = 1003, 3, 7
    sampler = StreamSampler(np.arange(n), b, t, seed=2, random_offset=random_offset)
    bpe = sampler.batches_per_epoch
    assert bpe == (n - 1 - (t - 1 if random_offset else 0)) // (b * t)
    offsets = set()
    for epoch in range(6):
        batches = [next(sampler) for _ in range(bpe)]
        assert [x.reset for x in batches] == [True] + [False] * (bpe - 1)
        assert all(x.epoch == epoch for x in batches)
        rows_in = np.concatenate([x.inputs for x in batches], axis=1)
        rows_tg = np.concatenate([x.targets for x in batches], axis=1)
        np.testing.assert_array_equal(rows_tg, rows_in + 1)
        # every row is one contiguous slice, rows are adjacent, all inside the data
        start = rows_in[0, 0]
        expected = start + np.arange(b)[:, None] * sampler.row_len + np.arange(bpe * t)
        np.testing.assert_array_equal(rows_in, expected)
        assert rows_tg.max() <= n - 1 and 0 <= start < t
        offsets.add(int(start))
    assert (len(offsets) > 1) == random_offset
