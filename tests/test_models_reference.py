"""The models against a float64 numpy reference written straight from the equations:
logits, gate dropout, and the transform gates the cells record (rank 0 and rank d)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model_cases import init, tiny

from rhhjax import models
from rhhjax.ops import cells


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _np_highway_step(w, s, x, z=None, gate_masks=None, hidden_masks=None, lowrank=None):
    """Zilly eq. 6-9 / Suarez eq. 3-7 (and section 4 with `lowrank`) for one time step.

    `lowrank`: (u [L, B, d, n], v [L, B, d, n], u_x [B, d, E]) factors of the rank-d
    scaling, materialised as W~ = W o sum_i u_i [v_i, v_i]^T per example.
    Returns (s [B, n], layer states [L, B, n], transform gates before dropout [L, B, n]).
    """
    n = s.shape[-1]
    states, gates = [], []
    for layer in range(w["kernel_s"].shape[0]):
        s_in = s if hidden_masks is None else s * hidden_masks[layer]
        if lowrank is None:
            a = s_in @ w["kernel_s"][layer]
            scale = 1.0 if z is None else np.concatenate([z[layer], z[layer]], -1)
            a = a * scale + w["bias_s"][layer]
            if layer == 0:
                a = a + (x @ w["kernel_x"]) * scale + w["bias_x"]
        else:
            u, v, u_x = lowrank
            vv = np.concatenate([v[layer], v[layer]], -1)  # [B, d, 2n]
            w_tilde = w["kernel_s"][layer][None] * np.einsum("bdi,bdo->bio", u[layer], vv)
            a = np.einsum("bi,bio->bo", s_in, w_tilde) + w["bias_s"][layer]
            if layer == 0:
                u_tilde = w["kernel_x"][None] * np.einsum("bdi,bdo->bio", u_x, vv)
                a = a + np.einsum("bi,bio->bo", x, u_tilde) + w["bias_x"]
        h, t = np.tanh(a[:, :n]), _sigmoid(a[:, n:])
        gates.append(t)
        c = 1.0 - t
        if gate_masks is not None:
            t = t * gate_masks[layer]
        s = h * t + s * c
        states.append(s)
    return s, np.stack(states), np.stack(gates)


def _np_lowrank_factors(cell, hyper_states):
    """u, v [L, B, d, n] and u_x [B, d, E] from the hyper layer states [L, B, h]."""
    u = np.einsum("lbh,lhdn->lbdn", hyper_states, cell["u_kernel"]) + cell["u_bias"][:, None]
    v = np.einsum("lbh,lhdn->lbdn", hyper_states, cell["v_kernel"]) + cell["v_bias"][:, None]
    u_x = np.einsum("bh,hde->bde", hyper_states[0], cell["u_x_kernel"]) + cell["u_x_bias"]
    return u, v, u_x


def _without_b0(cell):
    """A cell's numpy parameters with layer 0's recurrent bias b_0 set to zero."""
    if "bias_s" in cell:
        return {**cell, "bias_s": np.concatenate([0 * cell["bias_s"][:1], cell["bias_s"][1:]])}
    return {**cell, "hyper": _without_b0(cell["hyper"]), "main": _without_b0(cell["main"])}


def np_core(params, tokens, config, masks=None, original_first_step=False):
    """Reference core outputs [B, T, n] and gates {cell: [B, L, T, width]} (rhn / hyperrhn).

    original_first_step: step 0 runs without b_0 (its states are zero, as in the paper's
    code, whose layer-0 recurrent Linear is skipped there)."""
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
    x_all = p["embed"]["embedding"][tokens]
    batch, length = tokens.shape
    every_step_cell = p["core"]["cell"]
    s_main = np.zeros((batch, config.hidden))
    s_hyper = np.zeros((batch, config.hyper_hidden))
    outputs, gates = [], {"main": [], "hyper": []}
    for step in range(length):
        x = x_all[:, step]
        cell = every_step_cell
        if original_first_step and step == 0:
            cell = _without_b0(every_step_cell)

        def gate(name, step=step):
            return None if masks is None else masks[name][step]

        if config.type == "rhn":
            s_main, _, g = _np_highway_step(cell, s_main, x, None, gate("main"))
        else:
            hyper_x = x
            if config.hyper_input == "x_and_state":
                hyper_x = np.concatenate([x, s_main], -1)
            s_hyper, hyper_states, hg = _np_highway_step(
                cell["hyper"], s_hyper, hyper_x, None, gate("hyper")
            )
            gates["hyper"].append(hg)
            if config.hyper_rank > 0:
                lowrank = _np_lowrank_factors(cell, hyper_states)
                s_main, _, g = _np_highway_step(
                    cell["main"], s_main, x, None, gate("main"), lowrank=lowrank
                )
            else:
                z = (
                    np.einsum("lbh,lhn->lbn", hyper_states, cell["proj_kernel"])
                    + cell["proj_bias"][:, None]
                )
                s_main, _, g = _np_highway_step(cell["main"], s_main, x, z, gate("main"))
        gates["main"].append(g)
        outputs.append(s_main)
    gates = {k: np.stack(v, 2) for k, v in gates.items() if v}  # [L, B, T, w]
    return np.stack(outputs, 1), {k: np.swapaxes(v, 0, 1) for k, v in gates.items()}


def _np_lm(params, tokens, config, masks=None):
    """Reference logits [B, T, V] of the whole language model (rhn or hyperrhn)."""
    out, _ = np_core(params, tokens, config, masks)
    head = params["head"]
    return out @ np.asarray(head["kernel"], np.float64) + np.asarray(head["bias"], np.float64)


@pytest.mark.parametrize("model_type", ["rhn", "hyperrhn"])
@pytest.mark.parametrize("hyper_input", ["x", "x_and_state"])
@pytest.mark.parametrize("depth", [1, 3])
def test_logits_match_numpy_reference(model_type, hyper_input, depth):
    config = tiny(type=model_type, hyper_input=hyper_input, depth=depth)
    seed = 100 * depth + len(hyper_input) + len(model_type)
    model, params = init(config, seed)
    tokens = np.random.default_rng(seed).integers(0, config.vocab_size, (3, 7))
    logits, _ = model.apply({"params": params}, jnp.asarray(tokens))
    np.testing.assert_allclose(logits, _np_lm(params, tokens, config), rtol=2e-5, atol=2e-5)


def test_gate_dropout_uses_fresh_masks_per_layer_and_step_and_matches_reference():
    config = tiny(keep=0.5)
    model, params = init(config, 3)
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


def _recorded_gates(model, params, tokens, **apply_kw):
    """{cell: [B, L, T, width]} sown by the model's cells in one forward pass."""
    _, state = model.apply(
        {"params": params}, tokens, mutable=[models.GATES_COLLECTION], **apply_kw
    )
    cell = state[models.GATES_COLLECTION]["core"]["cell"]
    recorded = {"main": cell} if models.GATES_NAME in cell else cell
    return {
        name: np.transpose(v[models.GATES_NAME][0], (2, 1, 0, 3)) for name, v in recorded.items()
    }


