"""The analysis driver (rhhjax/analysis/report.py): bad arguments are one line before anything
is loaded; the figures and the JSON are written for the analyses that have results. Whole
analyses of trained and initial models: tests/test_tools_analyze.py."""

import json

import pytest
from test_analysis_figures import result

from rhhjax.analysis import report
from rhhjax.analysis.subjects import AnalysisError


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(workdirs=["w"], settings=report.Settings(analyses=("weights", "x"))), "unknown"),
        (dict(), "nothing to analyse"),
        (dict(workdirs=["a", "b"], labels=["one"]), "1 labels for 2 models"),
    ],
)
def test_bad_arguments_are_one_line_before_any_loading(tmp_path, kwargs, needle):
    args = {"workdirs": [], "inits": [], "out": tmp_path / "out", **kwargs}
    with pytest.raises(AnalysisError, match=needle) as info:
        report.run(**args)
    assert "\n" not in str(info.value) and not (tmp_path / "out").exists()


def test_outputs_hold_a_figure_per_analysis_and_the_json(tmp_path):
    partial = {k: v for k, v in result("B c").items() if k not in ("gates", "lesion")}
    written = report.write_outputs([result("A"), partial], tmp_path, "p_", {"command": "x"})
    names = sorted(path.name for path in written)
    assert names == sorted(
        ["p_weight_norms.png", "p_input_gradients.png", "p_gates_A.png", "p_lesion.png",
         "p_analysis.json"]
    )  # fmt: skip
    payload = json.loads((tmp_path / "p_analysis.json").read_text())
    assert payload["command"] == "x" and [m["label"] for m in payload["models"]] == ["A", "B c"]
