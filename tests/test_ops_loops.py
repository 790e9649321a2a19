"""What the whole-sequence implementations share (rhhjax/ops/loops.py): the packed saved
rows, the states from the saved inputs, the generic forward scan and the gradients
formed after the reverse loop."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rhhjax.ops import cells, loops


def test_pack_and_unpack_are_inverse():
    fields = (("h", 1), ("t", 1), ("full", 2))
    key = jax.random.key(0)
    s = jax.random.normal(key, (3, 8))
    saved = {"h": s + 1, "t": s + 2, "full": jnp.stack([s + 3, s + 4], axis=1)}
    packed = loops.pack(s, saved, fields)
    assert packed.shape == (3, 5, 8)
    s_back, saved_back = loops.unpack(packed[None], fields)  # leading axes too
    np.testing.assert_array_equal(s_back[0], s)
    for name, value in saved.items():
        np.testing.assert_array_equal(saved_back[name][0], value)


def test_states_from_inputs_shift_by_one_micro_layer():
    inputs = jnp.arange(3 * 2).reshape(3, 2, 1, 1).astype(jnp.float32)  # [T, L, B, n]
    states = loops.states_from_inputs(inputs, jnp.full((1, 1), 99.0))
    # the output of (t, 0) is the input of (t, 1); of (t, 1) the input of (t + 1, 0)
    assert states[..., 0, 0].tolist() == [[1, 2], [3, 4], [5, 99]]


def test_forward_scan_saves_the_inputs_and_returns_the_outputs():
    """A layer that adds its bias: the states are cumulative sums, the packed rows hold each
    micro-layer's input state and its saved row."""

    def layer(s, w_l, z_l, bias_l, xproj_t, keep_l, hidden_l):
        s_new = s + bias_l + (0.0 if xproj_t is None else xproj_t[:, 0])
        return s_new, {"h": 2 * s_new}

    depth, length = 2, 3
    bias = (jnp.ones((1, 4)), 2 * jnp.ones((1, 4)))
    xproj = jnp.zeros((length, 1, 2, 4))
    args = ((None,) * depth, bias, jnp.zeros((1, 4)), xproj, None, None, None)
    states, packed = loops.forward_scan(layer, (("h", 1),), *args, save=True)
    unsaved, none = loops.forward_scan(layer, (("h", 1),), *args, save=False)
    assert none is None and packed.shape == (length, depth, 1, 2, 4)
    np.testing.assert_array_equal(states, unsaved)
    assert states[:, :, 0, 0].tolist() == [[1, 3], [4, 6], [7, 9]]
    assert packed[:, :, 0, 0, 0].tolist() == [[0, 1], [3, 4], [6, 7]]  # the inputs
    np.testing.assert_array_equal(packed[:, :, :, 1], 2 * states)


@pytest.mark.parametrize("has_z", [False, True])
def test_gradients_from_da_and_the_deferred_weight_gradient(has_z):
    t, depth, b, n = 2, 2, 3, 4
    keys = jax.random.split(jax.random.key(1), 4)
    da = jax.random.normal(keys[0], (t, depth, b, 2, n))
    s_in = jax.random.normal(keys[1], (t, depth, b, n))
    full = jax.random.normal(keys[2], (t, depth, b, 2, n))
    z = jax.random.normal(keys[3], (t, depth, b, n)) if has_z else None
    fields = (("full", 2),)
    packed = jnp.concatenate([s_in[..., None, :], full], axis=-2)
    d_scaled, dz, dbias = loops.gradients_from_da(da, z, packed, fields)
    np.testing.assert_allclose(dbias, da.sum((0, 2)), rtol=1e-6)
    if has_z:
        np.testing.assert_allclose(d_scaled, da * z[..., None, :], rtol=1e-6)
        np.testing.assert_allclose(dz, (da * full).sum(-2), rtol=1e-6)
    else:
        assert dz is None and d_scaled is da
    dw = loops.deferred_weight_gradient(jnp.float32, packed, d_scaled, fields)
    expected = jnp.einsum("tlbi,tlbho->liho", s_in, d_scaled, precision="highest")
    np.testing.assert_allclose(dw, expected, rtol=1e-5, atol=1e-5)
    assert loops.dropout_mask(0.5, jnp.array([True, False]), jnp.float32).tolist() == [2.0, 0.0]
    assert loops.dropout_mask(0.5, None, jnp.float32) is None
    assert cells.accumulation_dtype(jnp.bfloat16) == jnp.float32
