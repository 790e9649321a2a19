"""rhhjax.train.optim: the paper code's L1 clipping and the optimizer choices."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import optax
import pytest
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


def _scheduled(schedule="cosine", warmup=3, lr=0.01, floor=0.1):
    return optim.OptimizerConfig(
        optimizer="adam", learning_rate=lr, b1=0.9, b2=0.999, weight_decay=0.0, clip_norm=0.0,
        clip_type="l1", lr_decay=1.0, lr_decay_start_epoch=0, batches_per_epoch=1,
        schedule=schedule, warmup_steps=warmup, final_lr_fraction=floor,
    )  # fmt: skip


@pytest.mark.parametrize("total", [5, 12, 101])
def test_the_cosine_schedule_is_optax_warmup_cosine_decay_ending_on_the_last_step(total):
    oc = _scheduled("cosine", warmup=3)
    reference = optax.warmup_cosine_decay_schedule(0.0, 0.01, 3, total - 1, end_value=0.001)
    steps = np.arange(total + 3)
    ours = [float(optim.scheduled_learning_rate(oc, s, total)) for s in steps]
    np.testing.assert_allclose(ours, [float(reference(s)) for s in steps], rtol=1e-5, atol=1e-9)
    assert ours[total - 1] == pytest.approx(0.001, rel=1e-6)  # the floor, on the last step
    assert ours[2] < ours[3] == pytest.approx(0.01) and ours[total - 2] > 0.001


def test_the_linear_schedule_is_optax_linear_pieces():
    oc, total = _scheduled("linear", warmup=4, floor=0.0), 20
    reference = optax.join_schedules(
        [optax.linear_schedule(0.0, 0.01, 4), optax.linear_schedule(0.01, 0.0, total - 1 - 4)],
        [4],
    )
    ours = [float(optim.scheduled_learning_rate(oc, s, total)) for s in range(total)]
    np.testing.assert_allclose(ours, [float(reference(s)) for s in range(total)], atol=1e-9)
    assert ours[-1] == 0.0


def test_an_unknown_length_holds_the_peak_after_the_warm_up():
    oc = _scheduled("cosine", warmup=3)
    lrs = [float(optim.scheduled_learning_rate(oc, s, 0)) for s in range(8)]
    assert lrs == pytest.approx([0.0, 0.01 / 3, 0.02 / 3] + [0.01] * 5)


@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
def test_scheduled_adam_updates_equal_optax_adam_with_the_same_schedule(weight_decay):
    """The run length lives in the optimizer state (set once, e.g. by a time budget): the
    updates are optax's adam / adamw given the same schedule as a function of the count."""
    oc = dataclasses.replace(_scheduled("cosine", warmup=2), weight_decay=weight_decay)
    total = 7
    schedule = optax.warmup_cosine_decay_schedule(0.0, 0.01, 2, total - 1, end_value=0.001)
    if weight_decay:
        reference = optax.adamw(schedule, 0.9, 0.999, weight_decay=weight_decay)
    else:
        reference = optax.adam(schedule, 0.9, 0.999)
    ours = optim.make_optimizer(oc)
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32)}
    state = optim.set_total_steps(ours.init(params), total)
    assert optim.total_steps_of(state) == total
    ref_state = reference.init(params)
    for _ in range(total + 1):
        grads = {"w": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32)}
        got, state = ours.update(grads, state, params)
        want, ref_state = reference.update(grads, ref_state, params)
        np.testing.assert_allclose(got["w"], want["w"], rtol=1e-5, atol=1e-9)
