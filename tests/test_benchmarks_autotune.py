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
    assert texts[0] == "layout=rowgroup" and texts[1] == "layout=grid"
    assert rows[0][1].startswith("rowgroup: main 4x")


def _fake_steps(monkeypatch, tune, seconds_per_step: dict, compiled: list | None = None):
    """bench.compile_step and time_compiled stand-ins, per variant text: the step's seconds,
    an exception (its compile raises), "hang" (its timing sleeps) or "compile_hang" (its
    compile sleeps); ``compiled`` gets each variant compiled, in order."""

    def compile_step(config, batch, length):
        value = seconds_per_step[config.persistent_variant]
        if compiled is not None:
            compiled.append(config.persistent_variant)
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
    texts = [f"v{i}" for i in range(6)]  # v0 alone, then groups of 3
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
    assert compiled[0] == "v0" and sorted(compiled[1:4]) == texts[1:4]
    assert sorted(compiled[4:]) == texts[4:]
    assert max(started[1:4]) - begin < 0.4  # a group's 3 compile at once
    assert time.perf_counter() - begin < 2.5  # the hung compile held up no later group
    assert tune.mark_winners(rows) == {"paper bfloat16": "v3"}


def test_skip_leaves_out_what_an_earlier_run_timed_but_times_its_baselines_again(
    tune, monkeypatch, tmp_path
):
    texts = ["layout=grid", "a", "b", "c", "d"]  # today's, then four more
    earlier = {
        "rows": [
            {"size": "paper", "dtype": "bfloat16", "variant": t, "status": st, "step_ms_median": ms}
            for t, st, ms in [(texts[0], "ok", 3.0), ("a", "ok", 2.0), ("b", "failed", None),
                              ("c", "ok", 4.0), ("d", "skipped", None)]
        ],
        "winners": {"paper bfloat16": "a"},
    }  # fmt: skip
    (tmp_path / "earlier.json").write_text(json.dumps(earlier))
    timed = []
    _fake_steps(monkeypatch, tune, dict.fromkeys(texts, 0.001), timed)
    monkeypatch.setattr(tune, "candidates", lambda *a: [(t, "plans") for t in texts])
    rows = tune.run(tune.parse_args([f"--skip={tmp_path / 'earlier.json'}"]))
    assert timed == [texts[0], "a", "d"]  # the default, the earlier winner, the one not timed
    assert [r.status for r in rows] == ["ok", "ok", "skipped", "skipped", "ok"]
    assert rows[2].error == f"failed in {tmp_path / 'earlier.json'}"
    assert rows[3].error.startswith("4.00 ms in ")


