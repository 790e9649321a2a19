"""`kernels/mosaic/persistent_slots.py`: the layer-major order of the persistent kernels' GEMM
operand buffers (s_mm, d_mm) that lets the weight gradient read them whole, with no
transpose and no slice copy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from rhhjax.kernels.mosaic import persistent_slots as slots


@pytest.mark.parametrize(("steps", "depth"), [(1, 1), (3, 1), (1, 4), (5, 3), (100, 7)])
def test_slot_is_a_bijection_that_keeps_each_layer_contiguous_and_phase_0_first(steps, depth):
    phases = steps * depth
    got = [slots.slot(p, steps, depth) for p in range(phases)]
    assert sorted(got) == list(range(phases)) and got[0] == 0
    for layer in range(depth):
        layer_slots = [got[t * depth + layer] for t in range(steps)]
        assert layer_slots == list(range(layer * steps, (layer + 1) * steps))


@pytest.mark.parametrize(("steps", "depth"), [(3, 1), (2, 3), (7, 5)])
def test_the_traced_slot_is_the_python_slot(steps, depth):
    traced = jax.jit(lambda p: slots.slot(p, steps, depth))
    for p in range(steps * depth):
        assert int(traced(jnp.int32(p))) == slots.slot(p, steps, depth)


@pytest.mark.parametrize(("steps", "depth"), [(2, 3), (4, 2), (1, 5), (3, 1)])
def test_to_slots_places_block_p_at_slot_p_and_from_slots_inverts_it(steps, depth):
    rng = np.random.default_rng(steps * 10 + depth)
    blocks = jnp.asarray(rng.normal(size=(steps * depth, 3, 2)), jnp.float32)
    placed = slots.to_slots(blocks, steps, depth)
    for p in range(steps * depth):
        np.testing.assert_array_equal(placed[slots.slot(p, steps, depth)], blocks[p])
    np.testing.assert_array_equal(slots.from_slots(placed, steps, depth), blocks)


def test_a_weight_gradient_over_the_whole_buffers_equals_the_per_phase_sum():
    """dW_l over layer l's slots is the sum over the phases of layer l of s_p^T d_p: one
    batched GEMM over [L, T * rows, K] views of the buffers."""
    steps, depth, rows, k, n = 3, 2, 4, 5, 6
    phases = steps * depth
    rng = np.random.default_rng(0)
    s = jnp.asarray(rng.normal(size=(phases, rows, k)), jnp.float32)
    d = jnp.asarray(rng.normal(size=(phases, rows, n)), jnp.float32)
    want = np.zeros((depth, k, n), np.float32)
    for p in range(phases):
        want[p % depth] += np.asarray(s[p]).T @ np.asarray(d[p])
    s_in = slots.to_slots(s, steps, depth).reshape(depth, steps * rows, k)
    d_in = slots.to_slots(d, steps, depth).reshape(depth, steps * rows, n)
    got = jnp.einsum("lri,lro->lio", s_in, d_in, precision="highest")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("k_pad", "n_pad"), [(8, 8), (6, 8), (8, 6)])
def test_the_a_buffer_holds_each_phases_input_at_its_slot_and_gives_it_back(k_pad, n_pad):
    """inputs [P, rows, n_pad] -> [P * rows, k_pad]: phase p's rows at slot(p), its first
    k_pad columns (zero-padded when k_pad passes n_pad); back: the same, zero past k_pad."""
    steps, depth, rows = 3, 2, 4
    rng = np.random.default_rng(k_pad * 10 + n_pad)
    inputs = jnp.asarray(rng.normal(size=(steps * depth, rows, n_pad)), jnp.float32)
    buffer = slots.inputs_to_a_buffer(inputs, steps, depth, k_pad)
    assert buffer.shape == (steps * depth * rows, k_pad)
    width = min(k_pad, n_pad)
    for p in range(steps * depth):
        block = buffer[slots.slot(p, steps, depth) * rows :][:rows]
        np.testing.assert_array_equal(block[:, :width], inputs[p, :, :width])
        assert not np.asarray(block[:, width:]).any()
    back = slots.a_buffer_to_inputs(buffer, steps, depth, n_pad)
    np.testing.assert_array_equal(back[..., :width], inputs[..., :width])
    assert back.shape == inputs.shape and not np.asarray(back[..., width:]).any()
