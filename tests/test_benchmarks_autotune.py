"""benchmarks/autotune_persistent.py without executing a kernel: its candidates, its rows
(a failure, a timeout, the budget), the winner and the one-line refusals."""

import json
import time

import pytest
from benchmark_scripts import load

from rhhjax.ops import persistent


@pytest.fixture(scope="module")
def tune():
    load("bench")  # the sibling it imports
    return load("autotune_persistent")


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_paper_candidates_are_the_libraries_today_first_each_with_its_plans(tune, dtype):
    rows = tune.candidates("paper", dtype, interpret=False)
    texts = [text for text, _ in rows]
    expected = persistent.variant_candidates(256, 1000, 128, dtype)
    assert texts == [v.text() for v in expected] and len(set(texts)) == len(texts)
    assert texts[0] == "hyper_inside=0,layout=grid"
    assert rows[0][1].startswith("grid: main 4x")
    assert any("inside" in plans for _, plans in rows)


def _fake_steps(seconds_per_step: dict):
    """bench.time_step stand-in: (compile s, step seconds) per variant text, or raises."""

    def time_step(config, batch, length, repeats):
        value = seconds_per_step[config.persistent_variant]
        if isinstance(value, Exception):
            raise value
        if value == "hang":
            time.sleep(5)
        return 0.5, [value] * repeats

    return time_step


def test_every_candidate_is_a_row_a_failure_or_timeout_too_and_the_fastest_wins(
    tune, monkeypatch, tmp_path
):
    texts = [text for text, _ in tune.candidates("small", "bfloat16", False)][:4]
    steps = dict(zip(texts, [0.02, RuntimeError("no\nkernel"), "hang", 0.01], strict=True))
    monkeypatch.setattr(tune.bench, "time_step", _fake_steps(steps))
    out = tmp_path / "a.json"
    args = tune.parse_args(["--sizes=small", "--limit=0.5", "--repeats=3", f"--out={out}"])
    monkeypatch.setattr(tune, "candidates", lambda *a: [(t, "plans") for t in texts])
    rows = tune.run(args)
    assert [r.status for r in rows] == ["ok", "failed", "timeout", "ok"]
    assert rows[1].error == "RuntimeError: no kernel" and rows[0].steps == 3
    winners = tune.mark_winners(rows)
    assert winners == {"small bfloat16": texts[3]} and rows[3].winner
    table = tune.table(rows)
    assert "**winner** ok" in table and "| 0.50x |" in table and table.count("\n") == 5
    assert [r["status"] for r in json.loads(out.read_text())["rows"]] == [r.status for r in rows]


def test_past_the_budget_the_rest_are_skipped_rows(tune, monkeypatch):
    texts = ["hyper_inside=0,layout=grid", "hyper_inside=1,layout=grid"]
    monkeypatch.setattr(tune.bench, "time_step", _fake_steps(dict.fromkeys(texts, "hang")))
    monkeypatch.setattr(tune, "candidates", lambda *a: [(t, "plans") for t in texts])
    rows = tune.run(tune.parse_args(["--budget=0.3", "--limit=60"]))
    assert [r.status for r in rows] == ["timeout", "skipped"]
    assert tune.mark_winners(rows) == {}


def test_list_prints_the_candidates_without_a_gpu(tune, capsys):
    assert tune.main(["--list", "--dtypes=float32"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("paper float32 hyper_inside=0,layout=grid  (grid: main 4x32")
    assert len(lines) == len(persistent.variant_candidates(256, 1000, 128, "float32"))


@pytest.mark.parametrize("flag", ["--sizes=huge", "--dtypes=float16", "--budget=0"])
def test_a_bad_flag_is_one_usage_error(tune, flag, capsys):
    with pytest.raises(SystemExit) as done:
        tune.parse_args([flag])
    assert done.value.code == 2 and "error: " in capsys.readouterr().err.splitlines()[-1]


def test_without_a_gpu_or_interpret_mode_it_refuses_in_one_line(tune):
    with pytest.raises(SystemExit, match="^error: no GPU here") as done:
        tune.main([])
    assert "\n" not in str(done.value.code)
