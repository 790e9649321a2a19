"""Gradient-flow and gate analysis of trained (or freshly initialised) models.

    python -m rhhjax.tools.analyze --workdir=A [--workdir=B@init ...] [--init=CONFIG ...] --out=DIR
        [--checkpoint=best|latest|init|STEP] [--analyses=weights,gradients,gates,lesion]
        [--data_dir=PTB_DIR] [--prefix=NAME_] [--labels=a,b,...]

Each model ("subject") is one of

    --workdir=DIR[@WHICH]   a training workdir; WHICH (default ``--checkpoint``) is ``best``
                            (falls back to latest), ``latest``, a step number, or ``init``: the
                            parameters the run started from (``config.json``'s seed, through
                            the trainer's own init). A workdir without a checkpoint yet is
                            analysed at init.
    --init=FILE[:VARIANT][,key=value...]
                            a config file at initialisation, e.g.
                            ``configs/ptb.py:cpu,model.type=rhn,model.hidden=256``.

What is computed (all numbers go to ``DIR/<prefix>analysis.json``, figures to PNGs beside it):

    weights    (Suarez 2017 Figs. 2-3) ``weight_norms.png``: the L2 (Frobenius) norm of every
               weight matrix, in forward order, one bar per layer of stacked arrays
               (``kernel_s [L, n, 2n]`` -> W_0 .. W_{L-1}); biases are left out. The JSON also
               holds the RMS entry (norm / sqrt(size), comparable across shapes) and the
               spectral norm.
    gradients  (Figs. 4-6) ``input_gradients.png``: for held-out windows of ``--seq_len``
               characters (evenly spaced over ``--split``, zero initial state, no dropout),
               the mean over windows of ||d loss_{T-1} / d x_t||_2, where loss_{T-1} is the
               cross-entropy of the window's final prediction and x_t the embedded input at
               step t. One curve per model, log scale.
    gates      (RHN paper Fig. 5b) ``gates_<label>.png``: the transform gate t of every
               micro-layer averaged over units, per time step, for the first
               ``--gate_sequences`` windows (RHN and the HyperRHN's main cell; the hyper
               cell's gates are in the JSON). Recomputed from the parameters with
               ``rhhjax.cells`` (the same math as the model).
    lesion     (RHN paper section 6) ``lesion.png``: for each micro-layer, LESION_BIAS is added
               to the t-half of its bias, so t = sigmoid(...) = 0 (the layer only carries),
               and the loss (``rhhjax.evaluate`` windows protocol on the first
               ``--lesion_chars`` characters of ``--split``) is compared with the intact
               model's. ``max_gate`` records the largest t of the lesioned layer over the
               gate windows (0 when the lesion works).

LSTMs have no highway gates: they get weight norms and gradients only.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import json
import math
import re
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rhhjax import data as data_lib
from rhhjax import evaluation as eval_lib
from rhhjax import models
from rhhjax.errors import UserError
from rhhjax.ops import cells

Array = jax.Array

ANALYSES = ("weights", "gradients", "gates", "lesion")
LESION_BIAS = -1e4  # added to the transform-gate bias: sigmoid(-1e4 + a) == 0 in float32
GATED_TYPES = ("rhn", "hyperrhn")
DPI = 80
JSON_FILE = "analysis.json"


class AnalysisError(UserError):
    """Bad input to the analysis (unknown checkpoint, too little data); one line."""


# ----------------------------------------------------------------------------- subjects


@dataclasses.dataclass
class Subject:
    """One model to analyse: its config, parameters, held-out tokens and provenance."""

    label: str
    config: models.ModelConfig
    params: Any
    tokens: np.ndarray  # the held-out split, encoded
    vocab: data_lib.Vocab | None = None
    source: dict = dataclasses.field(default_factory=dict)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "model"


def _config_module(path: str):
    file = Path(path)
    if not file.is_file():
        raise AnalysisError(f"config file {path} not found")
    spec = importlib.util.spec_from_file_location(f"_rhhjax_config_{_slug(file.stem)}", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _parse_value(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def load_config_spec(spec: str) -> ml_collections.ConfigDict:
    """``FILE[:VARIANT][,section.key=value ...]`` -> the config (overrides applied)."""
    head, *overrides = [part for part in spec.split(",") if part]
    path, _, variant = head.partition(":")
    module = _config_module(path)
    config = module.get_config(variant) if variant else module.get_config()
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise AnalysisError(f"override {item!r} in --init={spec} is not key=value")
        *parents, name = key.strip().split(".")
        node = config
        for parent in parents:
            if parent not in node:
                raise AnalysisError(f"--init={spec}: the config has no section {parent!r}")
            node = node[parent]
        if name not in node:
            raise AnalysisError(f"--init={spec}: the config has no field {key!r}")
        try:
            node[name] = _parse_value(value.strip())
        except (TypeError, ValueError) as e:
            raise AnalysisError(f"--init={spec}: cannot set {key}: {e}") from e
    return config


def init_params(model_config: models.ModelConfig, seed: int):
    """The parameters a training run with ``seed`` starts from (the trainer's own init)."""
    from rhhjax.train import step as train_step

    return train_step.make_init(model_config)(train_step.init_key(int(seed)))


@functools.lru_cache(maxsize=8)
def _load_corpus_cached(data_json: str) -> data_lib.Corpus:
    from rhhjax.data import downloads

    return downloads.load_corpus(json.loads(data_json))


def _corpus(cfg: ml_collections.ConfigDict, data_dir: str) -> data_lib.Corpus:
    data = cfg.data.to_dict()
    if data_dir:
        data["dir"] = data_dir
    return _load_corpus_cached(json.dumps(data, sort_keys=True))


def _model_config(fields: dict, impl: str) -> models.ModelConfig:
    overrides = {"impl": impl} if impl else {}
    return models.ModelConfig.from_config(dict(fields), **overrides)


def to_float64(subject: Subject) -> Subject:
    """The subject computed in float64 (needs ``jax_enable_x64``). Load (and initialise) the
    parameters BEFORE enabling x64: under x64 the orthogonal initialiser draws float64
    matrices from different random bits, i.e. not the parameters a run started from."""
    return dataclasses.replace(
        subject,
        config=dataclasses.replace(subject.config, dtype="float64"),
        params=jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), subject.params),
    )


