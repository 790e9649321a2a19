"""Model math against a numpy reference written straight from the equations."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rhhjax import models
from rhhjax.ops import cells


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _np_highway_step(w, s, x, z=None, gate_masks=None, hidden_masks=None):
    """Zilly eq. 6-9 / Suarez eq. 3-7 for one time step, in float64 numpy."""
    n = s.shape[-1]
    states = []
    for layer in range(w["kernel_s"].shape[0]):
        s_in = s if hidden_masks is None else s * hidden_masks[layer]
        a = s_in @ w["kernel_s"][layer]
        scale = 1.0 if z is None else np.concatenate([z[layer], z[layer]], -1)
        a = a * scale + w["bias_s"][layer]
        if layer == 0:
            a = a + (x @ w["kernel_x"]) * scale + w["bias_x"]
        h, t = np.tanh(a[:, :n]), _sigmoid(a[:, n:])
        c = 1.0 - t
        if gate_masks is not None:
            t = t * gate_masks[layer]
        s = h * t + s * c
        states.append(s)
    return s, np.stack(states)


def _np_lm(params, tokens, config, masks=None):
    """Reference logits [B, T, V] of the whole language model (rhn or hyperrhn)."""
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
    x_all = p["embed"]["embedding"][tokens]
    batch, length = tokens.shape
    cell = p["core"]["cell"]
    s_main = np.zeros((batch, config.hidden))
    s_hyper = np.zeros((batch, config.hyper_hidden))
    outputs = []
    for step in range(length):
        x = x_all[:, step]

        def gate(name, step=step):
            return None if masks is None else masks[name][step]

        if config.type == "rhn":
            s_main, _ = _np_highway_step(cell, s_main, x, None, gate("main"))
        else:
            hyper_x = x
            if config.hyper_input == "x_and_state":
                hyper_x = np.concatenate([x, s_main], -1)
            s_hyper, hyper_states = _np_highway_step(
                cell["hyper"], s_hyper, hyper_x, None, gate("hyper")
            )
            z = (
                np.einsum("lbh,lhn->lbn", hyper_states, cell["proj_kernel"])
                + cell["proj_bias"][:, None]
            )
            s_main, _ = _np_highway_step(cell["main"], s_main, x, z, gate("main"))
        outputs.append(s_main)
    out = np.stack(outputs, 1)
    return out @ p["head"]["kernel"] + p["head"]["bias"]


def _tiny(**overrides):
    base = dict(type="hyperrhn", vocab_size=11, embed_dim=5, hidden=12, hyper_hidden=6, depth=3)
    base.update(overrides)
    return models.ModelConfig(**base)


def _init(config, seed):
    model = models.build_model(config)
    return model, models.init_params(model, jax.random.key(seed))


@pytest.mark.parametrize("model_type", ["rhn", "hyperrhn"])
@pytest.mark.parametrize("hyper_input", ["x", "x_and_state"])
@pytest.mark.parametrize("depth", [1, 3])
def test_logits_match_numpy_reference(model_type, hyper_input, depth):
    config = _tiny(type=model_type, hyper_input=hyper_input, depth=depth)
    seed = 100 * depth + len(hyper_input) + len(model_type)
    model, params = _init(config, seed)
    tokens = np.random.default_rng(seed).integers(0, config.vocab_size, (3, 7))
    logits, _ = model.apply({"params": params}, jnp.asarray(tokens))
    np.testing.assert_allclose(logits, _np_lm(params, tokens, config), rtol=2e-5, atol=2e-5)


def test_gate_dropout_uses_fresh_masks_per_layer_and_step_and_matches_reference():
    config = _tiny(keep=0.5)
    model, params = _init(config, 3)
    tokens = np.random.default_rng(3).integers(0, config.vocab_size, (4, 6))
    key = jax.random.key(42)
    logits, _ = model.apply(
        {"params": params}, jnp.asarray(tokens), train=True, rngs={"dropout": key}
    )
    # The masks the model must have used, from the documented key derivation.
    dkey = model.apply(
        {"params": params}, method=lambda m: m.make_rng("dropout"), rngs={"dropout": key}
    )
    masks = {"main": [], "hyper": []}
    for step in range(tokens.shape[1]):
        for name, which, width in (
            ("main", models.DropoutKeys.MAIN_GATE, config.hidden),
            ("hyper", models.DropoutKeys.HYPER_GATE, config.hyper_hidden),
        ):
            k = models.DropoutKeys.get(dkey, which)
            masks[name].append(np.asarray(cells.gate_masks(k, step, (config.depth, 4, width), 0.5)))
    reference = _np_lm(params, tokens, config, masks)
    np.testing.assert_allclose(logits, reference, rtol=2e-5, atol=2e-5)
    main = np.stack(masks["main"])
    assert not np.array_equal(main[0, 0], main[0, 1]), "layers must get different masks"
    assert not np.array_equal(main[0], main[1]), "time steps must get different masks"


def test_gate_mask_statistics():
    keep = 0.65
    masks = np.asarray(cells.gate_masks(jax.random.key(0), 5, (7, 256, 200), keep))
    np.testing.assert_allclose(np.unique(masks), [0.0, 1.0 / keep], rtol=1e-6)
    assert abs((masks > 0).mean() - keep) < 0.01
    assert abs(masks.mean() - 1.0) < 0.015


def test_carry_gate_uses_undropped_transform_gate():
    rng = np.random.default_rng(7)
    n = 8
    a = rng.normal(size=(3, 2 * n)).astype(np.float32)
    s = rng.normal(size=(3, n)).astype(np.float32)
    dropped_everything = np.zeros((3, n), np.float32)
    out = cells.highway_gate(jnp.asarray(a), jnp.asarray(s), jnp.asarray(dropped_everything))
    t = _sigmoid(a[:, n:].astype(np.float64))
    np.testing.assert_allclose(out, s * (1 - t), rtol=1e-5, atol=1e-6)


def test_variational_masks_are_shared_over_time():
    config = _tiny(
        type="rhn", dropout="variational", keep_hidden=0.5, keep_input=0.7, keep_output=0.8
    )
    model, params = _init(config, 5)
    tokens = jnp.asarray(np.random.default_rng(5).integers(0, 11, (2, 5)))
    rngs = {"dropout": jax.random.key(9)}
    a, _ = model.apply({"params": params}, tokens, train=True, rngs=rngs)
    b, _ = model.apply({"params": params}, tokens, train=True, rngs=rngs)
    c, _ = model.apply({"params": params}, tokens, train=True, rngs={"dropout": jax.random.key(10)})
    d, _ = model.apply({"params": params}, tokens, train=False)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c) and not np.allclose(a, d)
    masks = np.asarray(cells.sequence_masks(jax.random.key(0), (7, 256, 100), 0.5))
    assert abs((masks > 0).mean() - 0.5) < 0.01


def test_float64_gradient_matches_finite_differences():
    with jax.enable_x64(True):
        config = _tiny(
            hidden=5, hyper_hidden=3, depth=2, embed_dim=3, vocab_size=6, dtype="float64"
        )
        model, params = _init(config, 11)
        params = jax.tree_util.tree_map(lambda a: a.astype(jnp.float64), params)
        tokens = jnp.asarray(np.random.default_rng(11).integers(0, 6, (2, 4)))

        @jax.jit
        def loss(p):
            logits, _ = model.apply({"params": p}, tokens[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

        grads = jax.grad(loss)(params)
        flat, unravel = jax.flatten_util.ravel_pytree(params)
        gflat, _ = jax.flatten_util.ravel_pytree(grads)
        rng = np.random.default_rng(0)
        for index in rng.choice(flat.size, 25, replace=False):
            eps = 1e-6
            e = jnp.zeros_like(flat).at[index].set(eps)
            fd = (loss(unravel(flat + e)) - loss(unravel(flat - e))) / (2 * eps)
            np.testing.assert_allclose(gflat[index], fd, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize(
    ("variant", "expected"),
    [({}, 15_262_736), ({"type": "rhn"}, 14_121_400)],
)
def test_paper_parameter_counts(variant, expected):
    config = models.ModelConfig(**variant)
    model = models.build_model(config)
    shapes = jax.eval_shape(lambda: models.init_params(model, jax.random.key(0)))
    assert models.count_params(shapes) == expected


def test_lstm_parameter_count_follows_shapes():
    config = models.ModelConfig(type="lstm", hidden=1125, lstm_layers=2)
    model = models.build_model(config)
    shapes = jax.eval_shape(lambda: models.init_params(model, jax.random.key(0)))
    layer0 = 27 * 4500 + 1125 * 4500 + 4500
    layer1 = 1125 * 4500 * 2 + 4500
    assert models.count_params(shapes) == 50 * 27 + layer0 + layer1 + 1125 * 50 + 50


def test_rhn_cell_works_with_flax_rnn():
    config = _tiny(type="rhn")
    model, params = _init(config, 2)
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, 11, (3, 6)))
    logits, _ = model.apply({"params": params}, tokens)
    cell = models.RHNCell(features=12, input_features=5, depth=3)
    rnn = nn.RNN(cell)
    x = params["embed"]["embedding"][tokens]
    outputs = rnn.apply({"params": {"cell": params["core"]["cell"]}}, x)
    np.testing.assert_allclose(
        outputs @ params["head"]["kernel"] + params["head"]["bias"], logits, rtol=1e-5, atol=1e-5
    )


def test_carry_continues_a_sequence_exactly():
    config = _tiny()
    model, params = _init(config, 4)
    tokens = jnp.asarray(np.random.default_rng(4).integers(0, 11, (2, 10)))
    whole, _ = model.apply({"params": params}, tokens)
    first, carry = model.apply({"params": params}, tokens[:, :4])
    second, _ = model.apply({"params": params}, tokens[:, 4:], carry)
    np.testing.assert_allclose(jnp.concatenate([first, second], 1), whole, rtol=1e-5, atol=1e-5)


def test_transform_gate_bias_init_shifts_only_the_t_half():
    config = _tiny(type="rhn", t_bias_init=-4.0)
    _, params = _init(config, 0)
    bias = np.asarray(params["core"]["cell"]["bias_s"])
    bound = 1 / np.sqrt(config.hidden)
    assert np.all(np.abs(bias[:, : config.hidden]) <= bound)
    assert np.all(np.abs(bias[:, config.hidden :] + 4.0) <= bound)


def test_orthogonal_init_gives_orthonormal_rows_per_layer():
    _, params = _init(_tiny(type="rhn"), 0)
    w = np.asarray(params["core"]["cell"]["kernel_s"])
    for layer in w:
        np.testing.assert_allclose(layer @ layer.T, np.eye(12), atol=1e-5)


@pytest.mark.parametrize(
    ("field", "value"),
    [("depth", 0), ("keep", 0.0), ("keep", 1.5), ("hidden", -3), ("impl", "cuda"), ("type", "gru")],
)
def test_invalid_config_raises_one_line_error(field, value):
    with pytest.raises(models.ConfigError) as error:
        models.ModelConfig(**{field: value}).validate()
    assert field in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("model_type", ["hyperrhn", "lstm"])
def test_tiny_model_overfits_a_short_string(model_type):
    text = "the quick brown fox jumps over the lazy dog "
    vocab = sorted(set(text))
    ids = np.array([vocab.index(ch) for ch in text * 2])
    config = _tiny(
        type=model_type, vocab_size=len(vocab), hidden=32, hyper_hidden=8, depth=2, keep=1.0
    )
    model, params = _init(config, 0)
    tokens = jnp.asarray(ids[None, :])
    optimizer = optax.adam(1e-2)
    opt_state = optimizer.init(params)

    def loss_fn(p):
        logits, _ = model.apply({"params": p}, tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    @jax.jit
    def step(p, s):
        loss, grads = jax.value_and_grad(loss_fn)(p)
        updates, s = optimizer.update(grads, s)
        return optax.apply_updates(p, updates), s, loss

    for _ in range(300):
        params, opt_state, loss = step(params, opt_state)
    assert float(loss) < 0.05
