"""benchmarks/persistent_prediction.py: the persistent HyperRHN step's PREDICTION from the
plan model (`rhhjax.ops.persistent_cost`, tests/test_ops_persistent_cost.py); THE step
function gives the table's rows (kernel, barrier and glue time per layout and dtype, glue
from a compile report's corrected bytes); the command prints the table (or, with
``--plan``, one plan's figures) and refuses a bad plan or calibration with one line."""

import dataclasses
import json
import subprocess
import sys

import pytest
from benchmark_scripts import BENCH, load
from rhhjax.kernels.mosaic import plan as kplan

from rhhjax.ops import persistent
from rhhjax.ops.persistent_cost import Rates

pc = load("persistent_prediction")


def _report(bf16_bytes: float, f32_bytes: float) -> dict:
    rows = [
        {"model": "hyperrhn", "impl": "persistent", "dtype": d, "status": "ok",
         "bytes_per_train_step_read": b}
        for d, b in (("bfloat16", bf16_bytes), ("float32", f32_bytes))
    ]  # fmt: skip
    rows.append({"model": "rhn", "impl": "persistent", "dtype": "bfloat16", "status": "ok",
                 "bytes_per_train_step_read": 1.0})  # fmt: skip
    return {"meta": {"date": "d", "git_commit": "c", "jax": "j", "host": "h"}, "rows": rows}


def test_a_kernel_phase_is_the_predicted_phase_without_its_barrier():
    plan = kplan.paper_plan("bfloat16")
    l2_bound = Rates(barrier_us=2.0, tflops_per_sm=1e9, l2_tbytes=5.0)
    expected = 2.0 + plan.l2_bytes_per_phase() / 5e12 * 1e6
    assert pc.predicted_phase_us(plan, l2_bound) == pytest.approx(expected)
    assert pc.kernel_phase_us(plan, l2_bound, 1, False) == pytest.approx(expected - 2.0)


def test_the_step_function_gives_the_tables_step_ms_for_every_layout():
    """One sum: each row of the table is `predicted_step` at that layout, rounded; and the
    step is its kernel, barrier and glue time."""
    report = _report(6.7e9, 13.4e9)
    rows = iter(pc.table(report))
    for dtype in ("bfloat16", "float32"):
        glue = pc.glue_bytes_of(report, dtype)
        for layout in pc.layouts(dtype, Rates(), 256, 1000, 128):
            step = pc.predicted_step(layout, dtype, glue, Rates())
            row = next(rows)
            assert (row["dtype"], row["layout"]) == (dtype, layout.name)
            assert row["step_ms"] == round(step.step_ms, 2)
            assert step.step_ms == step.kernel_ms + step.barrier_ms + step.glue_ms
            assert row["fwd_phase_us"] == round(step.fwd_phase_us, 2)
    assert next(rows, None) is None


def test_the_step_with_the_hyper_cell_as_own_launches_counts_both_cells_phases():
    """The grid with the hyper cell's own launches: 700 forward and 700 backward main phases
    at the plan model's kernel time, as many of the hyper plan's own launches, 2800
    barriers; no glue, no more."""
    rates, shape = Rates(), pc.PAPER
    grid = pc.plan_for(256, 1000, "bfloat16")
    hyper = pc.plan_for(256, 128, "bfloat16")
    apart = pc.Layout("apart", grid, 1, rates.barrier_us)
    step = pc.predicted_step(apart, "bfloat16", 0.0, rates, shape)
    phases = shape["depth"] * shape["length"]
    main_us = sum(
        pc.predicted_phase_us(grid, rates, backward=b) - rates.barrier_us for b in (False, True)
    )
    hyper_us = sum(
        pc.predicted_phase_us(hyper, rates, backward=b) - rates.barrier_us for b in (False, True)
    )
    assert step.kernel_ms == pytest.approx(phases * (main_us + hyper_us) / 1e3)
    assert step.barrier_phases == 4 * phases and step.glue_ms == 0.0
    assert step.step_ms == pytest.approx(step.kernel_ms + 4 * phases * rates.barrier_us / 1e3)


def test_the_step_is_kernel_plus_barrier_plus_glue_and_glue_is_bytes_at_hbm_rate():
    rows = pc.table(_report(6.7e9, 13.4e9))
    assert {r["dtype"] for r in rows} == {"bfloat16", "float32"}
    for row in rows:
        assert row["step_ms"] == pytest.approx(
            row["kernel_ms"] + row["barrier_ms"] + row["glue_ms"], abs=0.02
        )
        gb = 6.7 if row["dtype"] == "bfloat16" else 13.4
        assert row["glue_ms"] == pytest.approx(gb / pc.HBM_TBYTES, abs=0.01)
        assert row["barrier_ms"] == pytest.approx(
            row["barrier_phases"] * row["barrier_us"] / 1e3, abs=0.01
        )


