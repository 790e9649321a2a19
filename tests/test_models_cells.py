"""Cells: the highway combine, `RHNCell` under `nn.RNN`, the parameter tree (the checkpoint
format) and where gates are recorded."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from model_cases import init, tiny

from rhhjax import models
from rhhjax.ops import cells


def test_carry_gate_uses_undropped_transform_gate():
    rng = np.random.default_rng(7)
    n = 8
    a = rng.normal(size=(3, 2 * n)).astype(np.float32)
    s = rng.normal(size=(3, n)).astype(np.float32)
    dropped_everything = np.zeros((3, n), np.float32)
    out = cells.highway_gate(jnp.asarray(a), jnp.asarray(s), jnp.asarray(dropped_everything))
    t = 1.0 / (1.0 + np.exp(-a[:, n:].astype(np.float64)))
    np.testing.assert_allclose(out, s * (1 - t), rtol=1e-5, atol=1e-6)


def test_rhn_cell_works_with_flax_rnn():
    config = tiny(type="rhn")
    model, params = init(config, 2)
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, 11, (3, 6)))
    logits, _ = model.apply({"params": params}, tokens)
    cell = models.RHNCell(features=12, input_features=5, depth=3)
    rnn = nn.RNN(cell)
    x = params["embed"]["embedding"][tokens]
    outputs = rnn.apply({"params": {"cell": params["core"]["cell"]}}, x)
    np.testing.assert_allclose(
        outputs @ params["head"]["kernel"] + params["head"]["bias"], logits, rtol=1e-5, atol=1e-5
    )


RHN = {"bias_s": (3, 24), "bias_x": (24,), "kernel_s": (3, 12, 24), "kernel_x": (5, 24)}
HYPER = {"bias_s": (3, 12), "bias_x": (12,), "kernel_s": (3, 6, 12), "kernel_x": (5, 12)}
LM = {"embed/embedding": (11, 5), "head/bias": (11,), "head/kernel": (12, 11)}


def _prefixed(prefix, shapes):
    return {f"{prefix}/{name}": shape for name, shape in shapes.items()}


@pytest.mark.parametrize(
    ("overrides", "cell"),
    [
        ({"type": "rhn"}, _prefixed("core/cell", RHN)),
        (
            {},
            {
                **_prefixed("core/cell/main", RHN),
                **_prefixed("core/cell/hyper", HYPER),
                "core/cell/proj_kernel": (3, 6, 12),
                "core/cell/proj_bias": (3, 12),
            },
        ),
        (
            {"hyper_rank": 2},
            {
                **_prefixed("core/cell/main", RHN),
                **_prefixed("core/cell/hyper", HYPER),
                "core/cell/u_kernel": (3, 6, 2, 12),
                "core/cell/u_bias": (3, 2, 12),
                "core/cell/v_kernel": (3, 6, 2, 12),
                "core/cell/v_bias": (3, 2, 12),
                "core/cell/u_x_kernel": (6, 2, 5),
                "core/cell/u_x_bias": (2, 5),
            },
        ),
        (
            {"type": "lstm", "lstm_layers": 2},
            {
                "core/layers_0/kernel_x": (5, 48),
                "core/layers_0/kernel_h": (12, 48),
                "core/layers_0/bias": (48,),
                "core/layers_1/kernel_x": (12, 48),
                "core/layers_1/kernel_h": (12, 48),
                "core/layers_1/bias": (48,),
            },
        ),
    ],
)
def test_parameter_tree_is_the_checkpoint_format(overrides, cell):
    model = models.build_model(tiny(**overrides))
    shapes = jax.eval_shape(lambda: models.init_params(model, jax.random.key(0)))
    flat = traverse_util.flatten_dict(shapes, sep="/")
    assert {name: leaf.shape for name, leaf in flat.items()} == {**LM, **cell}


def test_gates_are_recorded_only_when_collected_and_only_by_scan():
    config = tiny(type="rhn")
    model, params = init(config, 0)
    tokens = jnp.zeros((2, 4), jnp.int32)
    _, state = model.apply({"params": params}, tokens, mutable=[models.GATES_COLLECTION])
    assert state[models.GATES_COLLECTION]["core"]["cell"][models.GATES_NAME][0].shape == (
        4, 3, 2, 12
    )  # fmt: skip
    fused = models.build_model(tiny(type="rhn", impl="fused"))
    _, state = fused.apply({"params": params}, tokens, mutable=[models.GATES_COLLECTION])
    assert not state  # the whole-sequence op records nothing
    plain = model.apply({"params": params}, tokens)
    assert len(plain) == 2  # (logits, carry): no collection returned when not asked for
