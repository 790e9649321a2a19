"""`fused` and `pallas` recurrences against the `scan` reference: values and gradients."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import assert_trees_close as _assert_trees_close
from rhhjax.kernels import triton

from rhhjax import models

# Tolerances per matmul dtype: f32 paths differ only in summation order; bf16 rounds the
# matmul inputs identically in all implementations but the backward of `scan` (autodiff)
# and of the custom VJP round different intermediates to bf16.
TOLERANCE = {"float32": 2e-5, "bfloat16": 3e-2}


def _config(**overrides):
    base = dict(
        type="hyperrhn", vocab_size=13, embed_dim=6, hidden=20, hyper_hidden=7, depth=3, keep=0.6,
        impl="scan",  # the reference
    )  # fmt: skip
    base.update(overrides)
    return models.ModelConfig(**base)


@functools.cache
def _value_and_grad_fn(config):
    model = models.build_model(config)

    def loss_fn(p, tokens, key):
        logits, carry = model.apply(
            {"params": p}, tokens[:, :-1], train=True, rngs={"dropout": key}
        )
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
        # Touch the final carry so its gradient path is checked too.
        return loss + 0.01 * sum(jnp.sum(c) for c in jax.tree_util.tree_leaves(carry))

    return jax.jit(jax.value_and_grad(loss_fn))


def _loss_and_grads(config, params, tokens, key):
    return _value_and_grad_fn(config)(params, tokens, key)


def _fresh_case(config, seed, batch=5, length=9):
    rng = np.random.default_rng(seed)
    model = models.build_model(config)
    params = models.init_params(model, jax.random.key(seed))
    tokens = jnp.asarray(rng.integers(0, config.vocab_size, (batch, length)))
    return params, tokens, jax.random.key(seed + 1)


CASES = [
    # (type, depth, hidden, dropout)
    ("rhn", 1, 20, "gate"),
    ("rhn", 3, 33, "none"),
    ("hyperrhn", 2, 20, "gate"),
    ("hyperrhn", 4, 17, "gate"),
    ("hyperrhn", 3, 20, "none"),
]


@pytest.mark.parametrize("impl", ["fused", "pallas"])
@pytest.mark.parametrize(("model_type", "depth", "hidden", "dropout"), CASES)
def test_impl_matches_scan_values_and_gradients(impl, model_type, depth, hidden, dropout):
    config = _config(type=model_type, depth=depth, hidden=hidden, dropout=dropout)
    seed = depth * 31 + hidden
    params, tokens, key = _fresh_case(config, seed)
    expected = _loss_and_grads(config, params, tokens, key)
    actual = _loss_and_grads(
        config.__class__(**{**config.__dict__, "impl": impl}), params, tokens, key
    )
    _assert_trees_close(actual, expected, TOLERANCE["float32"])


@pytest.mark.parametrize(
    ("impl", "model_type", "dtype"),
    [
        ("fused", "rhn", "float32"),
        ("fused", "hyperrhn", "float32"),
        ("pallas", "rhn", "float32"),
        ("pallas", "hyperrhn", "float32"),
        ("fused", "hyperrhn", "bfloat16"),
    ],
)
def test_original_first_step_matches_scan_values_and_gradients(impl, model_type, dtype):
    """`original_first_step`: the op runs steps 1..T-1 after a pure-JAX step 0, with the same
    dropout masks per step as `scan` (gate dropout on)."""
    config = _config(type=model_type, dtype=dtype, original_first_step=True)
    params, tokens, key = _fresh_case(config, 123 + len(model_type))
    expected = _loss_and_grads(config, params, tokens, key)
    actual = _loss_and_grads(
        models.ModelConfig(**{**config.__dict__, "impl": impl}), params, tokens, key
    )
    _assert_trees_close(actual, expected, TOLERANCE[dtype])
    default = _loss_and_grads(_config(type=model_type, dtype=dtype), params, tokens, key)
    assert abs(float(default[0]) - float(expected[0])) > 1e-6, "the option changed nothing"


@pytest.mark.parametrize("model_type", ["rhn", "hyperrhn"])
def test_fused_matches_scan_with_variational_dropout(model_type):
    config = _config(type=model_type, dropout="variational", keep_hidden=0.7, keep_input=0.8)
    params, tokens, key = _fresh_case(config, 77)
    expected = _loss_and_grads(config, params, tokens, key)
    fused = models.ModelConfig(**{**config.__dict__, "impl": "fused"})
    _assert_trees_close(_loss_and_grads(fused, params, tokens, key), expected, 2e-5)


@pytest.mark.parametrize("impl", ["fused", "pallas"])
def test_bfloat16_matches_scan_within_documented_tolerance(impl):
    config = _config(dtype="bfloat16")
    params, tokens, key = _fresh_case(config, 5)
    expected = _loss_and_grads(config, params, tokens, key)
    actual = _loss_and_grads(
        models.ModelConfig(**{**config.__dict__, "impl": impl}), params, tokens, key
    )
    _assert_trees_close(actual, expected, TOLERANCE["bfloat16"])
    # And bf16 stays near the f32 model (same params), i.e. it is not garbage.
    f32 = _loss_and_grads(_config(), params, tokens, key)
    np.testing.assert_allclose(actual[0], f32[0], rtol=2e-2)


@pytest.mark.parametrize("impl", ["fused", "pallas"])
def test_whole_train_step_matches_scan(impl):
    config = _config()
    params, tokens, key = _fresh_case(config, 9)
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))

    def run(cfg):
        p, state = params, optimizer.init(params)
        for step in range(3):
            loss, grads = _loss_and_grads(cfg, p, tokens, jax.random.fold_in(key, step))
            updates, state = optimizer.update(grads, state, p)
            p = optax.apply_updates(p, updates)
        return loss, p

    expected = run(config)
    actual = run(models.ModelConfig(**{**config.__dict__, "impl": impl}))
    _assert_trees_close(actual, expected, 1e-4)


def test_one_checkpoint_runs_on_every_impl():
    config = _config()
    params, tokens, _ = _fresh_case(config, 3)
    logits = {}
    for impl in ("scan", "fused", "pallas"):
        model = models.build_model(models.ModelConfig(**{**config.__dict__, "impl": impl}))
        assert jax.tree_util.tree_structure(
            models.init_params(model, jax.random.key(0))
        ) == jax.tree_util.tree_structure(params)
        logits[impl], _ = model.apply({"params": params}, tokens)
    np.testing.assert_allclose(logits["fused"], logits["scan"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logits["pallas"], logits["scan"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"impl": "fused", "hyper_input": "x_and_state"}, "hyper_input"),
        ({"impl": "pallas", "dropout": "variational"}, "variational"),
        ({"impl": "fused", "type": "lstm"}, "lstm"),
    ],
)
def test_unsupported_impl_combinations_are_config_errors(overrides, message):
    with pytest.raises(models.ConfigError, match=message):
        _config(**overrides).validate()


TRITON_CALL_TARGETS = ("__gpu$xla.gpu.triton", "triton_kernel_call")


@pytest.mark.parametrize("model_type", ["rhn", "hyperrhn"])
def test_pallas_train_step_lowers_for_cuda_with_triton_calls(model_type):
    config = _config(
        type=model_type, impl="pallas", pallas_mode="compiled", hidden=1000, hyper_hidden=128,
        depth=2,
    )  # fmt: skip
    config = models.ModelConfig(**{**config.__dict__, "vocab_size": 50, "embed_dim": 27})
    model = models.build_model(config)
    optimizer = optax.adam(1e-3)
    params = jax.eval_shape(lambda: models.init_params(model, jax.random.key(0)))
    opt_state = jax.eval_shape(optimizer.init, params)
    tokens = jax.ShapeDtypeStruct((256, 11), jnp.int32)

    def train_step(p, state, tokens, key):
        def loss_fn(p):
            logits, _ = model.apply(
                {"params": p}, tokens[:, :-1], train=True, rngs={"dropout": key}
            )
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(p)
        updates, state = optimizer.update(grads, state, p)
        return optax.apply_updates(p, updates), state, loss

    key = jax.eval_shape(lambda: jax.random.key(0))
    with triton.cuda_lowering_device():
        lowered = (
            jax.jit(train_step)
            .trace(params, opt_state, tokens, key)
            .lower(lowering_platforms=("cuda",))
        )
    text = lowered.as_text()
    found = [t for t in TRITON_CALL_TARGETS if t in text]
    assert found, "no Triton custom call in the lowered train step"
    # One forward and one fused backward kernel per micro-layer (hyper and main cells). (The
    # initial state's gradient kernel is dead code here: jax >= 0.12 drops it before lowering.)
    cells = 2 if model_type == "hyperrhn" else 1
    assert text.count('name = "highway_forward_stacked"') == config.depth * cells
    assert text.count('name = "highway_backward_fused_stacked"') == config.depth * cells


def _time_loops(jaxpr, length):
    """The bodies of the time loops inside `jaxpr`, not inside kernels: scans of `length`
    steps and while loops (the pallas backward counts its step index down)."""
    bodies = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            continue
        for key, param in eqn.params.items():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if isinstance(inner, jax.extend.core.Jaxpr):
                    scan = eqn.primitive.name == "scan" and eqn.params["length"] == length
                    if scan or (eqn.primitive.name == "while" and key == "body_jaxpr"):
                        bodies.append(inner)
                    bodies += _time_loops(inner, length)
    return bodies


def _equations(jaxpr):
    """The equations of `jaxpr` and of its sub-jaxprs (jit, custom_vjp, ...), not looking
    inside kernels or nested scans."""
    for eqn in jaxpr.eqns:
        yield eqn
        if eqn.primitive.name in ("scan", "pallas_call"):
            continue
        for param in eqn.params.values():
            inner = getattr(param, "jaxpr", param)
            if isinstance(inner, jax.extend.core.Jaxpr):
                yield from _equations(inner)


@pytest.mark.parametrize("impl", ["fused", "pallas"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_time_loops_hold_no_weight_preparation_and_one_kernel_per_micro_layer(impl, dtype):
    """Inside every time loop of a training gradient: no pad, no transpose, no dtype cast of a
    weight-sized array (two dims >= n); with pallas exactly one kernel per micro-layer and
    step, forward and backward, hyper and main."""
    depth, hidden = 3, 24
    config = _config(impl=impl, dtype=dtype, depth=depth, hidden=hidden, hyper_hidden=hidden)
    params, tokens, key = _fresh_case(config, 2)
    model = models.build_model(config)

    def loss(p):
        logits, _ = model.apply({"params": p}, tokens[:, :-1], train=True, rngs={"dropout": key})
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    bodies = _time_loops(jax.make_jaxpr(jax.grad(loss))(params).jaxpr, tokens.shape[1] - 1)
    assert len(bodies) == 4  # hyper and main, forward and backward.
    for body in bodies:
        equations = list(_equations(body))
        for eqn in equations:
            assert eqn.primitive.name not in ("pad", "transpose"), eqn
            if eqn.primitive.name == "convert_element_type":
                shape = eqn.invars[0].aval.shape
                assert sum(d >= hidden for d in shape) < 2, eqn
        names = [e.primitive.name for e in equations]
        if impl == "pallas":
            assert names.count("pallas_call") == depth
        else:
            # The walk reached the step's matmuls (a walk that finds nothing checks nothing).
            assert "dot_general" in names, names


def _ptb_model_block():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "configs" / "ptb.py"
    spec = importlib.util.spec_from_file_location("ptb_config_for_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config().model


def test_config_kernel_block_reaches_the_spec():
    """A kernel block set in the config (not the defaults) is the one the pallas op runs."""
    block = _ptb_model_block()
    block.kernel.block_k = 128
    block.kernel.num_stages = 2
    mc = models.ModelConfig.from_config(block, impl="pallas")
    spec = models.sequence_spec(mc)
    expected = triton.HighwayConfig(block_k=128, num_stages=2)
    assert expected != triton.HighwayConfig()
    assert spec.kernel == expected and spec.impl == "pallas"


ON_GPU = jax.default_backend() == "gpu"


@pytest.mark.parametrize(
    ("mode", "interpret"), [("interpret", True), ("compiled", False), ("auto", not ON_GPU)]
)
def test_pallas_mode_decides_interpretation_auto_compiles_on_a_gpu_only(mode, interpret):
    mc = _config(impl="pallas", pallas_mode=mode)
    assert models.sequence_spec(mc).interpret is interpret
    # fused never interprets anything.
    fused = models.ModelConfig(**{**mc.__dict__, "impl": "fused"})
    assert models.sequence_spec(fused).interpret is False


@pytest.mark.parametrize(
    ("kernel", "message"),
    [
        ({"block_b": 48}, "power of two"),
        ({"blok_b": 64}, "no field 'blok_b'"),
        ({"block_b": 128, "block_n": 128, "block_k": 64, "num_stages": 4}, "shared memory"),
    ],
)
def test_bad_kernel_blocks_are_one_line_config_errors(kernel, message):
    block = dict(_ptb_model_block().items())
    block["kernel"] = {**dict(block["kernel"].items()), **kernel}
    with pytest.raises(models.ConfigError, match=message) as error:
        models.ModelConfig.from_config(block)
    assert "\n" not in str(error.value)