def parse_which(text: str) -> str | int:
    text = str(text).strip()
    if text in ("best", "latest", "init"):
        return text
    if text.isdigit():
        return int(text)
    raise AnalysisError(f"checkpoint must be best, latest, init or a step number, got {text!r}")


def split_workdir_spec(spec: str, default: str) -> tuple[str, str | int]:
    """``DIR[@WHICH]`` -> (DIR, WHICH); a suffix that is no checkpoint name stays in DIR."""
    path, sep, which = spec.rpartition("@")
    if sep and path and (which in ("best", "latest", "init") or which.isdigit()):
        return path, parse_which(which)
    return spec, parse_which(default)


def subject_from_workdir(
    spec: str,
    default_which: str = "best",
    *,
    split: str = "valid",
    data_dir: str = "",
    impl: str = "scan",
    label: str = "",
) -> Subject:
    """A workdir's checkpoint (or its init) as a Subject."""
    from rhhjax.train import checkpoint as ckpt_lib
    from rhhjax.train import loop as trainer

    path, which = split_workdir_spec(spec, default_which)
    workdir = Path(path)
    if not workdir.is_dir():
        raise AnalysisError(f"workdir {workdir} does not exist")
    name = workdir.name
    if which != "init" and not ckpt_lib.has_checkpoint(workdir):
        which = "init"  # nothing saved yet: analyse the run's starting point
    if which == "init":
        config_file = workdir / trainer.CONFIG_FILE
        if not config_file.is_file():
            raise AnalysisError(f"{workdir} has neither a checkpoint nor {trainer.CONFIG_FILE}")
        cfg = trainer.prepare_config(json.loads(config_file.read_text()))
        corpus = _corpus(cfg, data_dir)
        fields = cfg.model.to_dict()
        fields["vocab_size"] = corpus.vocab.size
        mc = _model_config(fields, impl)
        params = init_params(mc, int(cfg.seed))
        source = {"workdir": str(workdir), "checkpoint": "init", "seed": int(cfg.seed)}
        source.update(step=0, epoch=0.0)
        default_label = f"{name} init"
    else:
        if isinstance(which, int):
            params, meta = _restore_step(workdir, which)
            used = f"step {which}"
        else:
            params, meta, used = ckpt_lib.load_for_inference(workdir, which)
        cfg = ml_collections.ConfigDict(meta["config"])
        corpus = _corpus(cfg, data_dir)
        if corpus.vocab.to_dict() != meta["vocab"]:
            raise AnalysisError(
                f"the data's vocabulary ({corpus.vocab.size} symbols) differs from the "
                f"checkpoint's in {workdir}: pass --data_dir with the training data"
            )
        mc = _model_config(meta["model"], impl)
        step, epoch = int(meta["step"]), float(meta.get("epoch", float("nan")))
        source = {"workdir": str(workdir), "checkpoint": used, "step": step, "epoch": epoch}
        default_label = f"{name} step {step} (ep {epoch:.2f})"
    return Subject(
        label=label or default_label,
        config=mc,
        params=params,
        tokens=corpus.split(split),
        vocab=corpus.vocab,
        source=source,
    )


