"""The optimizer of every run: clipping (the paper code's L1 norm, or global L2) then Adam,
AdamW or SGD with the RHN paper's per-epoch decay. ``OptimizerConfig`` is the hashable part of
``config.train`` that defines it."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax


def clip_by_l1_norm(max_norm: float) -> optax.GradientTransformation:
    """Scale updates so that their total L1 norm is at most ``max_norm``.

    The paper code's ``torch.nn.utils.clip_grad_norm(params, max_norm, norm_type=1)``:
    ``g *= max_norm / (||g||_1 + 1e-6)`` when that factor is < 1.
    """

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
        )

    def learning_rate_at(self, step):
        """SGD: ``lr / lr_decay ** max(epoch - start + 1, 0)`` with the 0-based epoch of the
        step (Zilly et al.'s schedule: with start 5 the sixth epoch is the first decayed);
        Adam: constant."""
        if self.optimizer != "sgd" or self.lr_decay == 1.0:
            return self.learning_rate
        epoch = step // self.batches_per_epoch
        exponent = jnp.maximum(epoch - self.lr_decay_start_epoch + 1, 0)
        return self.learning_rate / jnp.power(self.lr_decay, exponent)


def make_optimizer(oc: OptimizerConfig) -> optax.GradientTransformation:
    """Clipping (L1 or L2, skipped when clip_norm is 0) followed by Adam / AdamW / SGD."""
    parts = []
    if oc.optimizer == "sgd" and oc.weight_decay > 0:
        # Zilly et al. add the L2 penalty to the loss, so it is clipped with the gradient.
        parts.append(optax.add_decayed_weights(oc.weight_decay))
    if oc.clip_norm > 0:
        if oc.clip_type == "l1":
            parts.append(clip_by_l1_norm(oc.clip_norm))
        else:
            parts.append(optax.clip_by_global_norm(oc.clip_norm))
    if oc.optimizer == "sgd":
        parts.append(optax.sgd(oc.learning_rate_at))
    elif oc.weight_decay > 0:
        parts.append(optax.adamw(oc.learning_rate, oc.b1, oc.b2, weight_decay=oc.weight_decay))
    else:
        parts.append(optax.adam(oc.learning_rate, oc.b1, oc.b2))
    return optax.chain(*parts)
