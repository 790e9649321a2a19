"""Cores over time: variational masks, carrying state across calls, float64 gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from model_cases import init, tiny

from rhhjax.ops import cells


def test_gate_mask_statistics():
    keep = 0.65
    masks = np.asarray(cells.gate_masks(jax.random.key(0), 5, (7, 256, 200), keep))
    np.testing.assert_allclose(np.unique(masks), [0.0, 1.0 / keep], rtol=1e-6)
    assert abs((masks > 0).mean() - keep) < 0.01
    assert abs(masks.mean() - 1.0) < 0.015


def test_variational_masks_are_shared_over_time():
    config = tiny(
        type="rhn", dropout="variational", keep_hidden=0.5, keep_input=0.7, keep_output=0.8
    )
    model, params = init(config, 5)
    tokens = jnp.asarray(np.random.default_rng(5).integers(0, 11, (2, 5)))
    rngs = {"dropout": jax.random.key(9)}
    a, _ = model.apply({"params": params}, tokens, train=True, rngs=rngs)
    b, _ = model.apply({"params": params}, tokens, train=True, rngs=rngs)
    c, _ = model.apply({"params": params}, tokens, train=True, rngs={"dropout": jax.random.key(10)})
    d, _ = model.apply({"params": params}, tokens, train=False)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c) and not np.allclose(a, d)
    masks = np.asarray(cells.sequence_masks(jax.random.key(0), (7, 256, 100), 0.5))
    assert abs((masks > 0).mean() - 0.5) < 0.01


def test_carry_continues_a_sequence_exactly():
    config = tiny()
    model, params = init(config, 4)
    tokens = jnp.asarray(np.random.default_rng(4).integers(0, 11, (2, 10)))
    whole, _ = model.apply({"params": params}, tokens)
    first, carry = model.apply({"params": params}, tokens[:, :4])
    second, _ = model.apply({"params": params}, tokens[:, 4:], carry)
    np.testing.assert_allclose(jnp.concatenate([first, second], 1), whole, rtol=1e-5, atol=1e-5)


def test_float64_gradient_matches_finite_differences():
    with jax.enable_x64(True):
        config = tiny(hidden=5, hyper_hidden=3, depth=2, embed_dim=3, vocab_size=6, dtype="float64")
        model, params = init(config, 11)
        params = jax.tree_util.tree_map(lambda a: a.astype(jnp.float64), params)
        tokens = jnp.asarray(np.random.default_rng(11).integers(0, 6, (2, 4)))

        @jax.jit
        def loss(p):
            logits, _ = model.apply({"params": p}, tokens[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

        grads = jax.grad(loss)(params)
        flat, unravel = jax.flatten_util.ravel_pytree(params)
        gflat, _ = jax.flatten_util.ravel_pytree(grads)
        rng = np.random.default_rng(0)
        for index in rng.choice(flat.size, 25, replace=False):
            eps = 1e-6
            e = jnp.zeros_like(flat).at[index].set(eps)
            fd = (loss(unravel(flat + e)) - loss(unravel(flat - e))) / (2 * eps)
            np.testing.assert_allclose(gflat[index], fd, rtol=1e-5, atol=1e-9)
