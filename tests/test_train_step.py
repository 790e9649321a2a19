"""rhhjax.train.step: dropout keys of the one training step. (That benchmarks and the ablation
use this step: tests/test_benchmarks.py, tests/test_tools_ablate.py.)"""

import jax
import jax.numpy as jnp
import numpy as np

from rhhjax.train import step as train_step


def test_dropout_keys():
    a = train_step.dropout_key(0, jnp.int32(5), jnp.int32(0))
    ref = jax.random.fold_in(jax.random.key(0), 5)
    assert np.array_equal(jax.random.key_data(a), jax.random.key_data(ref))
    b = train_step.dropout_key(0, jnp.int32(5), jnp.int32(1))
    assert not np.array_equal(jax.random.key_data(a), jax.random.key_data(b))