def _restore_step(workdir: Path, step: int):
    from rhhjax.train import checkpoint as ckpt_lib

    with ckpt_lib.Checkpoints(workdir, read_only=True) as ckpts:
        for which in ("latest", "best"):
            if step in ckpts.steps(which):
                params, meta = ckpts.restore_params(which, step)
                return params, meta
        available = sorted(set(ckpts.steps("latest")) | set(ckpts.steps("best")))
    raise AnalysisError(f"no checkpoint of step {step} in {workdir} (saved steps: {available})")


def subject_from_config(
    spec: str,
    *,
    split: str = "valid",
    data_dir: str = "",
    impl: str = "scan",
    label: str = "",
) -> Subject:
    """A config (``FILE[:VARIANT][,key=value ...]``) at initialisation as a Subject."""
    from rhhjax.train import loop as trainer

    cfg = trainer.prepare_config(load_config_spec(spec))
    corpus = _corpus(cfg, data_dir)
    fields = cfg.model.to_dict()
    fields["vocab_size"] = corpus.vocab.size
    mc = _model_config(fields, impl)
    params = init_params(mc, int(cfg.seed))
    variant = cfg.get("variant", "") or ""
    default_label = f"{mc.type} {variant} init".replace("  ", " ")
    return Subject(
        label=label or default_label,
        config=mc,
        params=params,
        tokens=corpus.split(split),
        vocab=corpus.vocab,
        source={"config": spec, "checkpoint": "init", "seed": int(cfg.seed), "step": 0},
    )


# ----------------------------------------------------------------------------- data


