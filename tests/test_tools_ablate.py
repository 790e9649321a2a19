"""The ablation runner on the tiny PTB config (real PTB; skipped when absent)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import PTB_DIR, ROOT, tiny_run_config

from rhhjax.tools import ablate

needs_ptb = pytest.mark.skipif(
    not (PTB_DIR / "ptb.train.txt").is_file(), reason=f"no PTB in {PTB_DIR}"
)


def tiny_config():
    # the periodic validation (2,000 chars) is enough here
    return tiny_run_config(data__dir=str(PTB_DIR), data__download=False, eval__final_protocols="")


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


def test_field_typos_name_their_flag_and_the_closest_field():
    config = tiny_config()
    cases = [
        (ablate.parse_sweep, "model.hyper_rnk=1,2", "--sweep field 'model.hyper_rnk' is not in "
         "the config (did you mean model.hyper_rank?)"),
        (ablate.parse_sweep, "modl.depth=1,2", "--sweep field 'modl.depth' is not in the "
         "config (did you mean model?)"),
        (ablate.parse_variant, "d:model.dpth=2", "--variant field 'model.dpth' is not in the "
         "config (did you mean model.depth?)"),
        (ablate.parse_variant, "d:model.depth=two", "--variant model.depth: 'two' is not a "
         "valid int"),
        (ablate.parse_variant, "d:model=2", "--variant field 'model' is a section, not a value"),
    ]  # fmt: skip
    for parse, text, message in cases:
        with pytest.raises(ablate.SweepError) as info:
            parse(text, config)
        assert str(info.value) == message


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
    # seed-major: every variant with the first seed before any with the second
    assert [(v.name, v.seed, v.group) for v in seeded] == [
        ("hyper_rank-0_seed-0", 0, "hyper_rank-0"),
        ("hyper_rank-4_seed-0", 0, "hyper_rank-4"),
        ("hyper_rank-0_seed-1", 1, "hyper_rank-0"),
        ("hyper_rank-4_seed-1", 1, "hyper_rank-4"),
    ]


def test_named_variants_change_fields_together_and_cross_the_sweeps():
    config = tiny_config()
    named = [
        ablate.parse_variant("hyperrhn", config),
        ablate.parse_variant("rhn:model.type=rhn,model.hidden=20", config),
    ]
    assert named == [("hyperrhn", {}), ("rhn", {"model.type": "rhn", "model.hidden": 20})]
    sweep = [ablate.parse_sweep("model.depth=1,2", config)]
    plan = ablate.plan(config, sweep, [3, 4], named)
    assert [v.name for v in plan[:4]] == [
        "hyperrhn_depth-1_seed-3",
        "hyperrhn_depth-2_seed-3",
        "rhn_depth-1_seed-3",
        "rhn_depth-2_seed-3",
    ]
    assert plan[2].overrides == {"model.type": "rhn", "model.hidden": 20, "model.depth": 1}
    assert {v.seed for v in plan[4:]} == {4} and plan[6].group == "rhn_depth-1"
    assert [v.name for v in ablate.plan(config, [], None, named)] == ["hyperrhn", "rhn"]
    for bad, message in [
        ("r hn:model.depth=2", "NAME"),
        ("rhn:model.nope=1", "not in the config"),
        ("rhn:model.depth", "not FIELD=VALUE"),
        ("rhn:model.depth=1,model.depth=2", "set twice"),
    ]:
        with pytest.raises(ablate.SweepError, match=message):
            ablate.parse_variant(bad, config)
    with pytest.raises(ablate.SweepError, match="also swept"):
        ablate.plan(config, sweep, None, [("d", {"model.depth": 3})])
    with pytest.raises(ablate.SweepError, match="given twice"):
        ablate.plan(config, [], None, [named[0], named[0]])


def test_table_gives_mean_and_range_over_seeds():
    def row(name, group, bpc):
        final = {f"{s}_{p}": bpc for s, p in ablate.FINAL_COLUMNS}
        return dict(variant=name, group=group, params=10, steps=5, final=final, status="finished")

    rows = [row("a_seed-0", "a", 1.5), row("a_seed-1", "a", 1.7), row("b_seed-0", "b", 2.0)]
    header = dict(config="c", command="x", date="d", device="cpu", budget="b")
    table = ablate.format_markdown(rows, header)
    assert "| a | 2 | 10 (10-10) | 5 (5-5) | - | 1.6000 (1.5000-1.7000) |" in table
    assert "| b | 1 | 10 | 5 | - | 2.0000 |" in table
    widths = {line.count("|") for line in table.splitlines() if line.startswith("| a_seed")}
    assert widths == {table.splitlines()[6].count("|")}  # every run row has the header's columns


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
        assert row["chars_per_sec"] > 0 and 0 < row["train_minutes"] < row["wall_s"] / 60
        assert (tmp_path / row["variant"] / "metrics.jsonl").exists()
    assert rows[1]["params"] > rows[0]["params"]  # the rank-2 projections
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["sweeps"] == {"model.hyper_rank": [0, 2]}
    assert [r["variant"] for r in saved["rows"]] == ["hyper_rank-0", "hyper_rank-2"]
    table = (tmp_path / "results.md").read_text()
    assert "| hyper_rank-2 |" in table and "best periodic valid" in table
    # Rerunning reuses the finished variants instead of training again.
    again = ablate.run_ablation(
        config, ["model.hyper_rank=0,2"], tmp_path, max_steps=3, memory=False, log=messages.append
    )
    assert [r["best_valid_bpc"] for r in again] == [r["best_valid_bpc"] for r in rows]
    assert any("reusing" in m for m in messages)


@needs_ptb
def test_cli_refuses_an_invalid_variant_before_training_and_exits_1(tmp_path):
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
    # an invalid variant is refused before any variant trains, in one line
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: variant type-rhn: model.hyper_rank=2"), line
    assert not (tmp_path / "results.json").exists()
    bad = subprocess.run(
        [*command[:3], command[3], "--sweep=model.depth=x", f"--out={tmp_path}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert bad.returncode != 0 and "not a valid int" in bad.stderr


def test_metrics_summary_reads_speed_training_clock_and_the_validation_curve(tmp_path):
    records = [
        {"kind": "event", "event": "start", "step": 0, "time": 100.0},
        {"kind": "train", "step": 2, "chars_per_sec": 10.0, "train_seconds": 60.0, "time": 160.0},
        {"kind": "valid", "step": 2, "bpc": 3.0, "train_seconds": 60.0, "time": 161.0},
        {"kind": "train", "step": 4, "chars_per_sec": 30.0, "train_seconds": 120.0, "time": 220.0},
        {"kind": "valid", "step": 4, "bpc": 2.5, "train_seconds": 120.0, "time": 221.0},
        {"kind": "valid", "step": 4, "bpc": 2.4, "train_seconds": 120.0, "time": 300.0},  # resumed
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n{cut")
    summary = ablate.metrics_summary(tmp_path, batch=2, seq_len=5)
    assert summary["chars_per_sec"] == 20.0 and summary["step_s"] == 0.5
    assert summary["train_minutes"] == 2.0 and summary["wall_s"] == 200.0
    assert summary["valid_curve"] == [[2, 1.0, 3.0], [4, 2.0, 2.4]]
    header = dict(config="c", command="x", date="d", device="cpu", budget="b", at_steps=[2, 4, 6])
    rows = [dict(variant="a", params=1, steps=4, status="finished", **summary)]
    assert "| a | 3.0000 | 2.4000 | - |" in ablate.format_markdown(rows, header)


@pytest.mark.parametrize("where", ["a file", "read-only"])
def test_an_output_folder_that_cannot_be_written_is_one_line_before_any_variant_trains(
    tmp_path, monkeypatch, where
):
    """--out=A_FILE was a 23-line traceback; now an OutputError before anything runs."""
    from helpers import read_only_folder

    from rhhjax import configs, outputs

    def never(*args, **kwargs):
        raise AssertionError("a variant ran")

    monkeypatch.setattr(ablate, "run_variant", never)
    (tmp_path / "a_file").write_text("x")
    out = tmp_path / "a_file" if where == "a file" else read_only_folder(tmp_path) / "abl"
    with pytest.raises(outputs.OutputError, match=f"--out={out}"):
        ablate.run_ablation(configs.load("ptb:tiny"), ["model.depth=1"], out, memory=False)


@pytest.fixture
def nothing_trains(monkeypatch):
    """run_variant fails the test: a refusal must come before the first variant trains."""

    def never(*args, **kwargs):
        raise AssertionError("a variant ran")

    monkeypatch.setattr(ablate, "run_variant", never)


def test_every_sweep_value_is_checked_before_the_first_variant_trains(tmp_path, nothing_trains):
    """--sweep=model.hidden=8,-1 trained hidden 8, then failed on -1."""
    from rhhjax import configs

    out = tmp_path / "abl"
    with pytest.raises(ablate.SweepError) as info:
        ablate.run_ablation(
            configs.load("ptb:tiny"), ["model.hidden=8,-1"], out, max_steps=2, memory=False
        )
    assert str(info.value).startswith("variant hidden--1: model.hidden=-1 must be a positive")
    assert "nothing was trained" in str(info.value) and "\n" not in str(info.value)
    assert not out.exists()


@pytest.mark.parametrize(
    "budget, needle",
    [
        (dict(max_steps=0), "--max_steps=0 must be >= 1"),
        (dict(max_steps=-5), "--max_steps=-5 must be >= 1"),
        (dict(max_minutes=0.0), "--max_minutes=0.0 must be a finite number > 0"),
    ],
)
def test_a_budget_of_zero_is_refused_not_unlimited(tmp_path, nothing_trains, budget, needle):
    """--max_steps=0 meant no bound (63,770,000 steps, ETA 75 h)."""
    from rhhjax import configs

    with pytest.raises(ablate.SweepError, match=needle):
        ablate.run_ablation(
            configs.load("ptb:tiny"), ["model.depth=1"], tmp_path / "abl", memory=False, **budget
        )


def test_a_variant_that_changes_nothing_is_refused_naming_the_variants():
    """--variant=foo quietly ran the base config."""
    config = tiny_config()
    with pytest.raises(ablate.SweepError) as info:
        ablate.parse_variant("foo", config, ["rhn", "lstm", "cpu", "tiny"])
    assert str(info.value) == (
        "--variant=foo changes no field: give NAME:FIELD=V,FIELD=V (e.g. "
        "rhn:model.type=rhn,model.hidden=280), or base / hyperrhn / foo: for the base config; "
        "the config file's own variants (rhn, lstm, cpu, tiny) are picked with "
        "--config=FILE:VARIANT"
    )
    for base in ("foo:", "base", "hyperrhn"):  # the base config, said so
        assert ablate.parse_variant(base, config)[1] == {}


def test_the_command_refuses_a_variant_that_changes_nothing_in_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "rhhjax.tools.ablate", "--config=ptb:tiny", "--variant=foo",
         f"--out={tmp_path / 'abl'}"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    from rhhjax.configs import ptb

    assert proc.returncode == 1 and not (tmp_path / "abl").exists()
    assert proc.stderr.splitlines() == [
        "error: --variant=foo changes no field: give NAME:FIELD=V,FIELD=V (e.g. "
        "rhn:model.type=rhn,model.hidden=280), or base / hyperrhn / foo: for the base config; "
        f"the config file's own variants ({', '.join(v for v in ptb.VARIANTS if v)}) are "
        "picked with --config=FILE:VARIANT"
    ]


def test_a_signal_stops_the_ablation_instead_of_starting_the_next_run(tmp_path, monkeypatch):
    """SIGTERM stopped the run in flight, then the ablation went on to the next variant."""
    from rhhjax import configs
    from rhhjax.train import trainer

    started = []

    def interrupted(config, workdir, log):
        started.append(workdir.name)
        return {"status": "interrupted", "exit_code": 143, "step": 2, "stop_reason": "signal"}

    monkeypatch.setattr(trainer, "train_and_evaluate", interrupted)
    messages: list[str] = []
    rows = ablate.run_ablation(
        configs.load("ptb:tiny"),
        ["model.hyper_rank=0,2"],
        tmp_path,
        max_steps=3,
        memory=False,
        log=messages.append,
    )
    assert started == ["hyper_rank-0"]
    assert [(r["variant"], r["status"], r["exit_code"]) for r in rows] == [
        ("hyper_rank-0", "interrupted", 143)
    ]
    assert "stopped during hyper_rank-0: run the same command again to resume it" in messages
