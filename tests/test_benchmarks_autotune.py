"""benchmarks/autotune_persistent.py without executing a kernel: its candidates, its rows
(a failure, a timeout, the budget), the winner and the one-line refusals."""

import json
import subprocess
import sys
import time

import pytest
from benchmark_scripts import BENCH, load

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
    assert texts[:2] == ["layout=rowgroup", "layout=rowgroup,epilogue=registers"]  # the 2nd design
    assert rows[0][1].startswith("rowgroup: main 4x")


def _fake_steps(monkeypatch, tune, seconds_per_step: dict, compiled: list | None = None):
    """bench.compile_step and time_compiled stand-ins, per variant text: the step's seconds,
    an exception (its compile raises), "hang" (its timing sleeps) or "compile_hang" (its
    compile sleeps); ``compiled`` gets each variant compiled, in order."""

    def compile_step(config, batch, length):
        value = seconds_per_step[config.persistent.text()]
        if compiled is not None:
            compiled.append(config.persistent.text())
        if isinstance(value, Exception):
            raise value
        if value == "compile_hang":
            time.sleep(3)
        return value, 0.5

    def time_compiled(value, args, repeats):
        if value == "hang":
            time.sleep(5)
        if value == "hang_in_a_callback":  # the alarm's exception, wrapped by jax
            raise RuntimeError("CpuCallback error: ... raise CandidateTimeout")
        return [value] * repeats

    monkeypatch.setattr(tune.bench, "compile_step", compile_step)
    monkeypatch.setattr(tune.bench, "step_arrays", lambda config, batch, length: [None] * 7)
    monkeypatch.setattr(tune.bench, "time_compiled", time_compiled)


def test_every_candidate_is_a_row_a_failure_or_timeout_too_and_the_fastest_wins(
    tune, monkeypatch, tmp_path
):
    texts = [text for text, _ in tune.candidates("small", "bfloat16", False)][:5]
    steps = [0.02, RuntimeError("no\nkernel"), "hang", 0.01, "hang_in_a_callback"]
    steps = dict(zip(texts, steps, strict=True))
    _fake_steps(monkeypatch, tune, steps)
    out = tmp_path / "a.json"
    args = tune.parse_args(["--sizes=small", "--limit=0.5", "--repeats=3", f"--out={out}"])
    monkeypatch.setattr(tune, "candidates", lambda *a: [(t, "plans") for t in texts])
    rows = tune.run(args)
    assert [r.status for r in rows] == ["ok", "failed", "timeout", "ok", "timeout"]
    assert rows[1].error == "RuntimeError: no kernel" and rows[0].steps == 3
    winners = tune.mark_winners(rows)
    assert winners == {"small bfloat16": texts[3]} and rows[3].winner
    table = tune.table(rows)
    assert "**winner** ok" in table and "| 0.50x |" in table and table.count("\n") == 6
    assert [r["status"] for r in json.loads(out.read_text())["rows"]] == [r.status for r in rows]


def test_past_the_budget_the_rest_are_skipped_rows(tune, monkeypatch):
    texts = ["layout=grid", "layout=rowgroup"]
    _fake_steps(monkeypatch, tune, dict.fromkeys(texts, "hang"))
    monkeypatch.setattr(tune, "candidates", lambda *a: [(t, "plans") for t in texts])
    rows = tune.run(tune.parse_args(["--budget=0.3", "--limit=60"]))
    assert [r.status for r in rows] == ["timeout", "skipped"]
    assert tune.mark_winners(rows) == {}


def test_compile_workers_compile_a_group_at_once_and_time_it_in_order(tune, monkeypatch):
    texts = [f"layout=grid,stages={i + 1}" for i in range(6)]  # the first alone, then 3s
    steps = [0.05, 0.03, "compile_hang", 0.01, RuntimeError("x"), 0.02]
    steps = dict(zip(texts, steps, strict=True))
    compiled, started = [], []
    _fake_steps(monkeypatch, tune, steps, compiled)
    real_compile = tune.bench.compile_step

    def compile_step(config, *args):
        started.append(time.perf_counter())
        return real_compile(config, *args)

    monkeypatch.setattr(tune.bench, "compile_step", compile_step)
    monkeypatch.setattr(tune, "candidates", lambda *a: [(t, "plans") for t in texts])
    begin = time.perf_counter()
    rows = tune.run(tune.parse_args(["--compile_workers=3", "--limit=0.5", "--repeats=2"]))
    assert [r.status for r in rows] == ["ok", "ok", "timeout", "ok", "failed", "ok"]
    assert compiled[0] == texts[0] and sorted(compiled[1:4]) == texts[1:4]
    assert sorted(compiled[4:]) == texts[4:]
    assert max(started[1:4]) - begin < 0.4  # a group's 3 compile at once
    assert time.perf_counter() - begin < 2.5  # the hung compile held up no later group
    assert tune.mark_winners(rows) == {"paper bfloat16": texts[3]}


def test_list_prints_the_candidates_without_a_gpu(tune, capsys):
    assert tune.main(["--list", "--dtypes=float32"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("paper float32 layout=rowgroup  (rowgroup: main 4x16")
    assert len(lines) == len(persistent.variant_candidates(256, 1000, 128, "float32"))


@pytest.mark.parametrize(
    "flag",
    ["--sizes=huge", "--dtypes=float16", "--budget=0", "--limit=-1", "--compile_workers=0"],
)
def test_a_bad_flag_is_one_usage_error(tune, flag, capsys):
    with pytest.raises(SystemExit) as done:
        tune.parse_args([flag])
    assert done.value.code == 2 and "error: " in capsys.readouterr().err.splitlines()[-1]


def test_a_compile_still_running_in_its_thread_does_not_hold_up_the_exit(tmp_path):
    script = tmp_path / "hung.py"
    script.write_text(
        "import sys, time\n"
        f"sys.path.insert(0, {str(BENCH)!r})\n"
        "import autotune_persistent as tune\n"
        "pool = tune.compile_pool(1)\n"
        "pool.submit(time.sleep, 120)\n"
        "pool.shutdown(wait=False)\n"
        "print('table')\n"
        "sys.exit(tune.finish(3))\n"
    )
    begin = time.perf_counter()
    done = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=90)
    assert (done.returncode, done.stdout) == (3, "table\n"), done.stderr[-2000:]
    assert time.perf_counter() - begin < 80  # the sleeping compile's 120 s not waited for


def test_without_a_gpu_or_interpret_mode_it_refuses_in_one_line(tune):
    with pytest.raises(SystemExit, match="^error: no GPU here") as done:
        tune.main([])
    assert "\n" not in str(done.value.code)
