"""The training-step benchmark and its instruments (benchmarks/bench.py): its FLOP count
against XLA's, that it times the very step ``train.py`` trains (``rhhjax.train.step``), that
the GEMM loop keeps every GEMM in the loop, the phase arithmetic, the command-buffer flag."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from benchmark_scripts import load

from rhhjax import models
from rhhjax.ops import persistent
from rhhjax.train import step as train_step

bench = load("bench")
hl = load("hlo.launches")


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


def test_a_row_at_its_own_batch_and_length_traces_its_extra_steps_into_a_folder_named_after_it(
    monkeypatch, tmp_path
):
    """``--batch`` and ``--seq_len`` set the step's shape (and its FLOPs), ``--profile_dir``
    traces ``--profile_steps`` more steps after the timed ones, into a folder named after the
    row, which `benchmarks/profile_summary.py` reads: the jitted step in every traced step."""
    monkeypatch.setitem(bench.SIZES, "small", (16, 8, 2, 4, 50))
    row = bench.time_row("fused", "rhn", "small", "float32", 1, 0.0, 0, 7, str(tmp_path), 3, 6)
    name = "fused_rhn_r0_small_float32_B6_T7"
    assert row.seq_len == 7 and row.batch == 6 and row.profile == f"{tmp_path}/{name}"
    config = bench.model_config("rhn", "small", "fused", "float32")
    assert row.flops_per_step == bench.flops_per_step(config, 6, 7)
    assert " 6 float32" in bench.format_table([row])  # the batch column
    summary = load("profile_summary").main([str(tmp_path), "--steps", "3"])
    assert [s["name"] for s in summary] == [name]
    events = {e["name"]: e["count"] for line in summary[0]["lines"] for e in line["top"]}
    assert events["PjitFunction(jit(step_fn))"] >= 1  # a step's count: per traced step


def test_the_profile_summary_of_a_folder_without_a_trace_is_one_error_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        load("profile_summary").main([str(tmp_path)])
    assert exit_info.value.code == 1
    assert capsys.readouterr().err == f"error: no *.xplane.pb under {tmp_path}\n"


def test_step_inputs_abstract_matches_concrete_shapes():
    config = models.ModelConfig(type="hyperrhn", hidden=16, hyper_hidden=8, depth=2)
    oc = bench.paper_optimizer()
    concrete = train_step.step_inputs(config, oc, batch=3, length=7)
    abstract = train_step.step_inputs(config, oc, batch=3, length=7, abstract=True)
    shapes = jax.tree.map(lambda x: (np.shape(x), jnp.result_type(x)), concrete)
    assert shapes == jax.tree.map(lambda x: (x.shape, x.dtype), abstract)


def test_plan_runs_hyperrhn_once_per_rank_and_leaves_out_mosaic_with_a_rank():
    rows = bench.plan(["scan", "mosaic"], ["rhn", "hyperrhn"], ["small"], ["float32"], [0, 4])
    assert ("mosaic", "hyperrhn", "small", "float32", 0) in rows
    assert ("scan", "hyperrhn", "small", "float32", 4) in rows
    assert ("mosaic", "hyperrhn", "small", "float32", 4) not in rows  # the config rejects it
    assert [r for r in rows if r[1] == "rhn"] == [  # rhn has no rank: one row per impl
        ("scan", "rhn", "small", "float32", 0),
        ("mosaic", "rhn", "small", "float32", 0),
    ]


def test_the_retired_pallas_impl_is_one_line_before_any_compile():
    command = [sys.executable, str(bench.__file__), "--impls=fused,pallas"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 1 and len(lines) == 1, run.stderr[-1000:]
    assert lines[0].startswith("error: model.impl='pallas' (Pallas Triton) was retired")
    assert all(f"'{name}'" in lines[0] for name in ("mosaic", "persistent", "fused"))


def test_the_persistent_rows_run_and_record_the_variant_asked_for(monkeypatch):
    winner = "layout=rowgroup,sharing=multicast"
    monkeypatch.setattr(bench, "PERSISTENT_VARIANT", winner)
    config = bench.model_config("hyperrhn", "paper", "persistent", "bfloat16")
    fused = bench.model_config("hyperrhn", "paper", "fused", "bfloat16")
    assert config.persistent == persistent.PersistentVariant(sharing="multicast")
    assert fused.persistent == persistent.PersistentVariant()
    facts = bench.persistent_row_facts(config)
    assert facts == dict(persistent_layout="rowgroup", persistent_variant=winner)
    assert set(facts) <= {field.name for field in dataclasses.fields(bench.Row)}
    assert bench.persistent_row_facts(fused) == {}


def test_a_bad_persistent_variant_is_one_line_before_any_compile():
    command = [sys.executable, str(bench.__file__), "--persistent_variant=layout=diagonal"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 1 and len(lines) == 1, run.stderr[-1000:]
    assert lines[0].startswith("error: --persistent_variant=layout=diagonal: layout=")
