"""The persistent kernel's schedule, emulated in pure JAX, against `fused` and the textbook
scan: values and gradients on fresh random inputs (f32, bf16, gate dropout, hyper scales,
first_step, odd sizes, depth 1..7), the ownership maps and the K accumulation order."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import persistent_schedule as ps
import pytest

from rhhjax import models
from rhhjax.ops import cells, recurrence

pytestmark = pytest.mark.pure_jax  # pure JAX on every jax release: run once (newest_jax.sh)

# Against the textbook scan, as tests/test_recurrence.py: f32 paths differ only in summation
# order; bf16 backward passes of autodiff and of a custom VJP round different intermediates
# to bf16. Against `fused` both dtypes get the f32 tolerance: the emulation rounds the same
# operands to bf16 at the same points (measured: <= 4e-7 of the largest entry in bf16).
TOLERANCE = {"float32": 2e-5, "bfloat16": 3e-2}
FUSED_TOLERANCE = 2e-5
KEEP = 0.6


def _spec(dtype, dropout, first_step=0):
    return recurrence.SequenceSpec("fused", KEEP, jnp.dtype(dtype), dropout, first_step=first_step)


def _case(seed, length, depth, batch, width, with_z):
    """Fresh random weights and inputs: (weights, s0, xproj, z, key)."""
    rng = np.random.default_rng(seed)

    def normal(*shape, scale=0.4):
        return jnp.asarray(rng.normal(size=shape) * scale, jnp.float32)

    weights = cells.HighwayWeights(
        normal(3, 2 * width),
        normal(2 * width),
        normal(depth, width, 2 * width),
        normal(depth, 2 * width),
    )
    z = 1.0 + normal(length, depth, batch, width, scale=0.3) if with_z else None
    return weights, normal(batch, width), normal(length, batch, 2 * width), z, jax.random.key(seed)


def _loss(op, spec, key, weights, s0, xproj, z):
    """A scalar that weights every state differently (so every cotangent is distinct)."""
    states = op(spec, weights, s0, xproj, z, key if spec.gate_dropout else None, None)
    ramp = jnp.linspace(-1.0, 1.0, states.size).reshape(states.shape)
    return jnp.sum(jnp.sin(states) * ramp)


@functools.cache
def _value_and_grad(op, spec, with_z):
    argnums = (0, 1, 2, 3) if with_z else (0, 1, 2)

    def f(key, weights, s0, xproj, z):
        return _loss(op, spec, key, weights, s0, xproj, z)

    return jax.jit(jax.value_and_grad(f, argnums=tuple(a + 1 for a in argnums)))


def _textbook(spec, weights, s0, xproj, z, key, hidden):
    """`cells.highway_step` in a plain `lax.scan` with autodiff (the `scan` model's math),
    masks of step first_step + i at entry i."""
    del hidden
    depth = weights.kernel_s.shape[0]
    steps = jnp.arange(xproj.shape[0]) + spec.first_step

    def body(s, xs):
        step, x_t, z_t = xs
        masks = None
        if key is not None:
            masks = cells.gate_masks(key, step, (depth, *s.shape), spec.keep)
        s, layers, _ = cells.highway_step(weights, s, x_t, z_t, masks, None, spec.dtype)
        return s, layers

    return jax.lax.scan(body, s0, (steps, xproj, z))[1]


def _persistent(schedule):
    return functools.partial(ps.highway_sequence, schedule=schedule)


def _assert_close(actual, expected, tol):
    """Every leaf within `tol`, relative to the element and to the leaf's largest entry
    (summation-order noise scales with the magnitudes summed)."""
    for a, e in zip(
        jax.tree_util.tree_leaves(actual), jax.tree_util.tree_leaves(expected), strict=True
    ):
        e = np.asarray(e, np.float32)
        atol = tol * max(float(np.max(np.abs(e), initial=0.0)), 1e-3)
        np.testing.assert_allclose(np.asarray(a, np.float32), e, rtol=tol, atol=atol)


# (dtype, length, depth, batch, width, z, dropout, first_step, schedule)
CASES = [
    ("float32", 4, 1, 5, 37, False, True, 0, ps.Schedule(4, 1, 16)),
    ("float32", 3, 2, 5, 37, True, True, 1, ps.Schedule(5, 2, 8)),
    ("float32", 3, 3, 4, 20, True, False, 0, ps.Schedule(132, 1, 64)),
    ("float32", 2, 7, 3, 13, True, True, 0, ps.Schedule(3, 1, 8)),
    ("float32", 3, 6, 6, 33, False, False, 0, ps.Schedule(8, 3, 24)),
    ("bfloat16", 4, 3, 5, 37, True, True, 1, ps.Schedule(4, 1, 16)),
    ("bfloat16", 3, 5, 5, 20, False, True, 0, ps.Schedule(7, 2, 8)),
    ("bfloat16", 2, 2, 4, 29, True, False, 0, ps.Schedule(132, 1, 64)),
]


@pytest.mark.parametrize(
    ("dtype", "length", "depth", "batch", "width", "with_z", "dropout", "first_step", "schedule"),
    CASES,
)
def test_schedule_matches_fused_and_the_textbook_scan(
    dtype, length, depth, batch, width, with_z, dropout, first_step, schedule
):
    seed = 7 * depth + width + length
    weights, s0, xproj, z, key = _case(seed, length, depth, batch, width, with_z)
    spec = _spec(dtype, dropout, first_step)
    args = (key, weights, s0, xproj, z)
    actual = _value_and_grad(_persistent(schedule), spec, with_z)(*args)
    fused = _value_and_grad(recurrence.highway_sequence, spec, with_z)(*args)
    textbook = _value_and_grad(_textbook, spec, with_z)(*args)
    _assert_close(actual, fused, FUSED_TOLERANCE)
    _assert_close(actual, textbook, TOLERANCE[dtype])
    states = _persistent(schedule)(spec, weights, s0, xproj, z, key if dropout else None, None)
    expected = recurrence.highway_sequence(
        spec, weights, s0, xproj, z, key if dropout else None, None
    )
    assert states.shape == (length, depth, batch, width)
    _assert_close(states, expected, FUSED_TOLERANCE)


def test_first_step_selects_the_later_steps_masks():
    """The masks of entry i are those of step first_step + i: first_step 0 and 1 differ."""
    weights, s0, xproj, z, key = _case(3, 3, 2, 5, 37, True)
    op = _persistent(ps.Schedule(4, 1, 16))
    zero = op(_spec("float32", True, 0), weights, s0, xproj, z, key, None)
    one = op(_spec("float32", True, 1), weights, s0, xproj, z, key, None)
    assert float(jnp.max(jnp.abs(zero - one))) > 1e-3
    _assert_close(one, _textbook(_spec("float32", True, 1), weights, s0, xproj, z, key, None), 2e-5)


def test_model_with_the_persistent_op_matches_scan(monkeypatch):
    """End to end: a HyperRHN whose whole-sequence op is the emulation (gate dropout,
    original_first_step) against the `scan` model, loss and every parameter gradient."""
    import optax

    config = models.ModelConfig(
        type="hyperrhn", vocab_size=13, embed_dim=6, hidden=20, hyper_hidden=7, depth=3,
        keep=0.6, original_first_step=True,
    )  # fmt: skip
    model = models.build_model(config)
    params = models.init_params(model, jax.random.key(4))
    tokens = jnp.asarray(np.random.default_rng(4).integers(0, 13, (5, 8)))

    def loss(cfg, p):
        logits, _ = models.build_model(cfg).apply(
            {"params": p}, tokens[:, :-1], train=True, rngs={"dropout": jax.random.key(5)}
        )
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    expected = jax.jit(jax.value_and_grad(functools.partial(loss, config)))(params)
    calls = []

    def persistent(*args):
        calls.append(args[0].first_step)
        return _persistent(ps.Schedule(3, 1, 8))(*args)

    monkeypatch.setattr(recurrence, "highway_sequence", persistent, raising=True)
    fused = dataclasses.replace(config, impl="fused")
    actual = jax.jit(jax.value_and_grad(functools.partial(loss, fused)))(params)
    _assert_close(actual, expected, TOLERANCE["float32"])
    # The model really ran the emulation (hyper and main cell, from step 1).
    assert calls == [1, 1], calls


def test_k_chunks_accumulate_in_order_in_float32():
    """Chunk products +1e8, +1, -1e8 (chunks 0, 1, 2): in chunk order in float32 the +1 is
    lost ((1e8 + 1) - 1e8 = 0); any other order or a wider accumulator keeps it."""
    plan = ps.Schedule(col_blocks=2, row_blocks=1, k_chunk=8).plan(1, 24, jnp.float32)
    s = jnp.zeros((plan.b_pad, plan.n_pad)).at[0, 0].set(1e4).at[0, 8].set(1.0).at[0, 16].set(1e4)
    w = jnp.zeros((1, 24, 48)).at[0, 0, 5].set(1e4).at[0, 8, 5].set(1.0).at[0, 16, 5].set(-1e4)
    w_blocks = ps.forward_weights(plan, w, jnp.float32)
    ones = jnp.ones((plan.b_pad, plan.n_pad))
    bias = jnp.zeros((2, plan.n_pad))
    _, saved = ps.forward_phase(plan, 1.0, jnp.float32, s, w_blocks[0], ones, bias, None, None)
    assert float(saved["u"][0, 0, 5]) == 0.0
    reordered = jnp.float32(1e8) + jnp.float32(-1e8) + jnp.float32(1.0)
    assert float(reordered) == 1.0  # the check above can fail: order matters here


def test_blocks_own_both_halves_of_their_units():
    """Forward slice g holds W's h- and t-columns of units g*u..; backward slice g holds W's
    rows of the same units; the barrier's assembly inverts the split into blocks."""
    plan = ps.Schedule(col_blocks=3, row_blocks=2, k_chunk=8).plan(5, 10, jnp.float32)
    n, u = plan.width, plan.units_per_block
    w = jnp.asarray(np.random.default_rng(0).normal(size=(2, n, 2 * n)), jnp.float32)
    fw = np.asarray(ps.forward_weights(plan, w, jnp.float32))
    bw = np.asarray(ps.backward_weights(plan, w, jnp.float32))
    wn = np.asarray(w)
    for g in range(plan.col_blocks):
        for j in range(u):
            unit = g * u + j
            fcol = fw[1, g, :, :, :, j].reshape(-1, 2)[:n]  # [K, half]
            bcol = bw[1, g, :, :, j].reshape(-1)[: 2 * plan.n_pad].reshape(2, plan.n_pad)
            if unit < n:
                np.testing.assert_array_equal(fcol, wn[1, :, [unit, n + unit]].T)
                np.testing.assert_array_equal(bcol[:, :n], wn[1, unit].reshape(2, n))
            else:
                assert not fcol.any() and not bcol.any()
    x = jnp.asarray(np.random.default_rng(1).normal(size=(plan.b_pad, 2, plan.n_pad)))
    np.testing.assert_array_equal(ps._assemble(plan, ps._to_blocks(plan, x)), x)
    np.testing.assert_array_equal(ps._assemble(plan, ps._to_blocks(plan, x[:, 0])), x[:, 0])


def test_variational_dropout_and_a_missing_key_are_refused():
    weights, s0, xproj, z, key = _case(1, 2, 1, 3, 8, False)
    with pytest.raises(ValueError, match="variational"):
        ps.highway_sequence(
            _spec("float32", False), weights, s0, xproj, z, None, jnp.ones((1, 3, 8))
        )
    with pytest.raises(ValueError, match="needs a key"):
        ps.highway_sequence(_spec("float32", True), weights, s0, xproj, z, None, None)
