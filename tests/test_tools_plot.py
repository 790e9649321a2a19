"""The BPC-against-epochs figure from metrics.jsonl."""

from __future__ import annotations

import json
import sys

import pytest
import train_cases

from rhhjax import authors
from rhhjax.tools import plot

PNG = b"\x89PNG\r\n\x1a\n"


def saved_figures(monkeypatch) -> list:
    """The figures ``savefig`` writes from now on (they are still written)."""
    import matplotlib.figure

    saved = []
    real = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(
        matplotlib.figure.Figure,
        "savefig",
        lambda fig, *a, **k: (saved.append(fig), real(fig, *a, **k)),
    )
    return saved


def write_metrics(workdir, records):
    workdir.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r) for r in records]
    (workdir / "metrics.jsonl").write_text("\n".join(lines) + "\n{truncated by kill -9")


def fake_run(workdir, offset=0.0):
    records = [{"kind": "event", "event": "start", "step": 0}]
    for step in range(1, 41):
        epoch = step / 10
        records.append(
            {"kind": "train", "step": step, "epoch": epoch, "bpc": 3 - epoch / 2 + offset}
        )
        if step % 10 == 0:
            records.append(
                {
                    "kind": "valid",
                    "step": step,
                    "epoch": epoch,
                    "bpc": 3.1 - epoch / 3 + offset,
                    "protocol": "windows",
                }
            )
    # a resumed run re-logged step 40: the later record wins
    records.append({"kind": "valid", "step": 40, "epoch": 4.0, "bpc": 1.5, "protocol": "windows"})
    write_metrics(workdir, records)


def test_curves_and_png(tmp_path):
    fake_run(tmp_path / "run")
    curves = plot.load_curves(tmp_path / "run")
    assert len(curves["train"]) == 40 and len(curves["valid"]) == 4
    assert curves["valid"][-1] == (4.0, 1.5) and curves["protocol"] == "windows"
    out = plot.plot([tmp_path / "run"])
    assert out == tmp_path / "run" / "bpc.png" and out.read_bytes()[:8] == PNG


def test_several_runs_in_one_figure(tmp_path):
    fake_run(tmp_path / "a")
    fake_run(tmp_path / "b", offset=0.2)
    out = tmp_path / "figs" / "both.png"
    assert plot.plot([tmp_path / "a", tmp_path / "b"], out) == out
    assert out.read_bytes()[:8] == PNG


def test_missing_or_empty_metrics(tmp_path):
    with pytest.raises(plot.PlotError, match="not found"):
        plot.load_curves(tmp_path)
    write_metrics(tmp_path, [{"kind": "event", "event": "start", "step": 0}])
    with pytest.raises(plot.PlotError, match="no train or valid records"):
        plot.load_curves(tmp_path)
    with pytest.raises(plot.PlotError, match="not found"):
        plot.plot([tmp_path / "nowhere"])
    with pytest.raises(plot.PlotError, match="at least one workdir"):
        plot.main(["plot"])


def test_missing_matplotlib_is_one_line(tmp_path, monkeypatch, capsys):
    fake_run(tmp_path / "run")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(plot.PlotError) as info:
        plot.plot([tmp_path / "run"])
    assert str(info.value) == (
        'matplotlib is not installed: pip install -e ".[plot]" (or pip install matplotlib)'
    )
    assert not (tmp_path / "run" / "bpc.png").exists()


def test_minutes_axis_reads_the_training_clock_and_old_metrics_say_so(tmp_path):
    records = [
        {
            "kind": "valid",
            "step": s,
            "epoch": s / 10,
            "bpc": 2.0 - s / 100,
            "train_seconds": 30.0 * s,
        }
        for s in (10, 20)
    ]
    write_metrics(tmp_path / "new", records)
    curves = plot.load_curves(tmp_path / "new", x="minutes")
    assert curves["valid"] == [(5.0, 1.9), (10.0, 1.8)]
    out = plot.plot([tmp_path / "new"], tmp_path / "m.png", x="minutes", train=False, title="t")
    assert out.read_bytes()[:8] == PNG
    fake_run(tmp_path / "old")  # no train_seconds: written before the trainer recorded it
    with pytest.raises(plot.PlotError, match="--x=epoch"):
        plot.load_curves(tmp_path / "old", x="minutes")


@pytest.mark.parametrize("where", ["a file", "read-only"])
def test_an_output_path_that_cannot_be_written_is_one_line_before_any_reading(tmp_path, where):
    """--out under a file or in a read-only folder was a 23-38-line traceback after the
    figure was drawn; now an OutputError first (the workdir here has no metrics at all)."""
    from helpers import read_only_folder

    from rhhjax import outputs

    (tmp_path / "a_file").write_text("x")
    folder = tmp_path / "a_file" if where == "a file" else read_only_folder(tmp_path)
    with pytest.raises(outputs.OutputError, match="--out="):
        plot.plot([tmp_path / "no_run"], folder / "bpc.png")


