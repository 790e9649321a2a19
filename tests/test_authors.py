"""The authors' curves as shipped, and the projection of a run to their best."""

from __future__ import annotations

import csv

import pytest

from rhhjax import authors

SMALL = authors.Curve("hyperrhn", epochs=(1.0, 2.0, 3.0, 4.0), bpc=(2.0, 1.5, 1.6, 1.0),
                      minutes_per_epoch=1.0)  # fmt: skip


@pytest.mark.parametrize("model", authors.MODELS)
def test_each_curve_is_its_csv_and_its_best_is_the_lowest_value(model):
    curve = authors.curve(model)
    with open(authors.AUTHORS_DIR / f"{model}_curve.csv", newline="") as f:
        column = [float(r["valid_bpc"]) for r in csv.DictReader(f)]
    assert list(curve.bpc) == column
    low, epoch = curve.best()
    assert low == min(column) and curve.bpc[curve.epochs.index(epoch)] == low
    assert curve.epoch_reaching(low) == epoch
    assert curve.minutes_per_epoch > 0


def test_an_unknown_model_has_no_curve():
    with pytest.raises(ValueError, match="lstm"):
        authors.curve("lstm")


@pytest.mark.parametrize(
    "bpc,epoch",
    [(2.5, 1.0), (2.0, 1.0), (1.75, 1.5), (1.5, 2.0), (1.25, 3.5), (1.0, 4.0), (0.9, None)],
)
def test_the_epoch_reaching_a_bpc_follows_the_best_so_far_interpolated(bpc, epoch):
    # epoch 3 (1.6) is worse than epoch 2: the best so far stays 1.5 until epoch 4 (1.0)
    assert SMALL.epoch_reaching(bpc) == epoch


@pytest.mark.parametrize("speed", [0.5, 1.0, 2.0, 3.0])
def test_a_run_on_the_authors_curve_at_some_speed_is_projected_at_that_pace(speed):
    curve = authors.curve("hyperrhn")
    stop = 120  # the run stops at the authors' epoch 120, reached at epoch 120 / speed
    valid = [(e / speed, b) for e, b in zip(curve.epochs, curve.bpc, strict=True) if e <= stop]
    projection = authors.project(valid, seconds_per_epoch=6.0, authors=curve)
    target_bpc, target_epoch = curve.best()
    assert projection.target_bpc == target_bpc and projection.target_epoch == target_epoch
    assert projection.pace == pytest.approx(speed)
    assert projection.epochs_kept_pace == pytest.approx(target_epoch / speed)
    reached = projection.run_epoch
    assert projection.epochs_authors_pace == pytest.approx(reached + target_epoch - reached * speed)
    low, high = projection.epochs
    assert projection.minutes == pytest.approx((low * 6.0 / 60.0, high * 6.0 / 60.0))
    assert low <= high


def test_the_projection_line_and_record_say_prediction_and_carry_its_figures():
    valid = [(1.0, 1.9), (2.0, 1.4), (3.0, 1.45)]
    projection = authors.project(valid, seconds_per_epoch=30.0, authors=SMALL)
    assert (projection.run_bpc, projection.run_epoch) == (1.4, 2.0)
    line = projection.line()
    assert line.startswith("PREDICTION: valid 1.0000 (the authors' best, their epoch 4)")
    assert "1.4000 at epoch 2.0" in line and f"{projection.pace:.2f}x" in line
    record = projection.as_dict()
    assert record["kind"] == "PREDICTION" and record["minutes"] == list(projection.minutes)


@pytest.mark.parametrize(
    "valid,seconds",
    [
        ([], 10.0),  # no validation yet
        ([(0.0, 3.0)], 10.0),  # only the step-0 evaluation
        ([(5.0, 0.95)], 10.0),  # already below the authors' best
        ([(5.0, 2.5)], 10.0),  # above the authors' first epoch: no pace to measure
        ([(5.0, 1.5)], 0.0),  # no measured speed
    ],
)
def test_no_projection_without_a_pace_or_a_target_left(valid, seconds):
    assert authors.project(valid, seconds, SMALL) is None


def test_the_shipped_curves_are_the_shared_ones_and_reach_their_best():
    shared = authors.AUTHORS_DIR.parents[2].parent / "shared" / "data" / "authors"
    for model, best, epoch in (("hyperrhn", 1.2275, 651), ("rhn", 1.2401, 1021)):
        curve = authors.curve(model)
        assert curve.best() == (pytest.approx(best, abs=5e-5), epoch)
        assert curve.minutes_per_epoch > 0
        name = f"{model}_curve.csv"
        if (shared / name).is_file():  # the shipped copy is the authors' file unchanged
            assert (authors.AUTHORS_DIR / name).read_bytes() == (shared / name).read_bytes()


def test_the_design_docs_projection_line_is_the_rowgroup_runs():
    run = authors.AUTHORS_DIR.parents[2] / "results" / "ptb_gpu_fast_rowgroup"
    design = " ".join((run.parents[1] / "docs" / "design.md").read_text().split())
    assert f"`{authors.project_workdir(run).line()}`" in design