def heldout_windows(tokens: np.ndarray, count: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` windows of ``length`` inputs (+ targets shifted by one), evenly spaced over
    ``tokens`` (deterministic). Returns (inputs, targets) int32 [count, length] and the start
    positions [count]."""
    tokens = np.asarray(tokens)
    if count < 1 or length < 1:
        raise AnalysisError(f"need count >= 1 and length >= 1, got {count}, {length}")
    last = len(tokens) - length - 1
    if last < 0:
        raise AnalysisError(f"the split has {len(tokens)} symbols; windows need {length + 1}")
    starts = np.linspace(0, last, count).round().astype(np.int64)
    idx = starts[:, None] + np.arange(length + 1)[None, :]
    rows = tokens[idx].astype(np.int32)
    return rows[:, :-1], rows[:, 1:], starts


# ----------------------------------------------------------------------------- weight norms

_ORDER = {
    "embed": 0,
    "core": 1,
    "head": 2,
    "hyper": 0,
    "proj_kernel": 1,
    "main": 2,
    "kernel_x": 0,
    "kernel_h": 1,
    "kernel_s": 1,
    "embedding": 0,
    "kernel": 0,
}
_SHORT = {
    "embedding": "E",
    "kernel_x": "U",
    "kernel_s": "W",
    "proj_kernel": "P",
    "kernel_h": "Wh",
    "kernel": "out",
}


def _order_key(path: tuple[str, ...]) -> tuple:
    key = []
    for part in path:
        m = re.fullmatch(r"layers_(\d+)", part)
        key.append((int(m.group(1)), "") if m else (_ORDER.get(part, 9), part))
    return tuple(key)


def weight_norms(params, depth: int | None = None) -> list[dict]:
    """One record per weight matrix (per layer l of stacked [L, ., .] arrays), in forward order.

    An array of 3+ dims counts as stacked when its leading axis is ``depth`` (or, without ``depth``,
    always); other arrays are one matrix [shape[0], rest].

    Record: name (parameter path), layer (index into a stacked array, or None), label (short,
    for plots), block (cell / layer it belongs to), shape, fro (L2 / Frobenius norm), rms
    (fro / sqrt(size)), spectral (largest singular value).
    """
    from flax import traverse_util

    flat = traverse_util.flatten_dict(jax.device_get(params))
    out = []
    for path in sorted(flat, key=_order_key):
        name = path[-1]
        array = np.asarray(flat[path], dtype=np.float64)
        if "bias" in name or array.ndim < 2:
            continue
        parts = [p for p in path[:-1] if p not in ("core", "cell")]
        block = "/".join(parts) or path[0]
        if path[:2] == ("core", "cell") and not parts:  # RHN cell / HyperRHN projections
            block = "proj" if name == "proj_kernel" else "cell"
        if name == "kernel_x" and any(p.startswith("layers_") for p in path):
            short = "Wx"
        else:
            short = _SHORT.get(name, name)
        stacked = array.ndim >= 3 and (depth is None or array.shape[0] == depth)
        matrices = list(enumerate(array)) if stacked else [(None, array)]
        for layer, m in matrices:
            m = m.reshape(m.shape[0], -1)
            fro = float(np.linalg.norm(m))
            out.append(
                {
                    "name": "/".join(path),
                    "layer": layer,
                    "block": block,
                    "label": f"{block} {short}{'' if layer is None else layer}",
                    "shape": list(m.shape),
                    "fro": fro,
                    "rms": fro / math.sqrt(m.size),
                    "spectral": float(np.linalg.norm(m, 2)),
                }
            )
    return out


# ----------------------------------------------------------------------------- input gradients


def _forward_from_embeddings(module: models.CharLM, x: Array) -> Array:
    """Logits [B, T, V] of embedded inputs x [B, T, E], zero initial state, no dropout."""
    carry = module.initial_carry(x.shape[0])
    outputs, _ = module.core(x, carry, None)
    return module.head(outputs)


def _embed(module: models.CharLM, tokens: Array) -> Array:
    return module.embed(tokens)


def final_step_loss(model_config: models.ModelConfig) -> Callable:
    """``(params, x [B, T, E], targets [B, T]) -> [B]``: cross-entropy of the last step."""
    model = models.build_model(model_config)

    def loss(params, x, targets):
        logits = model.apply({"params": params}, x, method=_forward_from_embeddings)
        logp = jax.nn.log_softmax(logits[:, -1].astype(x.dtype), axis=-1)
        return -jnp.take_along_axis(logp, targets[:, -1:], axis=-1)[:, 0]

    return loss


def embed_fn(model_config: models.ModelConfig) -> Callable:
    """``(params, tokens [B, T]) -> x [B, T, E]``: the model's embedding."""
    model = models.build_model(model_config)
    return lambda params, tokens: model.apply({"params": params}, tokens, method=_embed)


def scaled_norm(g: Array) -> Array:
    """L2 norm over the last axis, scaled by the largest entry first: the squares of entries
    below ~1e-19 underflow in float32 (and XLA:CPU flushes subnormals to zero), which makes a
    plain ``sqrt(sum(g**2))`` exactly 0 for small but representable gradients."""
    scale = jnp.max(jnp.abs(g), axis=-1, keepdims=True)
    safe = jnp.where(scale > 0, scale, 1.0)
    return scale[..., 0] * jnp.sqrt(jnp.sum(jnp.square(g / safe), axis=-1))


@functools.lru_cache(maxsize=16)
def make_input_gradient_norms(model_config: models.ModelConfig) -> Callable:
    """Jitted ``(params, inputs [B, T], targets [B, T]) -> (norms [B, T], loss [B])``.

    ``norms[b, t] = || d loss_{b, T-1} / d x_{b, t} ||_2``. Rows do not interact (no
    batch statistics), so one backward pass of the batch sum gives every row's gradient.
    """
    loss = final_step_loss(model_config)
    embed = embed_fn(model_config)

    def fn(params, inputs, targets):
        x = embed(params, inputs)
        losses, vjp = jax.vjp(lambda x: loss(params, x, targets), x)
        (grad,) = vjp(jnp.ones_like(losses))
        return scaled_norm(grad), losses

    return jax.jit(fn)


def input_gradients(subject: Subject, sequences: int, seq_len: int, batch_size: int) -> dict:
    """Mean (over held-out windows) L2 norm of d loss_{T-1} / d x_t for every t."""
    inputs, targets, starts = heldout_windows(subject.tokens, sequences, seq_len)
    fn = make_input_gradient_norms(subject.config)
    norms, losses = [], []
    for i in range(0, len(inputs), batch_size):
        n, lo = fn(subject.params, inputs[i : i + batch_size], targets[i : i + batch_size])
        norms.append(np.asarray(n, np.float64))
        losses.append(np.asarray(lo, np.float64))
    norms = np.concatenate(norms)
    return {
        "t": list(range(seq_len)),
        "mean_norm": norms.mean(axis=0).tolist(),
        "std_norm": norms.std(axis=0).tolist(),
        "zero_fraction": (norms == 0).mean(axis=0).tolist(),
        "final_step_loss_nats": float(np.concatenate(losses).mean()),
        "sequences": int(len(inputs)),
        "seq_len": int(seq_len),
        "window_starts": starts.tolist(),
    }


# ----------------------------------------------------------------------------- gates


def _highway_weights(tree) -> cells.HighwayWeights:
    return cells.HighwayWeights(tree["kernel_x"], tree["bias_x"], tree["kernel_s"], tree["bias_s"])


def highway_step_with_gates(
    weights: cells.HighwayWeights, s: Array, xproj: Array, z: Array | None, dtype
) -> tuple[Array, Array, Array]:
    """``cells.highway_step`` without dropout that also returns the transform gates.

    Returns (s_new [B, n], layer_states [L, B, n], gates [L, B, n]).
    """
    n = s.shape[-1]
    states, gates = [], []
    for layer in range(weights.kernel_s.shape[0]):
        a = cells.matmul(s, weights.kernel_s[layer], dtype)
        if layer == 0:
            a = a + xproj
        if z is not None:
            a = a * cells.double(z[layer])
        a = a + weights.bias_s[layer]
        if layer == 0:
            a = a + weights.bias_x
        gates.append(jax.nn.sigmoid(a[..., n:]))
        s = cells.highway_gate(a, s, None)
        states.append(s)
    return s, jnp.stack(states), jnp.stack(gates)


def can_trace_gates(model_config: models.ModelConfig) -> bool:
    """RHN, or HyperRHN with the paper's column scaling (not the low-rank ``hyper_rank > 0``
    variant, whose main-cell math lives in ``rhhjax.lowrank``)."""
    if model_config.type == "rhn":
        return True
    return model_config.type == "hyperrhn" and getattr(model_config, "hyper_rank", 0) == 0


@functools.lru_cache(maxsize=16)
def make_gate_trace(model_config: models.ModelConfig) -> Callable:
    """Jitted ``(params, inputs [B, T]) -> {"main": [B, L, T, n], "hyper": ..., "outputs":
    [B, T, n]}``: transform gates of every micro-layer (HyperRHN: main and hyper cell) and the
    cell outputs (equal to the model core's), recomputed from the parameters."""
    mc = model_config
    if not can_trace_gates(mc):
        raise AnalysisError(
            f"gates of model type {mc.type!r} (hyper_rank {getattr(mc, 'hyper_rank', 0)}) "
            "cannot be recomputed"
        )
    dtype = mc.compute_dtype
    embed = embed_fn(mc)

    def trace(params, inputs):
        x = jnp.swapaxes(embed(params, inputs), 0, 1)  # [T, B, E]
        cell = params["core"]["cell"]
        batch = inputs.shape[0]
        carry_dtype = mc.carry_dtype
        if mc.type == "rhn":
            w = _highway_weights(cell)
            xproj = cells.matmul(x, w.kernel_x, dtype)

            def body(s, xp):
                s, _, g = highway_step_with_gates(w, s, xp, None, dtype)
                return s, {"main": g, "outputs": s}

            s0 = jnp.zeros((batch, mc.hidden), carry_dtype)
            _, ys = jax.lax.scan(body, s0, xproj)
        else:
            hw, mw = _highway_weights(cell["hyper"]), _highway_weights(cell["main"])
            e = mc.embed_dim
            hyper_xproj = cells.matmul(x, hw.kernel_x[:e], dtype)
            main_xproj = cells.matmul(x, mw.kernel_x, dtype)

            def body(carry, xps):
                s_h, s_m = carry
                hx, mx = xps
                if mc.hyper_input == "x_and_state":
                    hx = hx + cells.matmul(s_m, hw.kernel_x[e:], dtype)
                s_h, hyper_layers, hg = highway_step_with_gates(hw, s_h, hx, None, dtype)
                z = cells.hyper_scales(cell["proj_kernel"], cell["proj_bias"], hyper_layers, dtype)
                s_m, _, mg = highway_step_with_gates(mw, s_m, mx, z, dtype)
                return (s_h, s_m), {"main": mg, "hyper": hg, "outputs": s_m}

            c0 = (
                jnp.zeros((batch, mc.hyper_hidden), carry_dtype),
                jnp.zeros((batch, mc.hidden), carry_dtype),
            )
            _, ys = jax.lax.scan(body, c0, (hyper_xproj, main_xproj))
        out = {"outputs": jnp.swapaxes(ys.pop("outputs"), 0, 1)}
        for name, g in ys.items():  # [T, L, B, n] -> [B, L, T, n]
            out[name] = jnp.transpose(g, (2, 1, 0, 3))
        return out

    return jax.jit(trace)


def gate_activity(subject: Subject, inputs: np.ndarray, sequences: int) -> dict:
    """Mean transform-gate activity per micro-layer and time step.

    ``sequences``: [{"activity": [L][T] (mean over units), "text"}] for the first
    ``sequences`` rows; ``mean_per_layer``: the mean over all rows, steps and units.
    """
    out = make_gate_trace(subject.config)(subject.params, inputs)
    result = {}
    for cell_name in ("main", "hyper"):
        if cell_name not in out:
            continue
        per_unit = np.asarray(out[cell_name], np.float64).mean(axis=-1)  # [B, L, T]
        rows = []
        for b in range(min(sequences, per_unit.shape[0])):
            text = None
            if subject.vocab is not None:
                decoded = subject.vocab.decode(inputs[b])
                text = decoded if isinstance(decoded, str) else decoded.decode("utf-8", "replace")
            rows.append({"activity": per_unit[b].tolist(), "text": text})
        result[cell_name] = {
            "mean_per_layer": per_unit.mean(axis=(0, 2)).tolist(),
            "std_over_time_per_layer": per_unit.std(axis=2).mean(axis=0).tolist(),
            "sequences": rows,
        }
    return result


# ----------------------------------------------------------------------------- lesioning


def gated_cells(model_config: models.ModelConfig) -> list[tuple[str, tuple[str, ...]]]:
    """(cell name, parameter path of its bias_s) of every highway cell of the model."""
    if model_config.type == "rhn":
        return [("main", ("core", "cell", "bias_s"))]
    if model_config.type == "hyperrhn":
        return [
            ("main", ("core", "cell", "main", "bias_s")),
            ("hyper", ("core", "cell", "hyper", "bias_s")),
        ]
    return []


def lesion_params(model_config: models.ModelConfig, params, cell: str, layer: int):
    """A copy of ``params`` with LESION_BIAS added to the transform-gate half of micro-layer
    ``layer``'s bias in ``cell`` ("main" or "hyper"): that layer's t is 0 (carry only)."""
    paths = dict(gated_cells(model_config))
    if cell not in paths:
        raise AnalysisError(f"model type {model_config.type!r} has no highway cell {cell!r}")
    path = paths[cell]
    new = jax.tree.map(lambda a: a, params)  # fresh containers, shared leaves
    node = new
    for key in path[:-1]:
        node[key] = dict(node[key])
        node = node[key]
    bias = node[path[-1]]
    if not 0 <= layer < bias.shape[0]:
        raise AnalysisError(f"layer {layer} out of range (depth {bias.shape[0]})")
    n = bias.shape[-1] // 2
    node[path[-1]] = jnp.asarray(bias).at[layer, n:].add(LESION_BIAS)
    return new


def heldout_loss(subject: Subject, params, chars: int, seq_len: int, batch_size: int) -> dict:
    """``rhhjax.evaluate`` windows-protocol metrics on the first ``chars`` held-out symbols."""
    tokens = subject.tokens[:chars] if chars else subject.tokens
    return eval_lib.evaluate_tokens(
        subject.config,
        params,
        tokens,
        "windows",
        batch_size=batch_size,
        seq_len=seq_len,
        min_context=min(50, seq_len // 2),
    )


def lesion(
    subject: Subject,
    chars: int,
    seq_len: int,
    batch_size: int,
    gate_inputs: np.ndarray | None = None,
) -> dict:
    """Loss increase when each micro-layer of each highway cell is pushed to carry."""
    base = heldout_loss(subject, subject.params, chars, seq_len, batch_size)
    layers = []
    for cell_name, _ in gated_cells(subject.config):
        depth = subject.config.depth
        for layer in range(depth):
            params = lesion_params(subject.config, subject.params, cell_name, layer)
            m = heldout_loss(subject, params, chars, seq_len, batch_size)
            record = {
                "cell": cell_name,
                "layer": layer,
                "bpc": m["bpc"],
                "nats": m["nats"],
                "delta_bpc": m["bpc"] - base["bpc"],
                "delta_nats": m["nats"] - base["nats"],
            }
            if gate_inputs is not None:
                gates = make_gate_trace(subject.config)(params, gate_inputs)[cell_name]
                record["max_gate"] = float(jnp.max(gates[:, layer]))
            layers.append(record)
    return {
        "protocol": "windows",
        "chars": int(base["chars"]),
        "seq_len": int(seq_len),
        "lesion_bias": LESION_BIAS,
        "baseline": {"bpc": base["bpc"], "nats": base["nats"]},
        "layers": layers,
    }


# ----------------------------------------------------------------------------- figures


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_weight_norms(results: list[dict], path: Path) -> Path:
    plt = _pyplot()
    rows = [r for r in results if r.get("weight_norms")]
    fig, axes = plt.subplots(len(rows), 1, figsize=(8, 2.4 * len(rows) + 0.4), squeeze=False)
    for ax, r in zip(axes[:, 0], rows, strict=True):
        norms = r["weight_norms"]
        blocks = list(dict.fromkeys(w["block"] for w in norms))
        colours = {b: f"C{i % 10}" for i, b in enumerate(blocks)}
        xs = np.arange(len(norms))
        ax.bar(xs, [w["fro"] for w in norms], color=[colours[w["block"]] for w in norms])
        ax.set_xticks(xs)
        ax.set_xticklabels([w["label"] for w in norms], rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("L2 norm")
        ax.set_title(f"{r['label']} ({r['num_params']:,} params)", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("Frobenius norm of each weight matrix (forward order)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def plot_input_gradients(results: list[dict], path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        g = r.get("input_gradients")
        if not g:
            continue
        y = np.asarray(g["mean_norm"], np.float64)
        y = np.where(y > 0, y, np.nan)  # log scale: underflowed zeros are left out
        ax.semilogy(g["t"], y, label=r["label"])
    g0 = next(r["input_gradients"] for r in results if r.get("input_gradients"))
    ax.set_xlabel(f"input time step t (loss at the final step t = {g0['seq_len'] - 1})")
    ax.set_ylabel("mean ||d loss_T / d x_t||_2")
    ax.set_title(f"Gradient of the final-step loss w.r.t. each input ({g0['sequences']} windows)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def plot_gates(result: dict, path: Path) -> Path:
    plt = _pyplot()
    rows = result["gates"]["main"]["sequences"]
    fig, axes = plt.subplots(
        len(rows), 1, figsize=(8, 0.9 * len(rows) + 1.2), squeeze=False, layout="constrained"
    )
    image = None
    for i, (ax, row) in enumerate(zip(axes[:, 0], rows, strict=True)):
        activity = np.asarray(row["activity"])
        image = ax.imshow(
            activity, aspect="auto", cmap="Reds", vmin=0.0, vmax=1.0, interpolation="nearest"
        )
        ax.set_ylabel(chr(ord("A") + i % 26), rotation=0, labelpad=10)
        ax.set_yticks(range(activity.shape[0]))
        ax.tick_params(labelsize=6)
        if i < len(rows) - 1:
            ax.set_xticklabels([])
    axes[-1, 0].set_xlabel("time step (rows: micro-layer 0 at top)")
    fig.suptitle(f"Mean transform-gate activity: {result['label']}", fontsize=10)
    if image is not None:
        fig.colorbar(image, ax=axes[:, 0].tolist(), fraction=0.03, pad=0.01, label="mean t")
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def plot_lesion(results: list[dict], path: Path) -> Path:
    plt = _pyplot()
    rows = [r for r in results if r.get("lesion")]
    fig, axes = plt.subplots(1, len(rows), figsize=(3.2 * len(rows) + 0.6, 3.2), squeeze=False)
    for ax, r in zip(axes[0], rows, strict=True):
        les = r["lesion"]
        cell_names = list(dict.fromkeys(x["cell"] for x in les["layers"]))
        width = 0.8 / len(cell_names)
        for k, name in enumerate(cell_names):
            items = [x for x in les["layers"] if x["cell"] == name]
            xs = np.array([x["layer"] for x in items]) + (k - (len(cell_names) - 1) / 2) * width
            ax.bar(xs, [x["delta_bpc"] for x in items], width=width, label=f"{name} cell")
        ax.set_xlabel("lesioned micro-layer")
        ax.set_ylabel("BPC increase")
        ax.set_title(f"{r['label']}\nintact {les['baseline']['bpc']:.3f} BPC", fontsize=8)
        ax.set_xticks(range(max(x["layer"] for x in les["layers"]) + 1))
        ax.grid(axis="y", alpha=0.3)
        if len(cell_names) > 1:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- driver


@dataclasses.dataclass
class Settings:
    analyses: tuple[str, ...] = ANALYSES
    split: str = "valid"
    seq_len: int = 100
    grad_sequences: int = 64
    gate_sequences: int = 4
    lesion_chars: int = 20_000
    batch_size: int = 32


def analyse(subject: Subject, settings: Settings, log: Callable[[str], None] = print) -> dict:
    """Every requested analysis of one subject, as a JSON-ready dict."""
    mc = subject.config
    result = {
        "label": subject.label,
        "type": mc.type,
        "num_params": models.count_params(subject.params),
        "model": dataclasses.asdict(mc),
        "source": subject.source,
    }
    gated = mc.type in GATED_TYPES
    if "weights" in settings.analyses:
        start = time.time()
        depth = mc.depth if mc.type in GATED_TYPES else None
        result["weight_norms"] = weight_norms(subject.params, depth)
        log(f"  weight norms ({len(result['weight_norms'])} matrices, {time.time() - start:.1f}s)")
    if "gradients" in settings.analyses:
        start = time.time()
        result["input_gradients"] = input_gradients(
            subject, settings.grad_sequences, settings.seq_len, settings.batch_size
        )
        g = result["input_gradients"]["mean_norm"]
        log(f"  input gradients: t=0 {g[0]:.3g}, t=T-1 {g[-1]:.3g} ({time.time() - start:.1f}s)")
    gate_inputs = None
    traceable = can_trace_gates(mc)
    if gated and not traceable:
        log("  gates: not recomputed for this model (low-rank HyperRHN); lesion without max_gate")
    if traceable and ("gates" in settings.analyses or "lesion" in settings.analyses):
        count = max(settings.gate_sequences, 1)
        gate_inputs, _, starts = heldout_windows(subject.tokens, count, settings.seq_len)
    if traceable and "gates" in settings.analyses:
        start = time.time()
        result["gates"] = gate_activity(subject, gate_inputs, settings.gate_sequences)
        result["gates"]["window_starts"] = starts.tolist()
        means = ", ".join(f"{v:.2f}" for v in result["gates"]["main"]["mean_per_layer"])
        log(f"  gates: mean per layer [{means}] ({time.time() - start:.1f}s)")
    if gated and "lesion" in settings.analyses:
        start = time.time()
        result["lesion"] = lesion(
            subject, settings.lesion_chars, settings.seq_len, settings.batch_size, gate_inputs
        )
        deltas = ", ".join(
            f"{x['cell'][0]}{x['layer']} {x['delta_bpc']:+.3f}" for x in result["lesion"]["layers"]
        )
        log(
            f"  lesion (baseline {result['lesion']['baseline']['bpc']:.3f} BPC): {deltas} "
            f"({time.time() - start:.1f}s)"
        )
    return result


def write_outputs(results: list[dict], out: Path, prefix: str = "", meta: dict | None = None):
    """Figures and ``<prefix>analysis.json`` into ``out``; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if any(r.get("weight_norms") for r in results):
        written.append(plot_weight_norms(results, out / f"{prefix}weight_norms.png"))
    if any(r.get("input_gradients") for r in results):
        written.append(plot_input_gradients(results, out / f"{prefix}input_gradients.png"))
    for r in results:
        if r.get("gates"):
            written.append(plot_gates(r, out / f"{prefix}gates_{_slug(r['label'])}.png"))
    if any(r.get("lesion") for r in results):
        written.append(plot_lesion(results, out / f"{prefix}lesion.png"))
    path = out / f"{prefix}{JSON_FILE}"
    payload = {**(meta or {}), "models": results}
    path.write_text(json.dumps(payload, indent=1, allow_nan=True) + "\n")
    written.append(path)
    return written


def run(
    workdirs: Sequence[str],
    inits: Sequence[str],
    out: str | Path,
    *,
    checkpoint: str = "best",
    settings: Settings | None = None,
    data_dir: str = "",
    impl: str = "scan",
    float64: bool = False,
    labels: Sequence[str] = (),
    prefix: str = "",
    log: Callable[[str], None] = print,
    command: str | None = None,
) -> list[Path]:
    """Load every subject, analyse it and write the figures and JSON into ``out``.

    ``command``: recorded in the JSON (default: this process's command line)."""
    settings = settings or Settings()
    for name in settings.analyses:
        if name not in ANALYSES:
            raise AnalysisError(f"unknown analysis {name!r}: expected {', '.join(ANALYSES)}")
    specs = [("workdir", w) for w in workdirs] + [("init", c) for c in inits]
    if not specs:
        raise AnalysisError("nothing to analyse: give --workdir and/or --init")
    if labels and len(labels) != len(specs):
        raise AnalysisError(f"{len(labels)} labels for {len(specs)} models")
    parse_which(checkpoint)
    common = dict(split=settings.split, data_dir=data_dir, impl=impl)
    subjects = []
    for i, (kind, spec) in enumerate(specs):
        label = labels[i] if labels else ""
        if kind == "workdir":
            subjects.append(subject_from_workdir(spec, checkpoint, label=label, **common))
        else:
            subjects.append(subject_from_config(spec, label=label, **common))
    if float64:  # only after loading: see to_float64
        jax.config.update("jax_enable_x64", True)
        subjects = [to_float64(s) for s in subjects]
    results = []
    for (kind, spec), subject in zip(specs, subjects, strict=True):
        count = models.count_params(subject.params)
        log(f"{subject.label}: {subject.config.type}, {count:,} parameters ({kind} {spec})")
        results.append(analyse(subject, settings, log))
    meta = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": shlex.join(sys.argv) if command is None else command,
        "settings": dataclasses.asdict(settings),
        "jax_backend": jax.default_backend(),
        "float64": float64,
    }
    written = write_outputs(results, Path(out), prefix, meta)
    for path in written:
        log(f"wrote {path}")
    return written