@pytest.mark.parametrize(
    ("model_type", "rank", "hyper_input"),
    [("rhn", 0, "x"), ("hyperrhn", 0, "x"), ("hyperrhn", 0, "x_and_state"), ("hyperrhn", 2, "x")],
)
def test_recorded_transform_gates_match_numpy_reference(model_type, rank, hyper_input):
    config = tiny(type=model_type, hyper_rank=rank, hyper_input=hyper_input)
    model, params = init(config, 7 + rank)
    if rank:  # move u off its constant init so that the rank-d scaling is not a column scaling
        cell = dict(params["core"]["cell"])
        for name in ("u_kernel", "u_x_kernel"):
            noise = jax.random.normal(jax.random.key(len(name)), cell[name].shape)
            cell[name] = 0.5 * noise
        params = {**params, "core": {"cell": cell}}
    tokens = np.random.default_rng(rank).integers(0, config.vocab_size, (3, 6))
    recorded = _recorded_gates(model, params, jnp.asarray(tokens))
    _, expected = np_core(params, tokens, config)
    assert (
        set(recorded) == set(expected) == ({"main", "hyper"} if model_type != "rhn" else {"main"})
    )
    for name, gates in recorded.items():
        width = config.hidden if name == "main" else config.hyper_hidden
        assert gates.shape == (3, config.depth, 6, width)
        np.testing.assert_allclose(gates, expected[name], rtol=2e-5, atol=2e-6)


