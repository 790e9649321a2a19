"""The analysis figures (rhhjax/analysis/figures.py) drawn from JSON-ready results: one PNG
each, written whole; a log-scale curve with underflowed zeros left out."""

import pytest

from rhhjax.analysis import figures

PNG = b"\x89PNG\r\n\x1a\n"


def result(label: str) -> dict:
    """A model's results as ``report.analyse`` writes them (two micro-layers, three steps)."""
    return {
        "label": label,
        "num_params": 1234,
        "weight_norms": [
            {"label": "W_0", "block": "main", "fro": 1.5},
            {"label": "W_1", "block": "main", "fro": 1.2},
            {"label": "P", "block": "hyper", "fro": 0.7},
        ],
        "input_gradients": {
            "t": [0, 1, 2],
            "mean_norm": [0.0, 1e-3, 0.5],
            "seq_len": 3,
            "sequences": 4,
        },  # fmt: skip
        "gates": {"main": {"sequences": [{"activity": [[0.1, 0.5, 0.9], [0.2, 0.4, 0.6]]}] * 2}},
        "lesion": {
            "baseline": {"bpc": 2.0},
            "layers": [
                {"cell": "main", "layer": 0, "delta_bpc": 0.3},
                {"cell": "main", "layer": 1, "delta_bpc": 0.1},
                {"cell": "hyper", "layer": 0, "delta_bpc": 0.05},
            ],
        },
    }


@pytest.mark.parametrize(
    "plot, one", [("plot_weight_norms", False), ("plot_input_gradients", False),
                  ("plot_gates", True), ("plot_lesion", False)],
)  # fmt: skip
def test_every_figure_is_a_png(tmp_path, plot, one):
    results = [result("A"), result("B")]
    path = tmp_path / f"{plot}.png"
    written = getattr(figures, plot)(results[0] if one else results, path)
    assert written == path and path.read_bytes()[:8] == PNG
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left
