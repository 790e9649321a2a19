"""Transform-gate activity (RHN paper, Fig. 5b), read from the gates the cells sow into
"intermediates"; only ``impl="scan"`` records them, so the trace always runs with it."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from rhhjax import models
from rhhjax.analysis.subjects import AnalysisError, Subject

Array = jax.Array

GATED_TYPES = ("rhn", "hyperrhn")


def can_trace_gates(model_config: models.ModelConfig) -> bool:
    """Whether the model has highway gates to record (RHN and HyperRHN of any rank)."""
    return model_config.type in GATED_TYPES


def _core_outputs(module: models.CharLM, tokens: Array) -> Array:
    x = module.embed(tokens)
    outputs, _ = module.core(x, module.initial_carry(tokens.shape[0]), None)
    return outputs


def _recorded(cell_variables: dict) -> Array:
    (gates,) = cell_variables[models.GATES_NAME]
    return jnp.transpose(gates, (2, 1, 0, 3))


@functools.lru_cache(maxsize=16)
def make_gate_trace(model_config: models.ModelConfig) -> Callable:
    """Jitted ``(params, inputs [B, T]) -> {"main": [B, L, T, n], "hyper": [B, L, T, h]}``:
    the transform gates, zero initial state, no dropout."""
    if not can_trace_gates(model_config):
        raise AnalysisError(f"model type {model_config.type!r} has no highway gates")
    model = models.build_model(dataclasses.replace(model_config, impl="scan"))

    def trace(params, inputs):
        _, state = model.apply(
            {"params": params},
            inputs,
            method=_core_outputs,
            mutable=[models.GATES_COLLECTION],
        )
        cell = state[models.GATES_COLLECTION]["core"]["cell"]
        if model_config.type == "rhn":
            return {"main": _recorded(cell)}
        return {name: _recorded(cell[name]) for name in ("main", "hyper")}

    return jax.jit(trace)


def gate_activity(subject: Subject, inputs: np.ndarray, sequences: int) -> dict:
    """Mean gate activity: ``sequences`` [{"activity": [L][T], "text"}] of the first rows and
    ``mean_per_layer``."""
    out = make_gate_trace(subject.config)(subject.params, inputs)
    result = {}
    for cell_name in ("main", "hyper"):
        if cell_name not in out:
            continue
        per_unit = np.asarray(out[cell_name], np.float64).mean(axis=-1)  # [B, L, T]
        rows = []
        for b in range(min(sequences, per_unit.shape[0])):
            rows.append({"activity": per_unit[b].tolist(), "text": _text(subject, inputs[b])})
        result[cell_name] = {
            "mean_per_layer": per_unit.mean(axis=(0, 2)).tolist(),
            "std_over_time_per_layer": per_unit.std(axis=2).mean(axis=0).tolist(),
            "sequences": rows,
        }
    return result


def _text(subject: Subject, row: np.ndarray) -> str | None:
    if subject.vocab is None:
        return None
    decoded = subject.vocab.decode(row)
    return decoded if isinstance(decoded, str) else decoded.decode("utf-8", "replace")