def test_list_prints_the_candidates_without_a_gpu(tune, capsys):
    assert tune.main(["--list", "--dtypes=float32"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("paper float32 layout=rowgroup  (rowgroup: main 4x16")
    assert len(lines) == len(persistent.variant_candidates(256, 1000, 128, "float32"))


def test_with_sets_its_fields_in_every_candidate_but_todays_where_they_run(tune):
    plain = [text for text, _ in tune.candidates("paper", "bfloat16", False)]
    poisoned = [text for text, _ in tune.candidates("paper", "bfloat16", False, "status=poison")]
    assert poisoned[0] == plain[0] == "layout=rowgroup"  # the baseline as it is
    # the row-group layout has no status to check (its variants keep status=host)
    assert all(("status=poison" in text) != ("rowgroup" in text) for text in poisoned[1:])
    assert len(poisoned) == len(set(poisoned)) == len(plain) - 1  # the grid's met its twin
    shared = [text for text, _ in tune.candidates("paper", "bfloat16", False, "multicast=1")]
    assert "layout=grid,stages=2,k_chunk=32,split_k=1" in shared  # no multicast with it
    assert "layout=rowgroup,multicast=1" in shared


@pytest.mark.parametrize(
    "flag",
    ["--sizes=huge", "--dtypes=float16", "--budget=0", "--with=status=maybe", "--only=bogus=1"],
)
def test_a_bad_flag_is_one_usage_error(tune, flag, capsys):
    with pytest.raises(SystemExit) as done:
        tune.parse_args([flag])
    assert done.value.code == 2 and "error: " in capsys.readouterr().err.splitlines()[-1]


def test_only_keeps_today_and_the_candidates_with_its_fields(tune):
    args = tune.parse_args(["--with=layout=rowgroup", "--only=split_k=0"])
    texts = [row.variant for row in tune.every_candidate(args)]
    assert texts[0] == "layout=rowgroup"  # today's
    # all in row groups but units=32, whose 32 column blocks no cluster holds: as it is
    assert len(texts) > 2 and all(("layout=rowgroup" in t) != ("units=32" in t) for t in texts[1:])
    assert not any("split_k=1" in t for t in texts)
    every = tune.every_candidate(tune.parse_args(["--with=layout=rowgroup"]))
    assert any("split_k=1" in row.variant for row in every)  # what --only left out


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


# `pytest -v -n 8` as a GPU loan's `gpu_suite.sh check` printed it (2026-11-28), shortened
XDIST_LOG = """8 workers [3 items]
[gw0] [ 33%] PASSED tests/test_ops_persistent.py::test_compiled_off_a_gpu_lowers
[gw6] [ 66%] PASSED tests/test_ops_persistent.py::TestPersistentCompiled::test_logits
[gw4] [100%] PASSED tests/test_ops_persistent.py::TestPersistentCompiled::test_loss[rhn]
================= 3 passed, 604 warnings in 79.57s (0:01:19) ==================
"""
WINNER = {"winners": {"paper bfloat16": "layout=grid,status=poison"}}


def test_the_training_call_gets_persistent_and_the_winner_when_every_model_test_passed(tune):
    assert tune.next_call(XDIST_LOG, WINNER) == ("persistent", WINNER["winners"]["paper bfloat16"])
    without_xdist = "tests/t.py::TestPersistentCompiled::test_logits PASSED\n= 1 passed in 3.1s\n"
    assert tune.next_call(without_xdist, WINNER)[0] == "persistent"


@pytest.mark.parametrize(
    "log",
    [
        XDIST_LOG.replace("[gw4] [100%] PASSED", "[gw4] [100%] FAILED"),
        XDIST_LOG.rsplit("=", 1)[0].rsplit("\n", 2)[0],  # cut before its summary
        XDIST_LOG.replace("TestPersistentCompiled", "TestOther"),  # none of the model's ran
        XDIST_LOG + "+++++ Timeout +++++\n",
    ],
    ids=["a-failure", "cut", "no-model-test", "timeout"],
)
def test_the_training_call_falls_back_to_fused_unless_the_tests_all_passed(tune, log):
    assert tune.next_call(log, WINNER) == ("fused", "default")


def test_without_a_timed_winner_the_training_call_is_fused(tune, tmp_path, capsys):
    (tmp_path / "tests.log").write_text(XDIST_LOG)
    (tmp_path / "autotune.json").write_text(json.dumps({"winners": {}}))
    args = [f"--next_call={tmp_path / 'tests.log'}", f"--out={tmp_path / 'autotune.json'}"]
    assert tune.main(args) == 0
    assert capsys.readouterr().out == "fused default\n"


def test_the_untested_fields_tests_are_their_own_compiled_classes(tune):
    """``--untested_k`` names a class per `persistent.UNTESTED_ON_A_GPU` field, and each
    exists in tests/test_ops_persistent.py (`gpu_suite.sh check` runs them apart)."""
    import test_ops_persistent

    names = [tune.untested_class(field) for field in persistent.UNTESTED_ON_A_GPU]
    assert names and all(hasattr(test_ops_persistent, name) for name in names)


UNTESTED_LOG = """4 workers [3 items]
[gw1] [ 33%] PASSED tests/test_ops_persistent.py::TestPersistentCompiledSplitK::test_loss
[gw1] [ 67%] PASSED tests/test_ops_persistent.py::TestPersistentCompiledMulticast::test_logits
[gw0] [100%] PASSED tests/test_ops_persistent.py::TestPersistentCompiledMulticast::test_loss
================= 3 passed in 61.02s (0:01:01) ==================
"""


def _failed(log: str, line: str, test_class: str) -> str:
    """``log`` with the test at ``line`` failed, as pytest writes it (its summary too)."""
    failed = log.replace(f"{line} PASSED", f"{line} FAILED")
    summary = f"FAILED tests/test_ops_persistent.py::{test_class}::test_loss - AssertionError\n"
    return failed.replace("=" * 17 + " 3 passed", summary + "=" * 17 + " 1 failed, 2 passed")


@pytest.mark.parametrize(
    ("log", "guard"),
    [
        (UNTESTED_LOG, ""),
        (_failed(UNTESTED_LOG, "[100%]", "TestPersistentCompiledMulticast"), "multicast=0"),
        (_failed(UNTESTED_LOG, "[ 33%]", "TestPersistentCompiledSplitK"), "split_k=0"),
        (UNTESTED_LOG.rsplit("=", 1)[0].rsplit("\n", 2)[0], "multicast=0,split_k=0"),  # cut
        ("", "multicast=0,split_k=0"),  # never written
    ],
    ids=["passed", "a-failure", "a-split-failure", "cut", "empty"],
)
def test_an_untested_field_whose_tests_did_not_all_pass_is_left_out(tune, log, guard):
    assert tune.untested_guard(log) == guard
    if guard:  # as gpu_suite.sh passes it on: --only leaves out the field's variants
        only = tune.parse_args([f"--only={guard}"])
        left_out = [f"{item.split('=')[0]}=1" for item in guard.split(",")]
        rows = tune.every_candidate(only)
        assert rows and not any(field in row.variant for row in rows for field in left_out)
