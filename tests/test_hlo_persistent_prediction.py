"""`rhhjax.hlo.persistent_prediction`: the persistent step's PREDICTION table (kernel,
barrier and glue time per layout and dtype) from a compile report's corrected bytes."""

import dataclasses
import json

import pytest

from rhhjax.hlo import persistent_prediction as pp
from rhhjax.hlo.persistent_cost import Rates


def _report(bf16_bytes: float, f32_bytes: float) -> dict:
    rows = [
        {"model": "hyperrhn", "impl": "persistent", "dtype": d, "status": "ok",
         "bytes_per_train_step_read": b}
        for d, b in (("bfloat16", bf16_bytes), ("float32", f32_bytes))
    ]  # fmt: skip
    rows.append({"model": "rhn", "impl": "persistent", "dtype": "bfloat16", "status": "ok",
                 "bytes_per_train_step_read": 1.0})  # fmt: skip
    return {"meta": {"date": "d", "git_commit": "c", "jax": "j", "host": "h"}, "rows": rows}


def test_the_step_is_kernel_plus_barrier_plus_glue_and_glue_is_bytes_at_hbm_rate():
    rows = pp.table(_report(6.7e9, 13.4e9))
    assert {r["dtype"] for r in rows} == {"bfloat16", "float32"}
    for row in rows:
        assert row["step_ms"] == pytest.approx(
            row["kernel_ms"] + row["barrier_ms"] + row["glue_ms"], abs=0.02
        )
        gb = 6.7 if row["dtype"] == "bfloat16" else 13.4
        assert row["glue_ms"] == pytest.approx(gb / pp.HBM_TBYTES, abs=0.01)
        assert row["barrier_ms"] == pytest.approx(
            row["barrier_phases"] * row["barrier_us"] / 1e3, abs=0.01
        )


def test_the_hyper_cell_in_the_kernel_halves_the_barrier_phases():
    rows = [r for r in pp.table(_report(1e9, 1e9)) if r["dtype"] == "bfloat16"]
    today = next(r for r in rows if r["layout"].startswith("grid, hyper as own"))
    inside = next(r for r in rows if r["layout"].startswith("grid, hyper inside"))
    assert today["barrier_phases"] == 4 * 700
    assert inside["barrier_phases"] == 2 * 700 + 2
    assert inside["fwd_phase_us"] > today["fwd_phase_us"]  # its share of the hyper GEMMs


def test_a_slower_barrier_or_gemm_raises_the_prediction():
    report = _report(1e9, 1e9)
    base = pp.table(report)
    slow_barrier = pp.table(report, dataclasses.replace(Rates(), barrier_us=3.0))
    slow_gemm = pp.table(report, dataclasses.replace(Rates(), tflops_per_sm=1.0))
    for b, s, g in zip(base, slow_barrier, slow_gemm, strict=True):
        if s["barrier_us"] != pp.CLUSTER_BARRIER_US:
            assert s["barrier_ms"] > b["barrier_ms"]
        assert g["kernel_ms"] > b["kernel_ms"]


def test_f32_gemms_run_at_the_tf32_rate():
    rates = pp.dtype_rates(Rates(), "float32")
    assert rates.tflops_per_sm == pytest.approx(Rates().tflops_per_sm / pp.TF32_SLOWDOWN)
    assert pp.dtype_rates(Rates(), "bfloat16") == Rates()


def test_a_report_without_the_row_is_one_value_error_line():
    report = _report(1e9, 1e9)
    report["rows"] = report["rows"][1:]
    with pytest.raises(ValueError, match="no compiled persistent HyperRHN bfloat16 row"):
        pp.table(report)


def test_the_command_prints_a_prediction_table_and_writes_its_json(tmp_path, capsys):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(_report(5e9, 9e9)))
    out = pp.main(["--report", str(path), "--json", str(tmp_path / "t.json")])
    printed = capsys.readouterr().out
    assert printed.startswith("PREDICTION") and "| step ms |" in printed
    saved = json.loads((tmp_path / "t.json").read_text())
    assert saved["label"].startswith("PREDICTION") and saved["rows"] == out["rows"]
    assert saved["assumptions"]["cluster_barrier_us"] == pp.CLUSTER_BARRIER_US


def test_a_calibration_file_sets_the_rates_and_one_without_them_is_one_line(tmp_path):
    report = tmp_path / "report.json"
    report.write_text(json.dumps(_report(5e9, 9e9)))
    fitted = dataclasses.replace(Rates(), barrier_us=0.25, l2_tbytes=9.0)
    calibration = tmp_path / "calibrate.json"
    calibration.write_text(json.dumps({"rates_refitted": dataclasses.asdict(fitted)}))
    out = pp.main(["--report", str(report), "--calibration", str(calibration)])
    assert out["assumptions"]["rates"]["barrier_us"] == 0.25
    assert out["rows"] == pp.table(_report(5e9, 9e9), fitted)
    calibration.write_text(json.dumps({"measured": {}}))
    with pytest.raises(ValueError, match="no rates_refitted"):
        pp.main(["--report", str(report), "--calibration", str(calibration)])


def test_the_layouts_weighed_name_whether_they_are_built():
    """Today's grid and the row-group clusters are built; the hyper cell inside and the
    multicast are not; the row-group plan has at most 16 column blocks in both dtypes."""
    for dtype in ("bfloat16", "float32"):
        names = [layout.name for layout in pp.layouts(dtype, Rates(), 256, 1000)]
        assert len(names) == 5
        assert (
            sum("(built" in n for n in names) == 2 and sum("(not built)" in n for n in names) == 3
        )
        assert pp.rowgroup_plan(dtype, 256, 1000).col_blocks == 16
