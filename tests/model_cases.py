"""Tiny model configurations shared by the model tests (not collected: no test_ prefix)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rhhjax import models


def tiny(**overrides) -> models.ModelConfig:
    """A small HyperRHN (vocab 11, embedding 5, width 12, hyper 6, depth 3), with overrides."""
    base = dict(type="hyperrhn", vocab_size=11, embed_dim=5, hidden=12, hyper_hidden=6, depth=3)
    base.update(overrides)
    return models.ModelConfig(**base)


def init(config: models.ModelConfig, seed: int):
    """(model, params) of ``config`` initialised from ``seed``."""
    model = models.build_model(config)
    return model, models.init_params(model, jax.random.key(seed))


# --- a Mosaic GPU implementation's model against `scan` (tests/test_mosaic.py, test_persistent.py)

KERNEL_TOL = {"float32": 1e-5, "bfloat16": 3e-2}  # the kernels' references in their place
KERNEL_TOL_COMPILED = {"float32": 5e-3, "bfloat16": 3e-2}  # f32 operands run as TF32 in wgmma
KERNEL_CASES = {
    # (type, dtype, hidden, hyper_hidden, depth, dropout, batch, length, original_first_step)
    "hyperrhn-f32-dropout-odd": ("hyperrhn", "float32", 13, 7, 3, "gate", 5, 6, False),
    "rhn-f32-nodropout-odd": ("rhn", "float32", 70, 4, 2, "none", 3, 4, False),
    "hyperrhn-bf16-dropout-first-step": ("hyperrhn", "bfloat16", 12, 6, 2, "gate", 4, 5, True),
    "rhn-f32-depth1": ("rhn", "float32", 9, 4, 1, "gate", 2, 3, False),
}


def kernel_and_scan_configs(case: str, impl: str):
    """(ModelConfig with ``impl``, the same with impl="scan") of a KERNEL_CASES entry."""
    kind, dtype, hidden, hyper, depth, dropout, _, _, first = KERNEL_CASES[case]
    base = dict(
        type=kind, vocab_size=11, embed_dim=5, hidden=hidden, hyper_hidden=hyper,
        depth=depth, dropout=dropout, keep=0.7, dtype=dtype, original_first_step=first,
    )  # fmt: skip
    return models.ModelConfig(**base, impl=impl), models.ModelConfig(**base, impl="scan")


def loss_and_grads(model, params, tokens, key):
    """(mean next-character cross entropy, its gradient) of ``model`` on ``tokens`` [B, T+1]."""
    import optax

    def loss_fn(p):
        logits, _ = model.apply({"params": p}, tokens[:, :-1], train=True, rngs={"dropout": key})
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    return jax.jit(jax.value_and_grad(loss_fn))(params)


class KernelModelMatchesScan:
    """A Mosaic GPU implementation ``IMPL``'s model against the scan reference on fresh random
    inputs: loss, every parameter gradient, evaluation logits. INTERPRET: the kernels' pure-JAX
    references run in their place (a subclass per mode: the same tests run compiled on a GPU)."""

    IMPL: str
    INTERPRET: bool
    TOLERANCE: dict

    def model(self, config):
        model = models.build_model(config, platform="gpu")
        assert model.spec.impl == self.IMPL
        if self.INTERPRET:
            model = model.clone(spec=dataclasses.replace(model.spec, interpret=True))
        return model

    @pytest.mark.parametrize("case", list(KERNEL_CASES))
    def test_loss_and_gradients_match_scan(self, case):
        config, scan_config = kernel_and_scan_configs(case, self.IMPL)
        _, dtype, *_, batch, length, _ = KERNEL_CASES[case]
        scan = models.build_model(scan_config)
        seed = sum(map(ord, case + self.IMPL))
        params = models.init_params(scan, jax.random.key(seed))
        tokens = jnp.asarray(np.random.default_rng(seed).integers(0, 11, (batch, length + 1)))
        key = jax.random.key(seed + 1)
        actual = loss_and_grads(self.model(config), params, tokens, key)
        expected = loss_and_grads(scan, params, tokens, key)
        tol = self.TOLERANCE[dtype]
        leaves = jax.tree_util.tree_leaves_with_path(actual)
        for (path, a), e in zip(leaves, jax.tree.leaves(expected), strict=True):
            scale = float(jnp.max(jnp.abs(e))) or 1.0
            np.testing.assert_allclose(
                a, e, rtol=tol, atol=tol * scale, err_msg=jax.tree_util.keystr(path)
            )

    def test_evaluation_logits_match_scan(self):
        """Without differentiation (the forward kernels' no-save variant)."""
        config, scan_config = kernel_and_scan_configs("hyperrhn-f32-dropout-odd", self.IMPL)
        scan = models.build_model(scan_config)
        params = models.init_params(scan, jax.random.key(5))
        tokens = jnp.asarray(np.random.default_rng(5).integers(0, 11, (5, 6)))

        def logits(model):
            return jax.jit(lambda p: model.apply({"params": p}, tokens, train=False)[0])(params)

        tol = self.TOLERANCE["float32"]
        np.testing.assert_allclose(logits(self.model(config)), logits(scan), rtol=tol, atol=tol)