def test_a_slower_barrier_or_gemm_raises_the_prediction():
    report = _report(1e9, 1e9)
    base = pc.table(report)
    slow_barrier = pc.table(report, dataclasses.replace(Rates(), barrier_us=3.0))
    slow_gemm = pc.table(report, dataclasses.replace(Rates(), tflops_per_sm=1.0))
    for b, s, g in zip(base, slow_barrier, slow_gemm, strict=True):
        if s["barrier_us"] != pc.CLUSTER_BARRIER_US:
            assert s["barrier_ms"] > b["barrier_ms"]
        assert g["kernel_ms"] > b["kernel_ms"]


def test_f32_gemms_run_at_the_tf32_rate():
    rates = pc.dtype_rates(Rates(), "float32")
    assert rates.tflops_per_sm == pytest.approx(Rates().tflops_per_sm / pc.TF32_SLOWDOWN)
    assert pc.dtype_rates(Rates(), "bfloat16") == Rates()


def test_a_report_without_the_row_is_one_value_error_line():
    report = _report(1e9, 1e9)
    report["rows"] = report["rows"][1:]
    with pytest.raises(ValueError, match="no compiled persistent HyperRHN bfloat16 row"):
        pc.table(report)


def test_the_command_prints_a_prediction_table_and_writes_its_json(tmp_path, capsys):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(_report(5e9, 9e9)))
    out = pc.main(["--report", str(path), "--json", str(tmp_path / "t.json")])
    printed = capsys.readouterr().out
    assert printed.startswith("PREDICTION") and "| step ms |" in printed
    saved = json.loads((tmp_path / "t.json").read_text())
    assert saved["label"].startswith("PREDICTION") and saved["rows"] == out["rows"]
    assert saved["assumptions"]["cluster_barrier_us"] == pc.CLUSTER_BARRIER_US
    assert saved["report"] == str(path)


def test_a_calibration_file_sets_the_rates_and_one_without_them_is_one_line(tmp_path):
    report = tmp_path / "report.json"
    report.write_text(json.dumps(_report(5e9, 9e9)))
    fitted = dataclasses.replace(Rates(), barrier_us=0.25, l2_tbytes=9.0)
    calibration = tmp_path / "calibrate.json"
    calibration.write_text(json.dumps({"rates_refitted": dataclasses.asdict(fitted)}))
    out = pc.main(["--report", str(report), "--calibration", str(calibration)])
    assert out["assumptions"]["rates"]["barrier_us"] == 0.25
    assert out["rows"] == pc.table(_report(5e9, 9e9), fitted)
    calibration.write_text(json.dumps({"measured": {}}))
    with pytest.raises(ValueError, match="no rates_refitted"):
        pc.main(["--report", str(report), "--calibration", str(calibration)])


def test_the_layouts_weighed_name_whether_they_are_built():
    """The grid, the row-group clusters and those with A multicast, each with the hyper cell
    as its own launches, are built, one of them the default (`persistent.LAYOUT`); the
    row-group plan has at most 16 column blocks in both dtypes."""
    for dtype in ("bfloat16", "float32"):
        names = [layout.name for layout in pc.layouts(dtype, Rates(), 256, 1000, 128)]
        assert len(names) == 3 and all("(built" in n for n in names)
        assert [n for n in names if "multicast A" in n] == [
            "row-group clusters of 16, multicast A, hyper as own launches (built: multicast=1)"
        ]
        default = [n for n in names if "the default" in n]
        assert len(default) == 1 and ("row-group" in default[0]) == (persistent.LAYOUT != "grid")
        assert pc.rowgroup_plan(dtype, 256, 1000).col_blocks == 16


def test_the_plan_option_prints_the_plan_and_refuses_a_bad_one_with_one_line():
    command = [sys.executable, str(BENCH / "persistent_prediction.py"), "--plan"]
    ok = subprocess.run(command + ["--dtype=bfloat16"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    figures = json.loads(ok.stdout)
    assert figures["smem_bytes"] == 208976 and figures["grid"] == 132
    plan = kplan.paper_plan("bfloat16")
    assert figures["PREDICTION forward phase us"] == round(pc.predicted_phase_us(plan), 2)
    bad = subprocess.run(command + ["--dtype=float32"], capture_output=True, text=True)
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and bad.stderr.startswith("error: persistent plan needs")