text_file = train_cases.text_file  # a shared fixture (tests/train_cases.py)
trained = train_cases.trained  # a shared fixture (tests/train_cases.py)


def test_plot_of_run(trained, tmp_path):
    workdir, _, _, _ = trained
    out = plot.plot([workdir], tmp_path / "bpc.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "model_type, choice, expected",
    [("hyperrhn", "auto", "hyperrhn"), ("rhn", "auto", "rhn"), ("lstm", "auto", None),
     ("lstm", "rhn", "rhn"), ("hyperrhn", "none", None)],
)  # fmt: skip
def test_the_authors_curve_follows_the_runs_model_type(tmp_path, model_type, choice, expected):
    (tmp_path / "config.json").write_text(json.dumps({"model": {"type": model_type}}))
    assert plot.authors_model(tmp_path, choice) == expected


@pytest.mark.parametrize("data_format, shown", [("text", False), ("mikolov_char", True)])
def test_the_authors_curve_is_drawn_by_default_only_beside_ptb_characters(
    tmp_path, data_format, shown
):
    """A HyperRHN on Tiny Shakespeare was drawn beside the authors' PTB curve."""
    config = {"model": {"type": "hyperrhn"}, "data": {"format": data_format}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert plot.authors_model(tmp_path, "auto") == ("hyperrhn" if shown else None)
    assert plot.authors_model(tmp_path, "hyperrhn") == "hyperrhn"  # asked for: drawn


def test_the_figure_draws_the_authors_curve_in_both_panels(tmp_path, monkeypatch):
    records = [
        {
            "kind": "valid",
            "step": s,
            "epoch": s / 2,
            "bpc": 2.0 - s / 100,
            "train_seconds": 150.0 * s,
        }
        for s in (2, 4, 6, 8)
    ]
    write_metrics(tmp_path / "run", records)
    (tmp_path / "run" / "config.json").write_text(json.dumps({"model": {"type": "hyperrhn"}}))
    saved = saved_figures(monkeypatch)
    out = plot.plot([tmp_path / "run"])
    assert out.read_bytes()[:8] == PNG
    (fig,) = saved
    epoch_ax, minutes_ax = fig.axes
    assert (epoch_ax.get_xlabel(), minutes_ax.get_xlabel()) == ("epoch", "training minutes")
    for ax, scale in (
        (epoch_ax, 1.0),
        (minutes_ax, authors.curve("hyperrhn").minutes_per_epoch),
    ):
        labels = [line.get_label() for line in ax.get_lines()]
        assert any(label.startswith("authors' HyperRHN") for label in labels), labels
        assert "their best 1.2275 (epoch 651)" in labels
        drawn = next(a for a in ax.get_lines() if a.get_label().startswith("authors'"))
        xs = drawn.get_xdata()
        assert xs[0] == pytest.approx(scale) and max(xs) <= 1.05 * ax.get_xlim()[1]


@pytest.mark.parametrize("name", ["newplot", "x.txt", "figure.tmp"])
def test_an_output_name_without_a_figure_format_is_one_line_before_any_reading(tmp_path, name):
    """--out=newplot or x.txt was a 31-line traceback from matplotlib."""
    with pytest.raises(plot.PlotError) as info:
        plot.plot([tmp_path / "no_run"], tmp_path / name)
    assert str(info.value).startswith(f"--out={tmp_path / name}: the figure is written as .png")
    assert not (tmp_path / name).exists()


def test_other_figure_formats_are_written(tmp_path):
    fake_run(tmp_path / "run")
    out = plot.plot([tmp_path / "run"], tmp_path / "f.svg", authors="none")
    assert b"<svg" in out.read_bytes()[:500]


def test_the_figure_writes_the_runs_projection_to_the_authors_best_in_each_panel(
    tmp_path, monkeypatch
):
    curve = authors.curve("hyperrhn")
    records = [  # a run on the authors' curve at twice their pace, 6 s an epoch
        {"kind": kind, "step": int(e), "epoch": e / 2, "bpc": b, "train_seconds": 3.0 * e}
        for e, b in zip(curve.epochs[:40], curve.bpc[:40], strict=True)
        for kind in ("train", "valid")
    ]
    write_metrics(tmp_path / "run", records)
    (tmp_path / "run" / "config.json").write_text(json.dumps({"model": {"type": "hyperrhn"}}))
    saved = saved_figures(monkeypatch)
    plot.plot([tmp_path / "run"])
    projection = authors.project_workdir(tmp_path / "run")
    assert projection.pace == pytest.approx(2.0)
    (fig,) = saved
    for ax, (low, high), unit in zip(
        fig.axes, (projection.epochs, projection.minutes), ("epoch", "minutes"), strict=True
    ):
        texts = [t.get_text() for t in ax.texts]
        assert f"PREDICTION: 1.2275 after {low:.0f}-{high:.0f} {unit}" in texts, texts
