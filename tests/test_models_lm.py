"""The language model: the paper's parameter counts and learning a short string."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rhhjax import models


@pytest.mark.parametrize(
    ("variant", "expected"),
    [({}, 15_262_736), ({"type": "rhn"}, 14_121_400)],
)
def test_paper_parameter_counts(variant, expected):
    config = models.ModelConfig(**variant)
    model = models.build_model(config)
    shapes = jax.eval_shape(lambda: models.init_params(model, jax.random.key(0)))
    assert models.count_params(shapes) == expected


def test_lstm_parameter_count_follows_shapes():
    config = models.ModelConfig(type="lstm", hidden=1125, lstm_layers=2)
    model = models.build_model(config)
    shapes = jax.eval_shape(lambda: models.init_params(model, jax.random.key(0)))
    layer0 = 27 * 4500 + 1125 * 4500 + 4500
    layer1 = 1125 * 4500 * 2 + 4500
    assert models.count_params(shapes) == 50 * 27 + layer0 + layer1 + 1125 * 50 + 50


@pytest.mark.parametrize("model_type", ["hyperrhn", "lstm"])
def test_tiny_model_overfits_a_short_string(model_type):
    text = "the quick brown fox jumps over the lazy dog "
    vocab = sorted(set(text))
    ids = np.array([vocab.index(ch) for ch in text * 2])
    config = models.ModelConfig(
        type=model_type, vocab_size=len(vocab), embed_dim=5, hidden=32, hyper_hidden=8, depth=2,
        keep=1.0,
    )  # fmt: skip
    model = models.build_model(config)
    params = models.init_params(model, jax.random.key(0))
    tokens = jnp.asarray(ids[None, :])
    optimizer = optax.adam(1e-2)
    opt_state = optimizer.init(params)

    def loss_fn(p):
        logits, _ = model.apply({"params": p}, tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    @jax.jit
    def step(p, s):
        loss, grads = jax.value_and_grad(loss_fn)(p)
        updates, s = optimizer.update(grads, s)
        return optax.apply_updates(p, updates), s, loss

    for _ in range(300):
        params, opt_state, loss = step(params, opt_state)
    assert float(loss) < 0.05
