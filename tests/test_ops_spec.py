"""`rhhjax.ops.spec`: the one resolution of the implementation, `impl="auto"` per platform,
dtype and model, and the resolved model against the `scan` reference."""

import inspect
import logging

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rhhjax import models
from rhhjax.models import lm
from rhhjax.ops import spec


def _protocol_members() -> dict[str, inspect.Signature | None]:
    """The members of `spec.Implementation`: name -> its signature without ``self`` (None for
    a data attribute)."""
    members = {name: None for name in spec.Implementation.__annotations__}
    for name, value in vars(spec.Implementation).items():
        if inspect.isfunction(value) and not name.startswith("_"):
            parameters = list(inspect.signature(value).parameters.values())[1:]
            members[name] = inspect.Signature(parameters)
    return members


def _parameters(signature: inspect.Signature) -> list[tuple[str, object]]:
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


def test_every_registered_implementation_is_an_implementation():
    """Every member of the protocol, each function with the protocol's parameter names,
    kinds and defaults, in order."""
    members = _protocol_members()
    assert {"prepare_weights", "forward_loop", "backward_loop", "saved_rows"} <= set(members)
    for name, module in spec.IMPLEMENTATIONS.items():
        assert module.NAME == name
        missing = [member for member in members if not hasattr(module, member)]
        assert not missing, (name, missing)
        for member, signature in members.items():
            if signature is not None:
                found = inspect.signature(getattr(module, member))
                assert _parameters(found) == _parameters(signature), (name, member, found)
    assert spec.IMPLS == ("scan", "fused", "mosaic", "persistent")
    assert models.IMPLS == ("auto", "scan", "fused", "mosaic", "persistent")


def test_a_module_that_differs_from_the_protocol_is_found():
    """The check above can fail: a renamed parameter differs from the protocol's."""

    def backward_loop(spec, geo, w_t, bias, s0, xproj, z, keep, hidden, packed, g_states):
        del spec, geo, w_t, bias, s0, xproj, z, keep, hidden, packed, g_states

    expected = _protocol_members()["backward_loop"]
    assert _parameters(inspect.signature(backward_loop)) != _parameters(expected)


def test_refusals_are_one_line_and_name_the_alternative():
    assert spec.unsupported("fused", spec.ModelFacts("rhn", dropout="gate")) is None
    assert "use 'scan'" in spec.unsupported("fused", spec.ModelFacts("lstm"))
    stateful = spec.ModelFacts("hyperrhn", hyper_input="x_and_state")
    assert "hyper_input='x'" in spec.unsupported("fused", stateful)
    variational = spec.ModelFacts("rhn", dropout="variational")
    assert "use impl='fused'" in spec.unsupported("mosaic", variational)
    assert "hyper_rank=2" in spec.unsupported("mosaic", spec.ModelFacts("hyperrhn", hyper_rank=2))
    assert spec.unavailable("mosaic", "compiled", "cpu") is None
    assert spec.unavailable("mosaic", "auto", "gpu") is None
    off_gpu = spec.unavailable("mosaic", "auto", "cpu")
    assert "for a Hopper GPU" in off_gpu and "model.impl='fused' or 'scan'" in off_gpu
    assert "\n" not in off_gpu
    assert spec.unsupported("scan", spec.ModelFacts("lstm")) is None
    rank_d = spec.ModelFacts("hyperrhn", hyper_rank=2)
    assert spec.substitute("persistent", rank_d)[0] == "fused"
    assert spec.substitute("fused", rank_d) is None


def test_interpret_mode_is_refused_exactly_where_jax_lacks_it():
    from rhhjax.kernels.mosaic import interpret as gpu_interpret

    reason = spec.unavailable("mosaic", "interpret", "gpu")
    if gpu_interpret.available():
        assert reason is None
    else:
        assert "needs jax >= 0.11.2" in reason and "\n" not in reason


@pytest.mark.parametrize(
    ("platform", "facts", "expected"),
    [
        ("gpu", spec.ModelFacts("hyperrhn", dropout="gate"), "fused"),
        ("gpu", spec.ModelFacts("rhn", dropout="none"), "fused"),
        ("gpu", spec.ModelFacts("hyperrhn", dropout="variational"), "fused"),
        ("gpu", spec.ModelFacts("hyperrhn", hyper_rank=4), "fused"),
        ("gpu", spec.ModelFacts("lstm"), "scan"),  # only scan runs an LSTM
        ("gpu", spec.ModelFacts("hyperrhn", hyper_input="x_and_state"), "scan"),
        ("cpu", spec.ModelFacts("hyperrhn", dropout="gate"), "scan"),
        ("cpu", spec.ModelFacts("rhn", dropout="variational"), "scan"),
        ("tpu", spec.ModelFacts("hyperrhn"), "scan"),  # nothing measured: the reference
    ],
)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_auto_picks_the_fastest_measured_implementation_that_runs_the_model(
    platform, facts, expected, dtype
):
    resolved = spec.resolve("auto", facts, dtype=dtype, platform=platform)
    assert resolved.impl == expected
    assert resolved.dtype == jnp.dtype(dtype) and not resolved.interpret
    assert resolved.reason and "\n" not in resolved.reason
    if platform in ("gpu", "cpu"):  # the reason cites the measurement it rests on
        assert "results/bench_" in resolved.reason


