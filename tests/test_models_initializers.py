"""Initialisers: the transform-gate bias shift and orthogonal matrices per layer."""

import jax
import numpy as np

from rhhjax import models


def _rhn_params(**overrides):
    fields = dict(type="rhn", vocab_size=11, embed_dim=5, hidden=12, depth=3)
    fields.update(overrides)
    model = models.build_model(models.ModelConfig(**fields))
    return models.init_params(model, jax.random.key(0))


def test_transform_gate_bias_init_shifts_only_the_t_half():
    params = _rhn_params(t_bias_init=-4.0)
    bias = np.asarray(params["core"]["cell"]["bias_s"])
    bound = 1 / np.sqrt(12)
    assert np.all(np.abs(bias[:, :12]) <= bound)
    assert np.all(np.abs(bias[:, 12:] + 4.0) <= bound)


def test_orthogonal_init_gives_orthonormal_rows_per_layer():
    w = np.asarray(_rhn_params()["core"]["cell"]["kernel_s"])
    for layer in w:
        np.testing.assert_allclose(layer @ layer.T, np.eye(12), atol=1e-5)
