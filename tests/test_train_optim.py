"""rhhjax.train.optim: the paper code's L1 clipping and the optimizer choices."""

import jax.numpy as jnp
import numpy as np
from helpers import assert_trees_equal

from rhhjax.train import optim


def test_l1_clip_matches_paper_code():
    grads = {"a": jnp.array([3.0, -4.0]), "b": jnp.array([[1.0, -2.0]])}  # L1 = 10
    tx = optim.clip_by_l1_norm(5.0)
    out, _ = tx.update(grads, tx.init(grads))
    scale = 5.0 / (10.0 + 1e-6)
    np.testing.assert_allclose(out["a"], np.array([3.0, -4.0]) * scale, rtol=1e-6)
    np.testing.assert_allclose(out["b"], np.array([[1.0, -2.0]]) * scale, rtol=1e-6)
    small, _ = optim.clip_by_l1_norm(100.0).update(grads, tx.init(grads))
    assert_trees_equal(small, grads)


def test_optimizer_choices():
    base = dict(
        learning_rate=0.2,
        b1=0.9,
        b2=0.999,
        clip_norm=10.0,
        clip_type="l2",
        lr_decay=1.03,
        lr_decay_start_epoch=5,
        batches_per_epoch=10,
    )
    sgd = optim.OptimizerConfig(optimizer="sgd", weight_decay=1e-7, **base)
    # Zilly et al.: epochs 0-4 at 0.2, epoch 5 at 0.2 / 1.03, epoch 6 at 0.2 / 1.03**2
    lrs = [float(sgd.learning_rate_at(step)) for step in (0, 49, 50, 59, 60)]
    np.testing.assert_allclose(lrs, [0.2, 0.2, 0.2 / 1.03, 0.2 / 1.03, 0.2 / 1.03**2], rtol=1e-6)
    params = {"w": jnp.ones((3,))}
    for oc in (
        sgd,
        optim.OptimizerConfig(optimizer="adam", weight_decay=0.0, **base),
        optim.OptimizerConfig(optimizer="adam", weight_decay=0.1, **base),
    ):
        tx = optim.make_optimizer(oc)
        updates, _ = tx.update({"w": jnp.ones((3,))}, tx.init(params), params)
        assert np.all(np.asarray(updates["w"]) < 0)
