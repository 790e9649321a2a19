"""The whole-sequence op (`rhhjax.ops.recurrence.highway_sequence`) through every
implementation it runs, against the `scan` reference: values and gradients, the first-step
option, bfloat16, whole training steps, one checkpoint for all, and time loops that hold
nothing but the step's work."""

import jax
import numpy as np
import optax
import pytest
from helpers import assert_trees_close as _assert_trees_close
from ops_cases import TOLERANCE, fresh_case, loss_and_grads
from ops_cases import config as _config

from rhhjax import models

CASES = [
    # (type, depth, hidden, dropout)
    ("rhn", 1, 20, "gate"),
    ("rhn", 3, 33, "none"),
    ("hyperrhn", 2, 20, "gate"),
    ("hyperrhn", 4, 17, "gate"),
    ("hyperrhn", 3, 20, "none"),
]


@pytest.mark.parametrize("impl", ["fused"])
@pytest.mark.parametrize(("model_type", "depth", "hidden", "dropout"), CASES)
def test_impl_matches_scan_values_and_gradients(impl, model_type, depth, hidden, dropout):
    config = _config(type=model_type, depth=depth, hidden=hidden, dropout=dropout)
    seed = depth * 31 + hidden
    params, tokens, key = fresh_case(config, seed)
    expected = loss_and_grads(config, params, tokens, key)
    actual = loss_and_grads(
        config.__class__(**{**config.__dict__, "impl": impl}), params, tokens, key
    )
    _assert_trees_close(actual, expected, TOLERANCE["float32"])


@pytest.mark.parametrize(
    ("impl", "model_type", "dtype"),
    [
        ("fused", "rhn", "float32"),
        ("fused", "hyperrhn", "float32"),
        ("fused", "hyperrhn", "bfloat16"),
    ],
)
def test_original_first_step_matches_scan_values_and_gradients(impl, model_type, dtype):
    """`original_first_step`: the op runs steps 1..T-1 after a pure-JAX step 0, with the same
    dropout masks per step as `scan` (gate dropout on)."""
    config = _config(type=model_type, dtype=dtype, original_first_step=True)
    params, tokens, key = fresh_case(config, 123 + len(model_type))
    expected = loss_and_grads(config, params, tokens, key)
    actual = loss_and_grads(
        models.ModelConfig(**{**config.__dict__, "impl": impl}), params, tokens, key
    )
    _assert_trees_close(actual, expected, TOLERANCE[dtype])
    default = loss_and_grads(_config(type=model_type, dtype=dtype), params, tokens, key)
    assert abs(float(default[0]) - float(expected[0])) > 1e-6, "the option changed nothing"


@pytest.mark.parametrize("impl", ["fused"])
def test_bfloat16_matches_scan_within_documented_tolerance(impl):
    config = _config(dtype="bfloat16")
    params, tokens, key = fresh_case(config, 5)
    expected = loss_and_grads(config, params, tokens, key)
    actual = loss_and_grads(
        models.ModelConfig(**{**config.__dict__, "impl": impl}), params, tokens, key
    )
    _assert_trees_close(actual, expected, TOLERANCE["bfloat16"])
    # And bf16 stays near the f32 model (same params), i.e. it is not garbage.
    f32 = loss_and_grads(_config(), params, tokens, key)
    np.testing.assert_allclose(actual[0], f32[0], rtol=2e-2)


@pytest.mark.parametrize("impl", ["fused"])
def test_whole_train_step_matches_scan(impl):
    config = _config()
    params, tokens, key = fresh_case(config, 9)
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))

    def run(cfg):
        p, state = params, optimizer.init(params)
        for step in range(3):
            loss, grads = loss_and_grads(cfg, p, tokens, jax.random.fold_in(key, step))
            updates, state = optimizer.update(grads, state, p)
            p = optax.apply_updates(p, updates)
        return loss, p

    expected = run(config)
    actual = run(models.ModelConfig(**{**config.__dict__, "impl": impl}))
    _assert_trees_close(actual, expected, 1e-4)


