"""Block sizes, validation, geometry and padding helpers (`kernels/config.py`), and the
one-line input errors of the kernel wrappers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_cases import (
    TEST_CONFIG,
    make_unpadded,
    pad_layer,
)
from rhhjax.kernels import highway as hw

from rhhjax.errors import UserError


def test_geometry_clamps_and_pads():
    geo = hw.Geometry.make(hw.HighwayConfig(), batch=3, n=8)
    assert (geo.block_b, geo.block_n, geo.block_k, geo.b_pad, geo.n_pad) == (16, 16, 16, 16, 16)
    geo = hw.Geometry.make(hw.HighwayConfig(), batch=256, n=1000)
    assert (geo.b_pad, geo.n_pad) == (256, 1024)
    cfg = hw.HighwayConfig()
    assert geo.grid == (256 // cfg.block_b, 1024 // cfg.block_n)


def test_padding_helpers_with_leading_axes():
    geo = hw.Geometry.make(TEST_CONFIG, batch=3, n=5)
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
    geo = hw.Geometry.for_units(batch=3, n=70, unit_multiple=64)
    assert (geo.b_pad, geo.n_pad) == (3, 128)
    rows = jax.random.normal(jax.random.key(1), (2, 3, 70))
    padded = geo.pad_rows(rows)
    assert padded.shape == (2, 3, 128)
    np.testing.assert_array_equal(padded[..., 70:], 0.0)
    np.testing.assert_array_equal(geo.unpad_rows(padded), rows)


@pytest.mark.parametrize(
    "bad", [dict(block_k=24), dict(block_n=48), dict(block_b=8), dict(block_k=8), dict(num_warps=3)]
)
def test_invalid_config_rejected_with_a_user_error(bad):
    with pytest.raises(hw.KernelConfigError, match="HighwayConfig") as error:
        hw.Geometry.make(hw.HighwayConfig(**bad), 4, 16)
    assert isinstance(error.value, UserError) and "\n" not in str(error.value)


def test_shared_memory_overflow_rejected():
    """128/128/64 with 4 stages: ptxas reported 294,912 B for the f32 forward alone (over the
    H100's 232,448 B); the model (fused kernel, the largest) predicts more: rejected."""
    big = hw.HighwayConfig(block_b=128, block_n=128, block_k=64, num_stages=4)
    assert big.smem_bytes(jnp.float32) >= 294_912
    geo = hw.Geometry.make(big, 256, 1000)
    p = pad_layer(make_unpadded(jax.random.key(0), 256, 1000, "float32", False, False, False),
                  geo, jnp.float32)  # fmt: skip
    with pytest.raises(ValueError, match="shared memory"):
        hw.forward_padded(p["s"], p["w3"], None, p["bias2"], None, None, geo=geo, config=big)
    for dtype in (jnp.float32, jnp.bfloat16):
        assert hw.HighwayConfig().smem_bytes(dtype) <= hw.H100_SMEM_PER_BLOCK


def test_shape_errors():
    geo = hw.Geometry.make(TEST_CONFIG, 4, 20)
    p = pad_layer(make_unpadded(jax.random.key(0), 4, 20, "float32", True, True, True),
                  geo, jnp.float32)  # fmt: skip
    with pytest.raises(ValueError, match="w3 must have padded shape"):
        hw.forward_padded(p["s"], p["w3"][:16], None, p["bias2"], None, None, geo=geo)
    with pytest.raises(ValueError, match="z must have padded shape"):
        hw.forward_padded(p["s"], p["w3"], p["z"][:4], p["bias2"], None, None, geo=geo)
    with pytest.raises(ValueError, match="xproj must have dtype float32"):
        hw.forward_padded(p["s"], p["w3"], None, p["bias2"], p["xproj"].astype(jnp.bfloat16),
                          None, geo=geo)  # fmt: skip
    with pytest.raises(ValueError, match="keep_mask must have dtype int8"):
        hw.forward_padded(p["s"], p["w3"], None, p["bias2"], None, p["keep8"] > 0, geo=geo)
    with pytest.raises(ValueError, match="Geometry needs batch >= 1"):
        hw.Geometry.make(TEST_CONFIG, 0, 20)
    with pytest.raises(ValueError, match="keep must be in"):
        hw.forward_padded(p["s"], p["w3"], None, p["bias2"], None, p["keep8"], keep=0.0, geo=geo)
    with pytest.raises(ValueError, match="keep_mask must have dtype int8"):  # no float masks
        hw.forward_padded(p["s"], p["w3"], None, p["bias2"], None,
                          p["keep8"].astype(jnp.float32), geo=geo)  # fmt: skip