def test_auto_reads_the_backend_when_no_platform_is_given(monkeypatch):
    config = models.ModelConfig(hidden=8, hyper_hidden=4, depth=2)
    assert config.impl == "auto"  # the default
    monkeypatch.setattr(spec.jax, "default_backend", lambda: "gpu")
    assert models.build_model(config).spec.impl == "fused"
    monkeypatch.setattr(spec.jax, "default_backend", lambda: "cpu")
    assert models.build_model(config).spec.impl == "scan"


def test_explicit_impl_is_kept_or_refused_in_one_line():
    facts = spec.ModelFacts("hyperrhn", dropout="variational")
    assert spec.resolve("fused", facts, dtype="float32", platform="cpu").impl == "fused"
    with pytest.raises(spec.UnsupportedImpl, match="variational") as error:
        spec.resolve("mosaic", facts, dtype="float32", platform="gpu")
    assert "\n" not in str(error.value)
    with pytest.raises(spec.UnsupportedImpl, match="not one of auto, scan, fused, mosaic"):
        spec.check("cuda", facts)
    with pytest.raises(spec.UnsupportedImpl, match="pallas_mode"):
        spec.resolve("mosaic", spec.ModelFacts("rhn"), dtype="float32", pallas_mode="fast")


def test_the_retired_pallas_impl_is_refused_in_one_line_naming_what_replaces_it():
    """`impl="pallas"` (Pallas Triton, removed) is refused before anything is built, in one
    line naming the implementations that remain for a GPU; the model config says the same."""
    facts = spec.ModelFacts("rhn")
    with pytest.raises(spec.UnsupportedImpl) as error:
        spec.resolve("pallas", facts, dtype="float32", platform="gpu")
    line = str(error.value)
    assert "\n" not in line and line.startswith("model.impl='pallas' (Pallas Triton) was retired")
    for name in ("mosaic", "persistent", "fused"):
        assert f"'{name}'" in line and name in spec.IMPLEMENTATIONS
    assert "pallas" not in spec.CHOICES and spec.retired("fused") is None
    with pytest.raises(models.ConfigError) as config_error:
        models.ModelConfig.from_config({"impl": "pallas"})
    assert str(config_error.value) == line


def test_build_logs_the_choice_once_per_distinct_choice(caplog):
    lm._log_choice.cache_clear()
    config = models.ModelConfig(hidden=8, hyper_hidden=4, depth=2)
    with caplog.at_level(logging.INFO, logger="absl"):
        for _ in range(3):
            models.build_model(config, platform="gpu")
        models.build_model(config, platform="cpu")
    lines = [r.getMessage() for r in caplog.records if "model.impl=auto" in r.getMessage()]
    assert len(lines) == 2, lines
    assert lines[0].startswith("model.impl=auto runs fused: ") and "bench_gpu_h100" in lines[0]
    assert lines[1].startswith("model.impl=auto runs scan: ") and "bench_cpu" in lines[1]


def _loss_and_grads(model, params, tokens, key):
    def loss_fn(p):
        logits, _ = model.apply({"params": p}, tokens[:, :-1], train=True, rngs={"dropout": key})
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    return jax.jit(jax.value_and_grad(loss_fn))(params)


@pytest.mark.parametrize("model_type", ["rhn", "hyperrhn"])
def test_auto_on_a_gpu_matches_scan_values_and_gradients(model_type):
    """What `auto` resolves to on a GPU (fused) computes what the scan reference does."""
    config = models.ModelConfig(
        type=model_type, vocab_size=11, embed_dim=5, hidden=12, hyper_hidden=6, depth=2, keep=0.7
    )
    auto = models.build_model(config, platform="gpu")
    assert auto.spec.impl == "fused"
    scan = models.build_model(models.ModelConfig(**{**config.__dict__, "impl": "scan"}))
    params = models.init_params(scan, jax.random.key(3))
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, 11, (4, 7)))
    key = jax.random.key(4)
    actual = _loss_and_grads(auto, params, tokens, key)
    expected = _loss_and_grads(scan, params, tokens, key)
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(a, e, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("impl", list(spec.IMPLEMENTATIONS))
def test_a_rank_d_model_resolves_to_fused_or_is_refused(impl):
    """The rank-d op (`lowrank.lowrank_sequence`, the second entry point) runs under `fused`
    only: every other implementation refuses a rank-d model or names `fused` instead."""
    facts = spec.ModelFacts("hyperrhn", hyper_rank=2)
    try:
        # "compiled": lowered for a GPU anywhere, so no implementation is refused for the host
        resolved = spec.resolve(impl, facts, dtype="float32", pallas_mode="compiled")
    except spec.UnsupportedImpl as refusal:
        assert "hyper_rank=2" in str(refusal) and "'fused'" in str(refusal)
        return
    assert resolved.impl == "fused"
