"""The gradient-flow curve equals one explicit jax.grad per (row, step)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rhhjax import analysis as analyze
from rhhjax import models

VOCAB = 13


@pytest.fixture(scope="module")
def tokens() -> np.ndarray:
    return np.random.default_rng(0).integers(0, VOCAB, size=3000).astype(np.uint8)


def explicit_input_gradient_norms(mc, params, inputs, targets) -> np.ndarray:
    """||d loss_{T-1} / d x_t|| for every row and t: one jax.grad per (row, t), each w.r.t.
    the embedded input of step t alone, through the model's own core and head."""
    model = models.build_model(mc)
    embedding = params["embed"]["embedding"]

    def forward(module, x):
        outputs, _ = module.core(x, module.initial_carry(x.shape[0]), None)
        return module.head(outputs)

    def grad_at(x_row, target, t):
        def loss_of_xt(xt):
            x = jax.lax.dynamic_update_slice(x_row, xt[None, None, :], (0, t, 0))
            logits = model.apply({"params": params}, x, method=forward)
            return -jax.nn.log_softmax(logits[0, -1])[target]

        return jax.grad(loss_of_xt)(x_row[0, t])

    # one separate gradient per (row, t); vmapped so that it compiles once
    steps = jnp.arange(inputs.shape[1])
    per_row = jax.vmap(grad_at, in_axes=(None, None, 0))
    x_rows = jnp.take(embedding, jnp.asarray(inputs), axis=0)[:, None]  # [B, 1, T, E]
    grads = jax.jit(jax.vmap(per_row, in_axes=(0, 0, None)))(
        x_rows, jnp.asarray(targets[:, -1]), steps
    )  # [B, T, E]
    return np.linalg.norm(np.asarray(grads, np.float64), axis=-1)


@pytest.mark.parametrize("model_type", ["rhn", "hyperrhn", "lstm"])
def test_gradient_curve_equals_explicit_per_step_grad(model_type, tokens):
    # dropout stays at the configs' default (gate, keep 0.65): the analysis must not use it
    mc = models.ModelConfig(
        type=model_type, vocab_size=VOCAB, embed_dim=5, hidden=16, hyper_hidden=8, depth=2
    )
    s = analyze.Subject(
        label=model_type, config=mc, params=analyze.init_params(mc, 1), tokens=tokens
    )
    seq_len, rows = 12, 4
    inputs, targets, _ = analyze.heldout_windows(tokens, rows, seq_len)
    expected = explicit_input_gradient_norms(s.config, s.params, inputs, targets)
    assert np.all(expected > 0)
    # batch_size 2 < rows: the curve is assembled from two chunks
    curve = analyze.input_gradients(s, rows, seq_len, batch_size=2)
    assert curve["t"] == list(range(seq_len)) and curve["sequences"] == rows
    np.testing.assert_allclose(curve["mean_norm"], expected.mean(axis=0), rtol=2e-4)
    norms, _ = analyze.make_input_gradient_norms(s.config)(s.params, inputs[2:], targets[2:])
    np.testing.assert_allclose(np.asarray(norms), expected[2:], rtol=2e-4)
