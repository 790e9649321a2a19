"""Tiny model configurations shared by the model tests (not collected: no test_ prefix)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_cases import MosaicGpuMode
from rhhjax.kernels.mosaic import interpret as gpu_interpret

from rhhjax import models
from rhhjax.ops import spec


def tiny(**overrides) -> models.ModelConfig:
    """A small HyperRHN (vocab 11, embedding 5, width 12, hyper 6, depth 3), with overrides."""
    base = dict(type="hyperrhn", vocab_size=11, embed_dim=5, hidden=12, hyper_hidden=6, depth=3)
    base.update(overrides)
    return models.ModelConfig(**base)


def init(config: models.ModelConfig, seed: int):
    """(model, params) of ``config`` initialised from ``seed``."""
    model = models.build_model(config)
    return model, models.init_params(model, jax.random.key(seed))


# --- the Mosaic GPU implementations' refusals (tests/test_ops_mosaic.py, test_ops_persistent.py)


def assert_off_gpu_refusal_advises_what_runs(impl: str, platform: str):
    """`impl` off a GPU (pallas_mode "auto") is one line whose advice runs with this jax:
    GPU interpret mode where jax has it (else the jax it needs), or `fused`; never the
    lowering-only "compiled"."""
    facts = spec.ModelFacts("hyperrhn", dropout="gate")
    with pytest.raises(spec.UnsupportedImpl) as error:
        spec.resolve(impl, facts, dtype="float32", platform=platform)
    line = str(error.value)
    assert "\n" not in line and f"the platform is {platform}" in line, line
    assert "compiled" not in line and "impl='fused'" in line, line
    assert spec.resolve("fused", facts, dtype="float32", platform=platform).impl == "fused"
    if gpu_interpret.available():
        assert "model.pallas_mode='interpret'" in line, line
        resolved = spec.resolve(
            impl, facts, dtype="float32", pallas_mode="interpret", platform=platform
        )
        assert resolved.impl == impl and resolved.interpret and not resolved.references
    else:
        assert f"needs jax >= {gpu_interpret.MIN_JAX}" in line, line


def assert_interpret_mode_runs_or_names_the_jax(impl: str):
    """pallas_mode "interpret" resolves to GPU interpret mode on any platform where jax has
    it, else one line naming the jax it needs."""
    for platform in ("cpu", "gpu"):
        if gpu_interpret.available():
            resolved = spec.resolve(
                impl, spec.ModelFacts("rhn"), dtype="bfloat16", pallas_mode="interpret",
                platform=platform,
            )  # fmt: skip
            assert resolved.interpret and not resolved.references
            continue
        with pytest.raises(spec.UnsupportedImpl, match=gpu_interpret.MIN_JAX) as error:
            spec.resolve(impl, spec.ModelFacts("rhn"), dtype="bfloat16",
                         pallas_mode="interpret", platform=platform)  # fmt: skip
        assert "\n" not in str(error.value) and "pip install" in str(error.value)


def assert_compiled_off_a_gpu_lowers_but_does_not_execute(impl: str):
    """pallas_mode "compiled" resolves anywhere (the deviceless compile report lowers with
    it); a program that will execute the model (`sequence_spec(execute=True)`, the trainer)
    refuses it off a GPU in one line whose advice runs."""
    config = models.ModelConfig(hidden=8, hyper_hidden=4, depth=2, impl=impl,
                                pallas_mode="compiled")  # fmt: skip
    assert not models.sequence_spec(config, platform="cpu").interpret
    models.sequence_spec(config, platform="gpu", execute=True)
    with pytest.raises(spec.UnsupportedImpl, match="only lowers") as error:
        models.sequence_spec(config, platform="cpu", execute=True)
    line = str(error.value)
    assert "\n" not in line and "impl='fused'" in line, line
    if gpu_interpret.available():
        assert "model.pallas_mode='interpret'" in line
        interpreted = models.ModelConfig(hidden=8, hyper_hidden=4, depth=2, impl=impl,
                                         pallas_mode="interpret")  # fmt: skip
        assert models.sequence_spec(interpreted, platform="cpu", execute=True).interpret


# --- a Mosaic GPU implementation's model against `scan` (test_ops_mosaic, test_ops_persistent)

KERNEL_TOL = {"float32": 1e-5, "bfloat16": 3e-2}  # references in place, or interpreted
KERNEL_TOL_COMPILED = {"float32": 5e-3, "bfloat16": 3e-2}  # f32 operands run as TF32 in wgmma
KERNEL_CASES = {
    # (type, dtype, hidden, hyper_hidden, depth, dropout, batch, length, original_first_step)
    "hyperrhn-f32-dropout-odd": ("hyperrhn", "float32", 13, 7, 3, "gate", 5, 6, False),
    "rhn-f32-nodropout-odd": ("rhn", "float32", 70, 4, 2, "none", 3, 4, False),
    "hyperrhn-bf16-dropout-first-step": ("hyperrhn", "bfloat16", 12, 6, 2, "gate", 4, 5, True),
    "rhn-f32-depth1": ("rhn", "float32", 9, 4, 1, "gate", 2, 3, False),
    # 2 row blocks of 64 (a cluster of them): run by the classes that need one only
    "hyperrhn-f32-two-row-blocks": ("hyperrhn", "float32", 13, 7, 2, "gate", 70, 3, False),
}
TWO_ROW_BLOCKS = ("hyperrhn-f32-two-row-blocks",)


def kernel_and_scan_configs(case: str, impl: str, **overrides):
    """(ModelConfig with ``impl`` and ``overrides``, the same with impl="scan") of a
    KERNEL_CASES entry."""
    kind, dtype, hidden, hyper, depth, dropout, _, _, first = KERNEL_CASES[case]
    base = dict(
        type=kind, vocab_size=11, embed_dim=5, hidden=hidden, hyper_hidden=hyper,
        depth=depth, dropout=dropout, keep=0.7, dtype=dtype, original_first_step=first,
    )  # fmt: skip
    kernel = models.ModelConfig(**base, impl=impl, **overrides)
    return kernel, models.ModelConfig(**base, impl="scan")


def loss_and_grads(model, params, tokens, key):
    """(mean next-character cross entropy, its gradient) of ``model`` on ``tokens`` [B, T+1]."""
    import optax

    def loss_fn(p):
        logits, _ = model.apply({"params": p}, tokens[:, :-1], train=True, rngs={"dropout": key})
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    return jax.jit(jax.value_and_grad(loss_fn))(params)


def assert_trees_close(actual, expected, tol: float) -> None:
    """Every leaf of ``actual`` within ``tol`` of ``expected``'s, relative and scaled by the
    largest entry of the expected leaf (gradients of very different sizes), named on failure."""
    leaves = jax.tree_util.tree_leaves_with_path(actual)
    for (path, a), e in zip(leaves, jax.tree.leaves(expected), strict=True):
        scale = float(jnp.max(jnp.abs(e))) or 1.0
        np.testing.assert_allclose(
            a, e, rtol=tol, atol=tol * scale, err_msg=jax.tree_util.keystr(path)
        )


class KernelModelMatchesScan(MosaicGpuMode):
    """A Mosaic GPU implementation ``IMPL``'s model against the scan reference on fresh random
    inputs: loss, every parameter gradient, evaluation logits. One class, a subclass per mode
    (`kernel_cases.MosaicGpuMode`): compiled on a GPU, INTERPRET (the kernels executed in GPU
    interpret mode on a CPU, race detector on, through ``model.pallas_mode="interpret"``),
    and REFERENCES (the kernels' pure-JAX references in their place, under any jax)."""

    IMPL: str
    TOLERANCE: dict
    CASES = {"model_case": [c for c in KERNEL_CASES if c not in TWO_ROW_BLOCKS]}

    def model(self, config):
        if self.INTERPRET:
            model = models.build_model(dataclasses.replace(config, pallas_mode="interpret"))
            assert model.spec.interpret and not model.spec.references
        else:
            model = models.build_model(config, platform="gpu")
        assert model.spec.impl == self.IMPL
        if self.REFERENCES:
            model = model.clone(spec=dataclasses.replace(model.spec, references=True))
        return model

    def test_loss_and_gradients_match_scan(self, model_case):
        self.check_loss_and_gradients(model_case)

    def check_loss_and_gradients(self, case: str, **overrides):
        """The KERNEL_CASES ``case`` at ``IMPL`` (and the model config's ``overrides``)."""
        config, scan_config = kernel_and_scan_configs(case, self.IMPL, **overrides)
        _, dtype, *_, batch, length, _ = KERNEL_CASES[case]
        scan = models.build_model(scan_config)
        seed = sum(map(ord, case + self.IMPL))
        params = models.init_params(scan, jax.random.key(seed))
        tokens = jnp.asarray(np.random.default_rng(seed).integers(0, 11, (batch, length + 1)))
        key = jax.random.key(seed + 1)
        actual = loss_and_grads(self.model(config), params, tokens, key)
        expected = loss_and_grads(scan, params, tokens, key)
        assert_trees_close(actual, expected, self.TOLERANCE[dtype])

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