def test_one_checkpoint_runs_on_every_impl():
    config = _config()
    params, tokens, _ = fresh_case(config, 3)
    logits = {}
    for impl in ("scan", "fused"):
        model = models.build_model(models.ModelConfig(**{**config.__dict__, "impl": impl}))
        assert jax.tree_util.tree_structure(
            models.init_params(model, jax.random.key(0))
        ) == jax.tree_util.tree_structure(params)
        logits[impl], _ = model.apply({"params": params}, tokens)
    np.testing.assert_allclose(logits["fused"], logits["scan"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"impl": "fused", "hyper_input": "x_and_state"}, "hyper_input"),
        ({"impl": "mosaic", "dropout": "variational"}, "variational"),
        ({"impl": "fused", "type": "lstm"}, "lstm"),
    ],
)
def test_unsupported_impl_combinations_are_config_errors(overrides, message):
    with pytest.raises(models.ConfigError, match=message):
        _config(**overrides).validate()


def _time_loops(jaxpr, length):
    """The bodies of the time loops inside `jaxpr`, not inside kernels: scans of `length`
    steps and while loops (a backward may count its step index down)."""
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


@pytest.mark.parametrize("impl", ["fused"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_time_loops_hold_no_weight_preparation(impl, dtype):
    """Inside every time loop of a training gradient: no pad, no transpose, no dtype cast of a
    weight-sized array (two dims >= n), and the step's matmuls."""
    depth, hidden = 3, 24
    config = _config(impl=impl, dtype=dtype, depth=depth, hidden=hidden, hyper_hidden=hidden)
    params, tokens, key = fresh_case(config, 2)
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
        # The walk reached the step's matmuls (a walk that finds nothing checks nothing).
        assert "dot_general" in names, names


@pytest.mark.parametrize(
    ("impl", "references"),
    [("fused", False), ("mosaic", True), ("persistent", True)],
)
@pytest.mark.parametrize("with_z", [False, True])
def test_last_layer_only_is_the_last_layer_in_values_and_gradients(impl, references, with_z):
    """``spec.last_layer_only``: the op returns states[:, -1] of the whole op, and every
    gradient of a loss on it equals the one through the whole op (the backward gets that
    layer's cotangent alone: `persistent` reads it as it is, the others zero-padded)."""
    import dataclasses

    import jax.numpy as jnp

    from rhhjax.ops import cells, recurrence
    from rhhjax.ops.sequence_spec import SequenceSpec

    steps, depth, batch, width = 3, 3, 5, 24
    keys = jax.random.split(jax.random.key(7 + with_z), 8)
    weights = cells.HighwayWeights(
        kernel_x=jnp.zeros((4, 2 * width)),
        bias_x=0.1 * jax.random.normal(keys[0], (2 * width,)),
        kernel_s=0.3 * jax.random.normal(keys[1], (depth, width, 2 * width)),
        bias_s=0.1 * jax.random.normal(keys[2], (depth, 2 * width)),
    )
    s0 = jax.random.normal(keys[3], (batch, width))
    xproj = jax.random.normal(keys[4], (steps, batch, 2 * width))
    z = 1.0 + 0.2 * jax.random.normal(keys[5], (steps, depth, batch, width)) if with_z else None
    probe = jax.random.normal(keys[6], (steps, batch, width))
    spec = SequenceSpec(impl, keep=0.75, dtype=jnp.float32, gate_dropout=True,
                        references=references)  # fmt: skip
    last = dataclasses.replace(spec, last_layer_only=True)

    def loss(run_spec, pick):
        def f(weights, s0, xproj, z):
            states = recurrence.highway_sequence(run_spec, weights, s0, xproj, z, keys[7], None)
            return jnp.sum(pick(states) * probe)

        return jax.value_and_grad(f, argnums=(0, 1, 2, 3) if with_z else (0, 1, 2))

    args = (weights, s0, xproj, z)
    whole = loss(spec, lambda states: states[:, -1])(*args)
    alone = loss(last, lambda states: states)(*args)
    _assert_trees_close(alone, whole, 1e-5)
    assert recurrence.highway_sequence(last, *args, keys[7], None).shape == (steps, batch, width)
