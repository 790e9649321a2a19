"""Low-rank hyper scaling (Suarez 2017 section 4): the op against the materialised reference,
its residuals, and the rank-d HyperRHN model (scan vs fused, rank 1 == the paper's cell)."""

import contextlib
import functools
import io
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_trees_close as _assert_trees_close
from jax.ad_checkpoint import print_saved_residuals
from ops_cases import config as _config
from ops_cases import fresh_case, loss_and_grads, loss_fn

from rhhjax import models
from rhhjax.ops import lowrank

BYTES = {
    "float0": 0,
    "f32": 4,
    "f64": 8,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "i32": 4,
    "pred": 1,
    "bool": 1,
}


def _op_case(seed, batch, n_in, n_out, rank, m, dtype=np.float32):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch, n_in)).astype(dtype)
    w = rng.normal(size=(n_in, n_out)).astype(dtype) / np.sqrt(n_in)
    u = rng.normal(size=(batch, rank, n_in)).astype(dtype)
    v = rng.normal(size=(batch, rank, m)).astype(dtype)
    dy = rng.normal(size=(batch, n_out)).astype(dtype)
    return tuple(jnp.asarray(a) for a in (x, w, u, v, dy))


@functools.cache
def _vjp_fn(op, dtype):
    def run(x, w, u, v, dy):
        y, pullback = jax.vjp(lambda *a: lowrank.scaled_matmul(*a, dtype=dtype, op=op), x, w, u, v)
        return y, pullback(dy)

    return run  # eager: compiling every small case costs more than running it


