"""The GPU compile report's command line (benchmarks/gpu_report.py, benchmarks/hlo/deviceless.py).

These tests run everywhere: the compile itself needs the JAX CUDA plugin (a second venv, see
benchmarks/README.md "GPU compile report"); the Mosaic GPU kernels' ``gpu_compile`` tests
live beside the kernels' own tests.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from benchmark_scripts import BENCH, load
from hlo_cases import HIDDEN, HLO, SEQ

deviceless = load("hlo.deviceless")


report = load("gpu_report")


# ----------------------------------------------------------------------------- command line


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--impls=scan,cuda"], "--impls"),
        (["--dtypes=float16"], "--dtypes"),
        (["--models=lstm"], "--models"),
        (["--ranks=-1"], "--ranks"),
        (["--ranks=a"], "--ranks"),
        (["--set=depth=3"], "--set"),
        (["--launch-us=0"], "--launch-us"),
        (["--out=/nonexistent/dir/x.json"], "--out"),
    ],
)
def test_bad_arguments_are_one_line_errors_before_any_compile(argv, message, capsys):
    assert report.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err


def test_quick_mode_and_cases():
    args = report.parse_args(["--quick"])
    todo, opts = report.resolve(args)
    assert {(c.model, c.impl, c.rank) for c in todo} == {
        ("hyperrhn", "fused", 0),
        ("hyperrhn", "persistent", 0),
    }
    assert {c.dtype for c in todo} == {"float32", "bfloat16"}
    full, _ = report.resolve(report.parse_args([]))
    # rhn: 2 impls x 2 dtypes; hyperrhn: 2 ranks x 2 impls x 2 dtypes
    assert {c.impl for c in full} == {"scan", "fused"} and len(full) == 4 + 8
    assert opts.cost.launch_s == pytest.approx(4e-6)
    _, nested = report.resolve(report.parse_args(["--set=model.persistent.epilogue=registers"]))
    assert nested.overrides == {"model.persistent.epilogue": "registers"}  # a section's field


def test_table_has_one_row_per_config():
    rows = [
        {
            "model": "hyperrhn",
            "impl": "mosaic",
            "dtype": "float32",
            "hyper_rank": 4,
            "status": "unsupported",
        },
    ]
    text = report.format_table(rows)
    assert text.splitlines()[-1].split()[:5] == [
        "hyperrhn",
        "r4",
        "mosaic",
        "float32",
        "unsupported",
    ]


# ----------------------------------------------------------------------------- reanalysis

_PLUGIN, _ = deviceless.cuda_plugin_available()


def test_reanalyze_recomputes_hlo_figures_from_saved_hlo(tmp_path, capsys):
    case = report.Case("hyperrhn", "fused", "float32", 0)
    hlo_dir = tmp_path / "hlo"
    hlo_dir.mkdir()
    report.hlo_file(str(hlo_dir), case).write_text(HLO)
    row = {"model": "hyperrhn", "impl": "fused", "dtype": "float32", "hyper_rank": 0}
    row.update(status="ok", seq_len=SEQ, hidden=HIDDEN, launches_per_step=-1, memory={})
    skipped = {"model": "rhn", "impl": "mosaic", "dtype": "float32", "status": "unsupported"}
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"meta": {}, "rows": [row, skipped]}))
    out = tmp_path / "new.json"
    argv = [f"--reanalyze={old}", f"--save-hlo={hlo_dir}", f"--out={out}", "--launch-us=7"]
    assert report.main(argv) == 0
    new = json.loads(out.read_text())
    assert new["rows"][0]["launches_per_step"] == 18
    assert new["rows"][0]["launches_split"]["main_forward"] == 11
    assert new["rows"][1] == skipped
    assert new["meta"]["cost_model_parameters"]["launch_s"] == pytest.approx(7e-6)
    assert "hyperrhn r0 fused float32" in capsys.readouterr().out
    # a missing HLO file is a one-line error
    report.hlo_file(str(hlo_dir), case).unlink()
    assert report.main(argv) == 2


@pytest.mark.skipif(_PLUGIN, reason="the CUDA plugin is installed here")
def test_without_the_cuda_plugin_the_command_says_so_and_exits_2():
    run = subprocess.run(
        [sys.executable, str(BENCH / "gpu_report.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1].startswith("error: the JAX CUDA plugin")
