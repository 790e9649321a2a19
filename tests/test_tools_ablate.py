"""The ablation runner on the tiny PTB config (real PTB; skipped when absent)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rhhjax import configs
from rhhjax.tools import ablate

ROOT = Path(__file__).resolve().parents[1]
PTB_DIR = Path(os.environ.get("RHHJAX_PTB_DIR", ROOT.parent / "shared" / "data" / "ptb"))
needs_ptb = pytest.mark.skipif(
    not (PTB_DIR / "ptb.train.txt").is_file(), reason=f"no PTB in {PTB_DIR}"
)


def tiny_config():
    config = configs.load("ptb:tiny")
    config.data.dir = str(PTB_DIR)
    config.data.download = False
    config.eval.final_protocols = ""  # the periodic validation (2,000 chars) is enough here
    return config


def test_parse_sweep_converts_to_the_field_type():
    config = tiny_config()
    assert ablate.parse_sweep("model.hyper_rank=1,2,4", config).values == [1, 2, 4]
    assert ablate.parse_sweep("model.keep=0.5,1", config).values == [0.5, 1.0]
    assert ablate.parse_sweep("model.type=rhn,hyperrhn", config).values == ["rhn", "hyperrhn"]
    assert ablate.parse_sweep("data.download=true,no", config).values == [True, False]
    for bad, message in [
        ("model.nope=1", "not in the config"),
        ("model.depth=two", "not a valid int"),
        ("model.depth", "expected FIELD="),
        ("model=1", "section"),
        ("model.depth=2,2", "repeated"),
    ]:
        with pytest.raises(ablate.SweepError, match=message):
            ablate.parse_sweep(bad, config)


def test_plan_is_the_cross_product_with_readable_names():
    config = tiny_config()
    sweeps = [
        ablate.parse_sweep("model.hyper_rank=0,4", config),
        ablate.parse_sweep("model.dropout=gate,none", config),
    ]
    names = [v.name for v in ablate.plan(config, sweeps, None)]
    assert names == [
        "hyper_rank-0_dropout-gate",
        "hyper_rank-0_dropout-none",
        "hyper_rank-4_dropout-gate",
        "hyper_rank-4_dropout-none",
    ]
    seeded = ablate.plan(config, sweeps[:1], [0, 1])
    assert [(v.name, v.seed) for v in seeded][:2] == [
        ("hyper_rank-0_seed-0", 0),
        ("hyper_rank-0_seed-1", 1),
    ]


@needs_ptb
def test_rank_ablation_on_tiny_ptb(tmp_path):
    config = tiny_config()
    messages = []
    rows = ablate.run_ablation(
        config,
        ["model.hyper_rank=0,2"],
        tmp_path,
        max_steps=3,  # the tiny config validates every 3 steps
        log=messages.append,
    )
    assert [r["variant"] for r in rows] == ["hyper_rank-0", "hyper_rank-2"]
    for row in rows:
        assert row["status"] == "finished" and row["steps"] == 3, row
        assert 2.0 < row["best_valid_bpc"] < 7.0  # ~log2(50) = 5.6 after 3 steps
        assert row["params"] > 0 and row["step_s"] > 0 and row["peak_memory_gb"] > 0
        assert (tmp_path / row["variant"] / "metrics.jsonl").exists()
    assert rows[1]["params"] > rows[0]["params"]  # the rank-2 projections
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["sweeps"] == {"model.hyper_rank": [0, 2]}
    assert [r["variant"] for r in saved["rows"]] == ["hyper_rank-0", "hyper_rank-2"]
    table = (tmp_path / "results.md").read_text()
    assert "| hyper_rank-2 |" in table and "best valid BPC" in table
    # Rerunning reuses the finished variants instead of training again.
    again = ablate.run_ablation(
        config, ["model.hyper_rank=0,2"], tmp_path, max_steps=3, memory=False, log=messages.append
    )
    assert [r["best_valid_bpc"] for r in again] == [r["best_valid_bpc"] for r in rows]
    assert any("reusing" in m for m in messages)


@needs_ptb
def test_cli_records_a_failing_variant_and_exits_1(tmp_path):
    command = [
        sys.executable,
        "-m",
        "rhhjax.tools.ablate",
        f"--config={ROOT / 'configs' / 'ptb.py'}:tiny",
        f"--config.data.dir={PTB_DIR}",
        "--config.data.download=false",
        "--config.model.hyper_rank=2",
        "--sweep=model.type=rhn",  # hyper_rank applies to hyperrhn only: a ConfigError
        "--max_steps=1",
        f"--out={tmp_path}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 1, result.stderr[-2000:]
    saved = json.loads((tmp_path / "results.json").read_text())
    (row,) = saved["rows"]
    assert row["status"] == "error" and "hyper_rank" in row["error"]
    assert "error: model.hyper_rank=2" in (tmp_path / "results.md").read_text()
    bad = subprocess.run(
        [*command[:3], command[3], "--sweep=model.depth=x", f"--out={tmp_path}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert bad.returncode != 0 and "not a valid int" in bad.stderr
