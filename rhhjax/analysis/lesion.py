"""Lesioning (RHN paper, section 6): push one micro-layer to carry only and measure the loss."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rhhjax import evaluation as eval_lib
from rhhjax import models
from rhhjax.analysis.gates import make_gate_trace
from rhhjax.analysis.subjects import AnalysisError, Subject

LESION_BIAS = -1e4  # added to the transform-gate bias: sigmoid(-1e4 + a) == 0 in float32


def gated_cells(model_config: models.ModelConfig) -> list[tuple[str, tuple[str, ...]]]:
    if model_config.type == "rhn":
        return [("main", ("core", "cell", "bias_s"))]
    if model_config.type == "hyperrhn":
        return [
            ("main", ("core", "cell", "main", "bias_s")),
            ("hyper", ("core", "cell", "hyper", "bias_s")),
        ]
    return []


def lesion_params(model_config: models.ModelConfig, params, cell: str, layer: int):
    """``params`` with LESION_BIAS on the transform-gate bias of ``layer`` in ``cell``: t = 0."""
    paths = dict(gated_cells(model_config))
    if cell not in paths:
        raise AnalysisError(f"model type {model_config.type!r} has no highway cell {cell!r}")
    path = paths[cell]
    new = jax.tree.map(lambda a: a, params)
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
