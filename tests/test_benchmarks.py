"""The training-step benchmark (benchmarks/bench.py): its FLOP count against XLA's, and that it
times the very step ``train.py`` trains (``rhhjax.train.step``)."""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rhhjax import models
from rhhjax.train import step as train_step

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench  # noqa: E402


def _forward_flops_by_xla(config: models.ModelConfig, batch: int) -> float:
    """XLA's FLOP count of the forward pass over ONE time step (a loop body is counted once,
    so one step keeps the count exact)."""
    model = models.build_model(config)
    params = train_step.make_init(config)(train_step.init_key(0))
    tokens = jnp.zeros((batch, 1), jnp.int32)
    forward = jax.jit(lambda p, t: model.apply({"params": p}, t, None, train=False)[0])
    return float(forward.lower(params, tokens).compile().cost_analysis()["flops"])


@pytest.mark.parametrize("model_type", ["rhn", "hyperrhn"])
def test_flops_per_step_matches_xla_count_of_the_forward(model_type):
    config = models.ModelConfig(
        type=model_type, vocab_size=50, embed_dim=27, hidden=128, hyper_hidden=32, depth=2
    )
    counted = bench.flops_per_step(config, batch=8, length=1) / 3.0  # forward only
    by_xla = _forward_flops_by_xla(config, batch=8)
    # XLA also counts the gates' elementwise work: a few percent at this width
    assert counted <= by_xla <= 1.08 * counted


def test_time_step_runs_the_trained_step(monkeypatch):
    calls = []
    real = train_step.make_train_step

    def spy(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(bench, "make_train_step", spy)
    config = bench.model_config("hyperrhn", "small", "scan", "float32")
    config = models.ModelConfig(**{**config.__dict__, "hidden": 16, "hyper_hidden": 8})
    compile_s, times = bench.time_step(config, batch=4, length=5, repeats=2)
    assert len(calls) == 1 and calls[0][0] == config
    assert calls[0][1] == bench.paper_optimizer()  # the paper's clipping and Adam
    assert calls[0][1].clip_type == "l1" and calls[0][1].clip_norm == 10.0
    assert len(times) == 2 and compile_s > 0 and all(t > 0 for t in times)


def test_step_inputs_abstract_matches_concrete_shapes():
    config = models.ModelConfig(type="hyperrhn", hidden=16, hyper_hidden=8, depth=2)
    oc = bench.paper_optimizer()
    concrete = train_step.step_inputs(config, oc, batch=3, length=7)
    abstract = train_step.step_inputs(config, oc, batch=3, length=7, abstract=True)
    shapes = jax.tree.map(lambda x: (np.shape(x), jnp.result_type(x)), concrete)
    assert shapes == jax.tree.map(lambda x: (x.shape, x.dtype), abstract)


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="CPU plan only")
def test_plan_runs_pallas_only_at_small_size_on_cpu():
    rows = bench.plan(["scan", "pallas"], ["rhn"], ["paper", "small"], ["float32"])
    assert ("pallas", "rhn", "paper", "float32") not in rows
    assert ("pallas", "rhn", "small", "float32") in rows
    assert ("scan", "rhn", "paper", "float32") in rows
