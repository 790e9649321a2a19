"""The pure-JAX math of one highway micro-step (rhhjax/ops/cells.py): the gate backward
against autodiff, the dropout masks every implementation draws alike, the first-step factor
and the hyper scales."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rhhjax.ops import cells


@pytest.mark.parametrize("masked", [False, True])
def test_gate_backward_is_the_autodiff_of_highway_gate(masked):
    keys = jax.random.split(jax.random.key(0), 4)
    a = jax.random.normal(keys[0], (3, 10))
    s = jax.random.normal(keys[1], (3, 5))
    ds = jax.random.normal(keys[2], (3, 5))
    mask = cells.gate_masks(keys[3], 0, (3, 5), 0.6) if masked else None
    _, vjp = jax.vjp(lambda a, s: cells.highway_gate(a, s, mask), a, s)
    da_ref, _ = vjp(ds)
    h, t = jnp.tanh(a[:, :5]), jax.nn.sigmoid(a[:, 5:])
    da, ds_carry = cells.gate_backward(ds, s, h, t, mask)
    np.testing.assert_allclose(da, da_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ds_carry, ds * (1.0 - t), rtol=1e-6)


def test_the_keep_decisions_of_a_sequence_are_the_per_step_masks():
    key = jax.random.key(3)
    keeps = cells.gate_keeps(key, 4, (2, 3, 5), 0.7, first_step=1)
    for i in range(4):
        mask = cells.gate_masks(key, 1 + i, (2, 3, 5), 0.7)
        np.testing.assert_array_equal(keeps[i], mask > 0)
        assert set(np.unique(mask).tolist()) <= {0.0, np.float32(1 / 0.7)}


def test_first_step_factor_is_zero_only_for_exactly_zero_rows():
    s0 = jnp.array([[0.0, 0.0], [0.0, 1e-30], [2.0, 0.0]])
    assert cells.first_step_bias0_scale(s0)[:, 0].tolist() == [0.0, 1.0, 1.0]


def test_hyper_scales_match_a_per_layer_matmul():
    keys = jax.random.split(jax.random.key(4), 3)
    kernel = jax.random.normal(keys[0], (2, 3, 5))
    bias = jax.random.normal(keys[1], (2, 5))
    states = jax.random.normal(keys[2], (7, 2, 4, 3))  # [T, L, B, h]
    z = cells.hyper_scales(kernel, bias, states, jnp.float32)
    expected = jnp.einsum("tlbh,lhn->tlbn", states, kernel, precision="highest") + bias[:, None]
    np.testing.assert_allclose(z, expected, rtol=1e-5, atol=1e-5)
    assert cells.double(jnp.arange(2.0)).tolist() == [0.0, 1.0, 0.0, 1.0]