def test_recorded_gates_are_taken_before_dropout():
    config = tiny(type="rhn", keep=0.5)
    model, params = init(config, 3)
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, config.vocab_size, (2, 5)))
    plain = _recorded_gates(model, params, tokens)
    rngs = {"dropout": jax.random.key(1)}
    dropped = _recorded_gates(model, params, tokens, train=True, rngs=rngs)
    # layer 0 of the first step reads only x and the zero state: dropout cannot change it yet
    np.testing.assert_allclose(dropped["main"][:, 0, 0], plain["main"][:, 0, 0], rtol=1e-6)
    # later layers read dropped states: their gates differ, but are gates (0 < t < 1),
    # not dropped gates (0 or t / keep)
    assert not np.allclose(dropped["main"][:, 1:], plain["main"][:, 1:])
    assert np.all((dropped["main"] > 0) & (dropped["main"] < 1))


# ----------------------------------------------------------------------------- original t = 0


def _np_original_cell(w, s, x, z=None, gate_masks=None):
    """One step of the paper code's RHN cell (models/RHN.py, HyperRHN.py HyperCell), written
    as that code reads: `Ws = cell[l](s) if s is not 0 else 0`, so at a sequence's first
    step (s is the integer 0) layer 0's recurrent Linear, bias included, is skipped;
    HyperLinear scales `W s` by [z, z] and then adds its bias; `inp` adds x U (scaled) + b_U.
    Returns (s [B, n], layer states [L, B, n])."""
    states = []
    for layer in range(w["kernel_s"].shape[0]):
        zz = 1.0 if z is None else np.concatenate([z[layer], z[layer]], -1)
        # `if s is not 0`: the integer 0 the code starts from, not a zero tensor
        ws = 0 if isinstance(s, int) else (s @ w["kernel_s"][layer]) * zz + w["bias_s"][layer]
        if layer == 0:
            ws = ws + (x @ w["kernel_x"]) * zz + w["bias_x"]
        n = ws.shape[-1] // 2
        h, t = np.tanh(ws[:, :n]), _sigmoid(ws[:, n:])
        c = 1.0 - t
        if gate_masks is not None:
            t = t * gate_masks[layer]
        s = h * t + s * c
        states.append(s)
    return s, np.stack(states)


def _np_original_lm(params, tokens, config, masks=None):
    """Logits [B, T, V] of the paper code's model: the state starts as the integer 0."""
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
    x_all, cell = p["embed"]["embedding"][tokens], p["core"]["cell"]
    s_main = s_hyper = 0
    outputs = []
    for step in range(tokens.shape[1]):
        x = x_all[:, step]

        def gate(name, step=step):
            return None if masks is None else masks[name][step]

        if config.type == "rhn":
            s_main, _ = _np_original_cell(cell, s_main, x, None, gate("main"))
        else:
            s_hyper, hyper_states = _np_original_cell(
                cell["hyper"], s_hyper, x, None, gate("hyper")
            )
            z = (
                np.einsum("lbh,lhn->lbn", hyper_states, cell["proj_kernel"])
                + cell["proj_bias"][:, None]
            )
            s_main, _ = _np_original_cell(cell["main"], s_main, x, z, gate("main"))
        outputs.append(s_main)
    return np.stack(outputs, 1) @ p["head"]["kernel"] + p["head"]["bias"]


