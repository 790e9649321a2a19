"""The padded layout (`kernels/layout.py`): padded extents and the padding helpers with
leading axes, for the kernels' layout and the XLA path's."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from rhhjax.kernels.layout import Geometry, round_up


def test_padding_helpers_with_leading_axes():
    geo = Geometry(batch=3, n=5, block_b=16, block_n=16, block_k=16, b_pad=16, n_pad=16)
    key = jax.random.key(5)
    rows = jax.random.normal(key, (4, 2, 3, 5))  # [T, L, B, n]
    halves = jax.random.normal(key, (4, 3, 10))  # [T, B, 2n]
    w = jax.random.normal(key, (2, 5, 10))  # [L, n, 2n]
    bias = jax.random.normal(key, (2, 10))  # [L, 2n]
    pr, ph = geo.pad_rows(rows), geo.pad_halves(halves)
    assert pr.shape == (4, 2, 16, 16) and ph.shape == (4, 16, 2, 16)
    np.testing.assert_array_equal(geo.unpad_rows(pr), rows)
    np.testing.assert_array_equal(geo.unpad_halves(ph), halves)
    np.testing.assert_array_equal(ph[:, :3, 1, :5], halves[..., 5:])  # t half aligned
    np.testing.assert_array_equal(ph[:, 3:], 0.0)
    w3, w_t = geo.pad_weight(w, jnp.bfloat16), geo.pad_weight_t(w, jnp.float32)
    assert w3.shape == (2, 16, 2, 16) and w3.dtype == jnp.bfloat16
    assert w_t.shape == (2, 2, 16, 16) and w_t.dtype == jnp.float32
    for half in range(2):
        np.testing.assert_array_equal(
            w3[:, :5, half, :5], w[..., half * 5 : half * 5 + 5].astype(jnp.bfloat16)
        )
        # w_t[l, h, k, j] = w[l, j, h * n + k]
        np.testing.assert_array_equal(
            w_t[:, half, :5, :5], jnp.swapaxes(w[..., half * 5 : half * 5 + 5], -1, -2)
        )
    np.testing.assert_array_equal(w_t[:, :, 5:], 0.0)
    b2 = geo.pad_bias(bias)
    assert b2.shape == (2, 2, 16)
    np.testing.assert_array_equal(b2[:, 1, :5], bias[:, 5:])
    np.testing.assert_array_equal(geo.unpad_bias(b2), bias)
    np.testing.assert_array_equal(geo.unpad_weight(w3), w.astype(jnp.bfloat16))
    assert geo.pad_rows(None) is None


def test_xla_layout_pads_units_only():
    geo = Geometry.for_units(batch=3, n=70, unit_multiple=64)
    assert (geo.b_pad, geo.n_pad) == (3, 128)
    rows = jax.random.normal(jax.random.key(1), (2, 3, 70))
    padded = geo.pad_rows(rows)
    assert padded.shape == (2, 3, 128)
    np.testing.assert_array_equal(padded[..., 70:], 0.0)
    np.testing.assert_array_equal(geo.unpad_rows(padded), rows)


def test_round_up_and_bad_sizes():
    assert [round_up(x, 64) for x in (1, 64, 65, 1000)] == [64, 64, 128, 1024]
    with pytest.raises(ValueError, match="Geometry needs batch >= 1"):
        Geometry.for_units(0, 20, 64)