def _numpy_reference(x, w, u, v):
    """x W~ with W~ = W o sum_i u_i [v_i, v_i, ...]^T built per example in float64 numpy."""
    x, w, u, v = (np.asarray(a, np.float64) for a in (x, w, u, v))
    v_full = np.tile(v, (1, 1, w.shape[1] // v.shape[-1]))
    w_tilde = w[None] * np.einsum("bdi,bdo->bio", u, v_full)
    return np.einsum("bi,bio->bo", x, w_tilde)


@pytest.mark.parametrize("op", ["custom_vjp", "factored"])
@pytest.mark.parametrize("rank", [1, 2, 4])
@pytest.mark.parametrize("tiles", [1, 2])
def test_op_values_and_gradients_match_materialized_reference(op, rank, tiles):
    m = 6
    x, w, u, v, dy = _op_case(rank * 10 + tiles, 5, 7, m * tiles, rank, m)
    y, grads = _vjp_fn(op, jnp.dtype(jnp.float32))(x, w, u, v, dy)
    y_ref, grads_ref = _vjp_fn("materialized", jnp.dtype(jnp.float32))(x, w, u, v, dy)
    np.testing.assert_allclose(y, _numpy_reference(x, w, u, v), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
    for name, g, g_ref in zip("xwuv", grads, grads_ref, strict=True):
        np.testing.assert_allclose(g, g_ref, rtol=1e-5, atol=1e-5, err_msg=f"d{name}")


def test_op_float64_gradients_match_reference_tightly():
    with jax.enable_x64(True):
        for rank in (1, 3):
            case = _op_case(rank, 4, 5, 8, rank, 4, np.float64)
            y, grads = _vjp_fn("custom_vjp", jnp.dtype(jnp.float64))(*case)
            y_ref, grads_ref = _vjp_fn("materialized", jnp.dtype(jnp.float64))(*case)
            assert y.dtype == jnp.float64
            np.testing.assert_allclose(y, y_ref, rtol=1e-12, atol=1e-12)
            for g, g_ref in zip(grads, grads_ref, strict=True):
                assert g.dtype == jnp.float64
                np.testing.assert_allclose(g, g_ref, rtol=1e-11, atol=1e-12)


def test_op_accepts_leading_axes():
    x, w, u, v, _ = _op_case(0, 6, 4, 6, 2, 3)
    y = lowrank.scaled_matmul(x.reshape(2, 3, 4), w, u.reshape(2, 3, 2, 4), v.reshape(2, 3, 2, 3))
    np.testing.assert_allclose(y.reshape(6, 6), lowrank.scaled_matmul(x, w, u, v), rtol=1e-6)
    with pytest.raises(ValueError, match="multiple"):
        lowrank.scaled_matmul(x, w, u, v[..., :2][..., :1].repeat(4, -1))


def _saved(fn, *args):
    """[(dtype, shape)] of the residuals autodiff keeps for `fn` (print_saved_residuals)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_saved_residuals(fn, *args)
    found = []
    for line in out.getvalue().splitlines():
        match = re.match(r"(\w+)\[([\d,]*)\]", line.strip())
        if match:
            shape = tuple(int(d) for d in match.group(2).split(",") if d)
            found.append((match.group(1), shape))
    return found


def _saved_bytes(fn, *args):
    return sum(BYTES[dtype] * math.prod(shape) for dtype, shape in _saved(fn, *args))


@pytest.mark.parametrize("rank", [1, 3])
def test_custom_vjp_saves_only_x_u_v_and_w(rank):
    batch, n_in, n_out = 4, 5, 8
    x, w, u, v, _ = _op_case(1, batch, n_in, n_out, rank, n_out // 2)

    def loss(op):
        return lambda *a: jnp.sum(jnp.sin(lowrank.scaled_matmul(*a, op=op)))

    saved = _saved(loss("custom_vjp"), x, w, u, v)
    shapes = [shape for _, shape in saved]
    assert (batch, n_in, n_out) not in shapes
    # x, W, u, v and the cos of the test's own sin: nothing else.
    assert sorted(shapes) == sorted([x.shape, w.shape, u.shape, v.shape, (batch, n_out)])
    # The fwd rule's residuals themselves.
    _, residuals = lowrank._scaled_matmul_fwd(x, w, u, v, jnp.dtype(jnp.float32))
    assert [r.shape for r in residuals] == [x.shape, w.shape, u.shape, v.shape]
    # The check would catch a per-example matrix: the materialised reference keeps one.
    assert (batch, n_in, n_out) in [s for _, s in _saved(loss("materialized"), x, w, u, v)]


def test_weight_gradient_is_one_matmul_with_k_batch_times_rank():
    batch, n_in, n_out, rank = 3, 5, 8, 4
    x, w, u, v, dy = _op_case(2, batch, n_in, n_out, rank, n_out // 2)
    jaxpr = jax.make_jaxpr(lambda *a: jax.vjp(lowrank.scaled_matmul, *a[:4])[1](a[4]))(
        x, w, u, v, dy
    )
    dots = [
        tuple(tuple(var.aval.shape) for var in eqn.invars)
        for eqn in _all_eqns(jaxpr.jaxpr)
        if eqn.primitive.name == "dot_general"
    ]
    assert ((batch * rank, n_in), (batch * rank, n_out)) in dots, dots


def _all_eqns(jaxpr):
    """Every equation of a jaxpr, including those of nested jaxprs (jit, custom rules)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for param in eqn.params.values():
            for value in param if isinstance(param, (tuple, list)) else (param,):
                inner = value.jaxpr if hasattr(value, "jaxpr") else value
                if hasattr(inner, "eqns"):
                    yield from _all_eqns(inner)


# ----------------------------------------------------------------------------- the model


def _case(config, seed, batch=5, length=8):
    """(model, params, tokens, key) of ``config`` (``ops_cases.fresh_case``)."""
    return models.build_model(config), *fresh_case(config, seed, batch, length)


@pytest.mark.parametrize(
    ("rank", "dropout", "depth", "original"),
    [(1, "gate", 3, False), (3, "gate", 2, False), (2, "none", 1, False), (2, "gate", 2, True)],
)
def test_fused_matches_scan_values_and_gradients(rank, dropout, depth, original):
    config = _config(hyper_rank=rank, dropout=dropout, depth=depth, original_first_step=original)
    _, params, tokens, key = _case(config, 10 * rank + depth)
    # Move away from the init (u = 1/sqrt(d) everywhere) so every factor matters.
    params = jax.tree_util.tree_map(
        lambda p: p + 0.1 * jax.random.normal(jax.random.key(p.size), p.shape), params
    )
    expected = loss_and_grads(config, params, tokens, key)
    fused = models.ModelConfig(**{**config.__dict__, "impl": "fused"})
    _assert_trees_close(loss_and_grads(fused, params, tokens, key), expected, 2e-5)


def test_fused_matches_scan_with_variational_dropout():
    config = _config(hyper_rank=2, dropout="variational", keep_hidden=0.7, keep_input=0.8)
    _, params, tokens, key = _case(config, 4)
    expected = loss_and_grads(config, params, tokens, key)
    fused = models.ModelConfig(**{**config.__dict__, "impl": "fused"})
    _assert_trees_close(loss_and_grads(fused, params, tokens, key), expected, 2e-5)


def test_scan_gradients_agree_for_every_op_and_remat_setting():
    config = _config(hyper_rank=2, depth=2)
    _, params, tokens, key = _case(config, 6)
    params = jax.tree_util.tree_map(
        lambda p: p + 0.1 * jax.random.normal(jax.random.key(p.size + 1), p.shape), params
    )
    expected = loss_and_grads(config, params, tokens, key)  # custom_vjp + remat (default)
    for op, remat in (("factored", False), ("custom_vjp", False), ("materialized", True)):
        variant = models.ModelConfig(
            **{**config.__dict__, "lowrank_op": op, "lowrank_remat": remat}
        )
        actual = loss_and_grads(variant, params, tokens, key)
        _assert_trees_close(actual, expected, 2e-5)


def _paper_params_as_rank1(params, embed_dim):
    cell = dict(params["core"]["cell"])
    scales = lowrank.paper_equivalent_scales(
        cell.pop("proj_kernel"), cell.pop("proj_bias"), embed_dim
    )
    cell.update(scales._asdict())
    return {**params, "core": {"cell": cell}}


@pytest.mark.parametrize("impl", ["scan", "fused"])
def test_rank1_with_u_fixed_to_one_is_the_paper_hyperrhn(impl):
    paper = _config(impl=impl)
    _, params, tokens, key = _case(paper, 8)
    rank1 = models.ModelConfig(**{**paper.__dict__, "hyper_rank": 1})
    mapped = _paper_params_as_rank1(params, paper.embed_dim)
    rank1_model = models.build_model(rank1)
    template = models.init_params(rank1_model, jax.random.key(0))
    assert jax.tree_util.tree_structure(template) == jax.tree_util.tree_structure(mapped)
    expected, _ = models.build_model(paper).apply({"params": params}, tokens)
    actual, _ = rank1_model.apply({"params": mapped}, tokens)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)
    # With dropout too (same masks).
    rngs = {"dropout": key}
    expected, _ = models.build_model(paper).apply({"params": params}, tokens, train=True, rngs=rngs)
    actual, _ = rank1_model.apply({"params": mapped}, tokens, train=True, rngs=rngs)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rank", [1, 3])
def test_init_is_a_paper_style_column_scaling(rank):
    """At init u_i = 1/sqrt(d): the model equals the paper's cell with
    P = sum_i P^v_i / sqrt(d), p = sum_i p^v_i / sqrt(d)."""
    config = _config(hyper_rank=rank)
    model, params, tokens, _ = _case(config, 3)
    cell = dict(params["core"]["cell"])
    np.testing.assert_array_equal(cell["u_kernel"], 0.0)
    np.testing.assert_allclose(cell["u_bias"], 1 / np.sqrt(rank), rtol=1e-7)
    np.testing.assert_array_equal(cell["u_x_kernel"], 0.0)
    # Each [h, n] slice of P^v has the paper's (orthogonal) init: orthonormal rows.
    for layer in range(config.depth):
        for i in range(rank):
            p = np.asarray(cell["v_kernel"][layer, :, i, :])
            np.testing.assert_allclose(p @ p.T, np.eye(config.hyper_hidden), atol=1e-5)
    scale = 1 / np.sqrt(rank)
    paper_cell = {k: cell[k] for k in ("hyper", "main")}
    paper_cell["proj_kernel"] = jnp.sum(cell["v_kernel"], axis=2) * scale
    paper_cell["proj_bias"] = jnp.sum(cell["v_bias"], axis=1) * scale
    paper = models.ModelConfig(**{**config.__dict__, "hyper_rank": 0})
    expected, _ = models.build_model(paper).apply(
        {"params": {**params, "core": {"cell": paper_cell}}}, tokens
    )
    actual, _ = model.apply({"params": params}, tokens)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


def test_parameter_counts():
    def count(**kw):
        model = models.build_model(models.ModelConfig(**kw))
        shapes = jax.eval_shape(lambda: models.init_params(model, jax.random.key(0)))
        return models.count_params(shapes)

    assert count() == 15_262_736  # hyper_rank = 0: the paper's tree, unchanged.
    paper_proj = 7 * 128 * 1000 + 7 * 1000
    for rank in (1, 4):
        extra = 2 * (7 * 128 * rank * 1000 + 7 * rank * 1000) + 128 * rank * 27 + rank * 27
        assert count(hyper_rank=rank) == 15_262_736 - paper_proj + extra


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"hyper_rank": -1}, "non-negative"),
        ({"hyper_rank": 1.5}, "non-negative"),
        ({"hyper_rank": 2, "type": "rhn"}, "hyperrhn"),
        ({"hyper_rank": 2, "impl": "mosaic"}, "mosaic"),
    ],
)
def test_invalid_rank_configs_are_one_line_config_errors(overrides, message):
    with pytest.raises(models.ConfigError, match=message) as error:
        _config(**overrides).validate()
    assert "hyper_rank" in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("impl", ["scan", "fused"])
def test_saved_memory_barely_grows_with_rank(impl):
    """Residual bytes of a training loss: rank 4 within 1.3x of rank 1 (the goal),
    while u and v alone would be 4x (scan without remat keeps them)."""

    def saved(rank, remat=True):
        config = _config(
            hidden=64, hyper_hidden=16, depth=3, hyper_rank=rank, impl=impl, lowrank_remat=remat
        )
        model, params, tokens, key = _case(config, 0, batch=8, length=12)
        return _saved_bytes(loss_fn(model), params, tokens, key)

    ratio = saved(4) / saved(1)
    assert ratio <= 1.3, ratio
    if impl == "scan":
        assert saved(4, remat=False) / saved(1, remat=False) > 1.5