def _nonzero_biases(params, seed):
    """`params` with every bias_s drawn away from its init, so a missing or extra b_0 shows."""
    rng = np.random.default_rng(seed)

    def draw(path, leaf):
        name = jax.tree_util.keystr(path)
        return jnp.asarray(rng.normal(0, 0.5, leaf.shape), leaf.dtype) if "bias_s" in name else leaf

    return jax.tree_util.tree_map_with_path(draw, params)


@pytest.mark.parametrize("model_type", ["rhn", "hyperrhn"])
@pytest.mark.parametrize("keep", [1.0, 0.6])
def test_original_first_step_matches_the_paper_code_and_the_default_does_not(model_type, keep):
    config = tiny(type=model_type, original_first_step=True, keep=keep)
    model, params = init(config, 11 + len(model_type))
    params = _nonzero_biases(params, 5)
    batch, length = 3, 6
    tokens = np.random.default_rng(2).integers(0, config.vocab_size, (batch, length))
    masks, kwargs = None, {}
    if keep < 1.0:
        key = jax.random.key(9)
        kwargs = dict(train=True, rngs={"dropout": key})
        dkey = model.apply(
            {"params": params}, method=lambda m: m.make_rng("dropout"), rngs={"dropout": key}
        )
        masks = {}
        for name, which, width in (
            ("main", models.DropoutKeys.MAIN_GATE, config.hidden),
            ("hyper", models.DropoutKeys.HYPER_GATE, config.hyper_hidden),
        ):
            k = models.DropoutKeys.get(dkey, which)
            shape = (config.depth, batch, width)
            masks[name] = [np.asarray(cells.gate_masks(k, t, shape, keep)) for t in range(length)]
    expected = _np_original_lm(params, tokens, config, masks)
    logits, _ = model.apply({"params": params}, jnp.asarray(tokens), **kwargs)
    np.testing.assert_allclose(logits, expected, rtol=2e-5, atol=2e-5)
    default = init(tiny(type=model_type, keep=keep), 0)[0]
    logits_default, _ = default.apply({"params": params}, jnp.asarray(tokens), **kwargs)
    assert np.abs(np.asarray(logits_default)[:, 0] - expected[:, 0]).max() > 1e-3


@pytest.mark.parametrize("model_type", ["rhn", "hyperrhn"])
def test_original_first_step_keeps_b0_for_a_carried_state(model_type):
    """A stream's later chunks start from a real state: b_0 applies, as in the default."""
    on = tiny(type=model_type, original_first_step=True)
    model_on, params = init(on, 4)
    model_off = init(tiny(type=model_type), 0)[0]
    params = _nonzero_biases(params, 6)
    tokens = jnp.asarray(np.random.default_rng(4).integers(0, on.vocab_size, (2, 8)))
    _, carry = model_on.apply({"params": params}, tokens[:, :4])
    rest_on, _ = model_on.apply({"params": params}, tokens[:, 4:], carry)
    rest_off, _ = model_off.apply({"params": params}, tokens[:, 4:], carry)
    np.testing.assert_array_equal(rest_on, rest_off)


def test_original_first_step_rank_d_matches_reference_without_b0_at_t0():
    """Rank d (not in the paper's code): the same rule, no layer-0 recurrent term on the
    first step's zero state, i.e. the numpy rank-d reference with b_0 = 0 at t = 0 only."""
    config = tiny(hyper_rank=2, original_first_step=True)
    model, params = init(config, 21)
    params = _nonzero_biases(params, 7)
    tokens = np.random.default_rng(8).integers(0, config.vocab_size, (3, 5))
    logits, _ = model.apply({"params": params}, jnp.asarray(tokens))
    head = params["head"]
    out, _ = np_core(params, tokens, config, original_first_step=True)
    expected = out @ np.asarray(head["kernel"], np.float64) + np.asarray(head["bias"], np.float64)
    np.testing.assert_allclose(logits, expected, rtol=2e-5, atol=2e-5)
    assert np.abs(np.asarray(logits)[:, 0] - _np_lm(params, tokens, config)[:, 0]).max() > 1e-3
