"""The optimizer of every run: clipping (L1 as the paper code, or L2), then Adam, AdamW or SGD
with per-epoch decay; Adam's step size is constant or a warm-up and decay whose length lives in
the optimizer state. ``OptimizerConfig``: the part of ``config.train`` that defines it."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


def clip_by_l1_norm(max_norm: float) -> optax.GradientTransformation:
    """Scale updates to total L1 norm <= ``max_norm`` (the paper code's, eps 1e-6)."""

    def init_fn(params):
        del params
        return optax.EmptyState()

    def update_fn(updates, state, params=None):
        del params
        norm = l1_norm(updates)
        scale = jnp.minimum(1.0, max_norm / (norm + 1e-6))
        updates = jax.tree.map(lambda g: (g * scale).astype(g.dtype), updates)
        return updates, state

    return optax.GradientTransformation(init_fn, update_fn)


def l1_norm(tree) -> jax.Array:
    return sum(jnp.sum(jnp.abs(x.astype(jnp.float32))) for x in jax.tree.leaves(tree))


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """The hashable subset of ``config.train`` that defines the optimizer."""

    optimizer: str
    learning_rate: float
    b1: float
    b2: float
    weight_decay: float
    clip_norm: float
    clip_type: str
    lr_decay: float
    lr_decay_start_epoch: int
    batches_per_epoch: int
    schedule: str = "constant"  # constant | cosine | linear (warm-up, then decay)
    warmup_steps: int = 0
    final_lr_fraction: float = 0.1  # the floor, as a fraction of learning_rate

    @classmethod
    def from_config(cls, train: Any, batches_per_epoch: int) -> OptimizerConfig:
        decays = train.optimizer == "sgd" and float(train.lr_decay) != 1.0
        return cls(
            optimizer=str(train.optimizer),
            learning_rate=float(train.learning_rate),
            b1=float(train.b1),
            b2=float(train.b2),
            weight_decay=float(train.weight_decay),
            clip_norm=float(train.clip_norm),
            clip_type=str(train.clip_type),
            lr_decay=float(train.lr_decay),
            lr_decay_start_epoch=int(train.lr_decay_start_epoch),
            # only the SGD decay reads it: keep it out of the jit cache key otherwise
            batches_per_epoch=int(batches_per_epoch) if decays else 1,
            schedule=str(train.get("schedule", "constant")),
            warmup_steps=int(train.get("warmup_steps", 0)),
            final_lr_fraction=float(train.get("final_lr_fraction", 0.1)),
        )

    @property
    def scheduled(self) -> bool:
        return self.schedule != "constant"

    def learning_rate_at(self, step, total_steps=0):
        """SGD: ``lr / lr_decay ** max(epoch - start + 1, 0)``; Adam: constant or scheduled."""
        if self.scheduled:
            return scheduled_learning_rate(self, step, total_steps)
        if self.optimizer != "sgd" or self.lr_decay == 1.0:
            return self.learning_rate
        epoch = step // self.batches_per_epoch
        exponent = jnp.maximum(epoch - self.lr_decay_start_epoch + 1, 0)
        return self.learning_rate / jnp.power(self.lr_decay, exponent)


def scheduled_learning_rate(oc: OptimizerConfig, step, total_steps):
    """Step size of 0-based ``step``: linear warm-up, then cosine / linear down to
    ``final_lr_fraction * learning_rate`` at ``total_steps - 1``; 0 total steps: the peak."""
    step = jnp.asarray(step, jnp.float32)
    total = jnp.asarray(total_steps, jnp.float32)
    peak, floor = oc.learning_rate, oc.learning_rate * oc.final_lr_fraction
    warmup = float(oc.warmup_steps)
    rising = peak * step / max(warmup, 1.0)
    span = jnp.maximum(total - 1.0 - warmup, 1.0)
    done = jnp.clip((step - warmup) / span, 0.0, 1.0)
    if oc.schedule == "cosine":
        shape = 0.5 * (1.0 + jnp.cos(jnp.pi * done))
    else:
        shape = 1.0 - done
    falling = jnp.where(total > 0, floor + (peak - floor) * shape, peak)
    return jnp.where(step < warmup, rising, falling)


class ScheduleState(NamedTuple):
    count: jax.Array
    total_steps: jax.Array


def scale_by_schedule(oc: OptimizerConfig) -> optax.GradientTransformation:
    def init_fn(params):
        del params
        return ScheduleState(jnp.zeros([], jnp.int32), jnp.zeros([], jnp.int32))

    def update_fn(updates, state, params=None):
        del params
        lr = scheduled_learning_rate(oc, state.count, state.total_steps)
        updates = jax.tree.map(lambda u: (-lr * u).astype(u.dtype), updates)
        return updates, ScheduleState(state.count + 1, state.total_steps)

    return optax.GradientTransformation(init_fn, update_fn)


def set_total_steps(opt_state, total_steps: int):
    """``opt_state`` with the schedule's run length set to ``total_steps``."""

    def replace(node):
        if not isinstance(node, ScheduleState):
            return node
        old = node.total_steps
        new = jnp.asarray(total_steps, old.dtype)
        return node._replace(total_steps=jax.device_put(new, old.sharding))

    return jax.tree.map(replace, opt_state, is_leaf=lambda n: isinstance(n, ScheduleState))


def total_steps_of(opt_state) -> int:
    found = [
        int(n.total_steps)
        for n in jax.tree.leaves(opt_state, is_leaf=lambda n: isinstance(n, ScheduleState))
        if isinstance(n, ScheduleState)
    ]
    return found[0] if found else 0


def make_optimizer(oc: OptimizerConfig) -> optax.GradientTransformation:
    parts = []
    if oc.optimizer == "sgd" and oc.weight_decay > 0:
        # Zilly et al. add the L2 penalty to the loss: it is clipped with the gradient
        parts.append(optax.add_decayed_weights(oc.weight_decay))
    if oc.clip_norm > 0:
        if oc.clip_type == "l1":
            parts.append(clip_by_l1_norm(oc.clip_norm))
        else:
            parts.append(optax.clip_by_global_norm(oc.clip_norm))
    if oc.optimizer == "sgd":
        parts.append(optax.sgd(oc.learning_rate_at))
    elif oc.scheduled:
        parts.append(optax.scale_by_adam(oc.b1, oc.b2))
        if oc.weight_decay > 0:
            parts.append(optax.add_decayed_weights(oc.weight_decay))
        parts.append(scale_by_schedule(oc))
    elif oc.weight_decay > 0:
        parts.append(optax.adamw(oc.learning_rate, oc.b1, oc.b2, weight_decay=oc.weight_decay))
    else:
        parts.append(optax.adam(oc.learning_rate, oc.b1, oc.b2))
    return optax.chain(*parts)
