"""The analysis program (`rhhjax.tools.analyze`): flags -> figures and numbers on disk.

A tiny workdir (text data written by the test) is analysed in-process through the program's
own flags; the command-line test reads real PTB from $RHHJAX_PTB_DIR (default
../shared/data/ptb beside the repo), is skipped when it is absent, and runs in a subprocess
because --float64 switches JAX to x64 for the whole process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from absl import flags
from test_analysis_subjects import make_workdir

from rhhjax import analysis as analyze
from rhhjax.tools import analyze as analyze_tool

ROOT = Path(__file__).resolve().parents[1]
PTB_DIR = Path(
    os.environ.get("RHHJAX_PTB_DIR", Path(__file__).resolve().parents[2] / "shared/data/ptb")
)


def _parsed_flags(*args: str) -> flags.FlagValues:
    fv = flags.FlagValues()
    analyze_tool.define_flags(fv)
    fv(["analyze", *args])
    return fv


def test_flags_write_figures_and_numbers(tmp_path):
    rhn_dir, _ = make_workdir(tmp_path, "rhn")
    out = tmp_path / "out"
    fv = _parsed_flags(
        f"--workdir={rhn_dir}",
        f"--workdir={rhn_dir}@init",
        f"--out={out}",
        "--seq_len=20",
        "--grad_sequences=4",
        "--gate_sequences=2",
        "--lesion_chars=400",
        "--batch_size=4",
        "--prefix=x_",
    )
    assert analyze_tool.settings_from_flags(fv) == analyze.Settings(
        seq_len=20, grad_sequences=4, gate_sequences=2, lesion_chars=400, batch_size=4
    )
    written = analyze_tool.run_from_flags(fv, command="analyze test")
    names = sorted(p.name for p in written)
    assert names == sorted(
        [
            "x_weight_norms.png",
            "x_input_gradients.png",
            "x_gates_rhn_step_7_ep_0.25.png",
            "x_gates_rhn_init.png",
            "x_lesion.png",
            "x_analysis.json",
        ]
    )
    for p in written:
        assert p.stat().st_size > 1000, p
    result = json.loads((out / "x_analysis.json").read_text())
    assert result["command"] == "analyze test"
    models_out = result["models"]
    assert [m["source"]["checkpoint"] for m in models_out] == ["best", "init"]
    assert [m["source"]["step"] for m in models_out] == [7, 0]
    trained, init = models_out[0]["weight_norms"], models_out[1]["weight_norms"]
    for a, b in zip(trained, init, strict=True):  # the checkpoint holds init x 1.5
        assert a["fro"] == pytest.approx(1.5 * b["fro"], rel=1e-5)
    assert len(models_out[0]["input_gradients"]["t"]) == 20
    assert models_out[0]["lesion"]["layers"][0]["max_gate"] == 0.0


def test_analyses_flag_selects_and_rejects(tmp_path):
    fv = _parsed_flags("--out=x", "--analyses=weights, gates")
    assert analyze_tool.settings_from_flags(fv).analyses == ("weights", "gates")
    fv = _parsed_flags("--out=x", "--analyses=weights,spectra", "--init=ptb:tiny")
    with pytest.raises(analyze.AnalysisError, match="unknown analysis 'spectra'"):
        analyze_tool.run_from_flags(fv)


@pytest.mark.skipif(
    not (PTB_DIR / "ptb.valid.txt").is_file(),
    reason=f"real PTB not found in {PTB_DIR} (set RHHJAX_PTB_DIR to the folder of ptb.*.txt)",
)
def test_command_line_at_init_on_real_ptb(tmp_path):
    out = tmp_path / "figs"
    cmd = [
        sys.executable,
        "-m",
        "rhhjax.tools.analyze",
        "--init=configs/ptb.py:tiny,model.type=rhn",
        "--init=configs/ptb.py:tiny,model.type=lstm,model.hidden=12",
        f"--data_dir={PTB_DIR}",
        f"--out={out}",
        "--seq_len=20",
        "--grad_sequences=4",
        "--gate_sequences=2",
        "--lesion_chars=500",
        "--labels=rhn,lstm",
        "--float64",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    files = {p.name: p.stat().st_size for p in out.iterdir()}
    for name in ("weight_norms.png", "input_gradients.png", "gates_rhn.png", "lesion.png"):
        assert files.get(name, 0) > 1000, files
    result = json.loads((out / "analysis.json").read_text())
    assert [m["model"]["vocab_size"] for m in result["models"]] == [50, 50]
    assert result["models"][1]["model"]["hidden"] == 12
    assert "lesion" not in result["models"][1] and "gates" not in result["models"][1]
    assert result["float64"] and result["models"][0]["model"]["dtype"] == "float64"
    # float64 computes from the float32 init a training run starts from (x64 is enabled only
    # after initialising: under x64 the orthogonal init draws different matrices)
    reference = analyze.subject_from_config(
        f"{ROOT}/configs/ptb.py:tiny,model.type=rhn", data_dir=str(PTB_DIR)
    )
    expected = [w["fro"] for w in analyze.weight_norms(reference.params)]
    got = [w["fro"] for w in result["models"][0]["weight_norms"]]
    np.testing.assert_allclose(got, expected, rtol=1e-6)


@pytest.mark.parametrize("where", ["a file", "read-only"])
def test_an_output_folder_that_cannot_be_written_is_one_line_before_any_model_loads(
    tmp_path, where
):
    """--out=A_FILE was a 28-line traceback after the analysis had run; now an OutputError
    before the (here missing) workdir is even looked at."""
    from helpers import read_only_folder

    from rhhjax import outputs

    (tmp_path / "a_file").write_text("x")
    out = tmp_path / "a_file" if where == "a file" else read_only_folder(tmp_path) / "figs"
    fv = _parsed_flags(f"--workdir={tmp_path / 'missing'}", f"--out={out}")
    with pytest.raises(outputs.OutputError, match=f"--out={out}"):
        analyze_tool.run_from_flags(fv)
