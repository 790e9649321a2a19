"""`kernels/persistent_slots.py`: the layer-major order of the persistent kernels' GEMM
operand buffers (s_mm, d_mm) that lets the weight gradient read them whole, with no
transpose and no slice copy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from rhhjax.kernels import persistent_slots as slots


@pytest.mark.parametrize(("steps", "depth"), [(1, 1), (3, 1), (1, 4), (5, 3), (100, 7)])
def test_slots_are_distinct_layer_major_and_the_spares_are_the_rest(steps, depth):
    phases = steps * depth
    got = [slots.slot(p, steps, depth) for p in range(phases + 1)]
    assert len(set(got)) == phases + 1 and got[0] == 0
    spares = slots.spares(steps, depth)
    assert got[phases] == spares[0]  # phase P: layer 0's spare
    assert sorted(got[:phases] + spares) == list(range(slots.count(steps, depth)))
    per_layer = steps + 1
    for layer in range(depth):
        layer_slots = [got[t * depth + layer] for t in range(steps)]
        assert layer_slots == list(range(layer * per_layer, layer * per_layer + steps))


@pytest.mark.parametrize(("steps", "depth"), [(3, 1), (2, 3), (7, 5)])
def test_the_traced_slot_is_the_python_slot(steps, depth):
    traced = jax.jit(lambda p: slots.slot(p, steps, depth))
    for p in range(steps * depth + 1):
        assert int(traced(jnp.int32(p))) == slots.slot(p, steps, depth)


@pytest.mark.parametrize(("steps", "depth"), [(2, 3), (4, 2), (1, 5), (3, 1)])
def test_to_slots_places_block_p_at_slot_p_fills_the_spares_and_from_slots_inverts_it(
    steps, depth
):
    phases = steps * depth
    rng = np.random.default_rng(steps * 10 + depth)
    blocks = jnp.asarray(rng.normal(size=(phases + 1, 3, 2)), jnp.float32)
    filler = jnp.full((3, 2), 7.0, jnp.float32)
    placed = slots.to_slots(blocks, steps, depth, filler)
    assert placed.shape == (slots.count(steps, depth), 3, 2)
    for p in range(phases + 1):
        np.testing.assert_array_equal(placed[slots.slot(p, steps, depth)], blocks[p])
    for spare in slots.spares(steps, depth)[1:]:
        np.testing.assert_array_equal(placed[spare], filler)
    np.testing.assert_array_equal(slots.from_slots(placed, steps, depth), blocks)


def test_a_weight_gradient_over_the_whole_buffers_equals_the_per_phase_sum():
    """dW_l over layer l's slots, spares included (zeros in d, finite in s), is the sum over
    the phases of layer l of s_p^T d_p: one batched GEMM over views of the buffers."""
    steps, depth, rows, k, n = 3, 2, 4, 5, 6
    phases = steps * depth
    rng = np.random.default_rng(0)
    s = jnp.asarray(rng.normal(size=(phases + 1, rows, k)), jnp.float32)
    d = jnp.asarray(rng.normal(size=(phases + 1, rows, n)), jnp.float32)
    d = d.at[phases].set(0.0)  # the backward's zero block above the last phase
    want = np.zeros((depth, k, n), np.float32)
    for p in range(phases):
        want[p % depth] += np.asarray(s[p]).T @ np.asarray(d[p])
    per_layer = (steps + 1) * rows
    s_in = slots.to_slots(s, steps, depth, s[0]).reshape(depth, per_layer, k)
    d_in = slots.to_slots(d, steps, depth, jnp.zeros((rows, n))).reshape(depth, per_layer, n)
    got = jnp.einsum("lri,lro->lio", s_in, d_in, precision="highest")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
