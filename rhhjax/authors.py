"""The paper authors' own validation curves (``rhhjax/data/authors/``) and a run's
projection to their best: the epochs and minutes a run would need to reach it at its pace
and its measured speed, a PREDICTION. The model: docs/design.md, "Projection"."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

AUTHORS_DIR = Path(__file__).resolve().parent / "data" / "authors"
MODELS = ("hyperrhn", "rhn")
PTB_FORMATS = ("chars", "mikolov_char")  # data.format of the authors' data, PTB characters
METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"


@dataclasses.dataclass(frozen=True)
class Curve:
    """One of the authors' runs: validation BPC (their protocol) at each epoch."""

    model: str
    epochs: tuple[float, ...]
    bpc: tuple[float, ...]
    minutes_per_epoch: float  # assumed from the authors' "2-3 days", not measured

    @property
    def label(self) -> str:
        return f"authors' {'HyperRHN' if self.model == 'hyperrhn' else 'RHN'} (Suarez 2017)"

    def best(self) -> tuple[float, float]:
        """(lowest BPC, the first epoch it was reached)."""
        low = min(self.bpc)
        return low, self.epochs[self.bpc.index(low)]

    def epoch_reaching(self, bpc: float) -> float | None:
        """The first epoch at which the authors' best so far is <= ``bpc``, interpolated
        linearly between epochs (epoch 0 is BPC infinity); None if they never did."""
        previous_epoch, previous_low = 0.0, float("inf")
        low = float("inf")
        for epoch, value in zip(self.epochs, self.bpc, strict=True):
            low = min(low, value)
            if low <= bpc:
                if previous_low == float("inf"):
                    return epoch
                share = (previous_low - bpc) / (previous_low - low)
                return previous_epoch + share * (epoch - previous_epoch)
            previous_epoch, previous_low = epoch, low
        return None


def curve(model: str) -> Curve:
    """The authors' curve of ``model`` ("hyperrhn" or "rhn")."""
    if model not in MODELS:
        raise ValueError(f"no authors' curve for model {model!r}: one of {MODELS}")
    source = json.loads((AUTHORS_DIR / "sources.json").read_text())[model]
    with open(AUTHORS_DIR / source["file"], newline="") as f:
        rows = list(csv.DictReader(f))
    return Curve(
        model=model,
        epochs=tuple(float(r["epoch"]) for r in rows),
        bpc=tuple(float(r["valid_bpc"]) for r in rows),
        minutes_per_epoch=60.0 * source["hours"] / source["epochs"],
    )


@dataclasses.dataclass(frozen=True)
class Projection:
    """A PREDICTION of the epochs and minutes a run needs to reach the authors' best.

    ``pace`` is the authors' epochs per epoch of the run so far (the authors' epoch at which
    their curve reached the run's best BPC, over the run's epoch then). ``epochs_kept_pace``
    assumes the run keeps its pace to the end; ``epochs_authors_pace`` that from now on it
    gains only what the authors gained per epoch. Minutes are at the run's measured seconds
    an epoch."""

    target_bpc: float
    target_epoch: float  # the authors'
    run_bpc: float
    run_epoch: float
    pace: float
    epochs_kept_pace: float
    epochs_authors_pace: float
    seconds_per_epoch: float

    @property
    def epochs(self) -> tuple[float, float]:
        """The two assumptions' epochs, lower first."""
        return tuple(sorted((self.epochs_kept_pace, self.epochs_authors_pace)))

    @property
    def minutes(self) -> tuple[float, float]:
        """The two assumptions' minutes of training, lower first."""
        return tuple(e * self.seconds_per_epoch / 60.0 for e in self.epochs)

    def line(self) -> str:
        """One line for a run's output."""
        (first, last), (low, high) = self.epochs, self.minutes
        return (
            f"PREDICTION: valid {self.target_bpc:.4f} (the authors' best, their epoch "
            f"{self.target_epoch:.0f}) after {first:.0f}-{last:.0f} "
            f"epochs, {low:.0f}-{high:.0f} minutes at {self.seconds_per_epoch:.2f} s an "
            f"epoch (this run: {self.run_bpc:.4f} at epoch {self.run_epoch:.1f}, "
            f"{self.pace:.2f}x the authors' pace)"
        )

    def as_dict(self) -> dict:
        return {
            **dataclasses.asdict(self),
            "minutes": list(self.minutes),
            "kind": "PREDICTION",
        }


def project(
    valid: list[tuple[float, float]], seconds_per_epoch: float, authors: Curve
) -> Projection | None:
    """The projection of a run whose validation curve is ``valid`` [(epoch, bpc)] to
    ``authors``' best; None when it cannot be made (no curve, a run already at or below the
    target, or above the authors' first epoch: no pace to measure)."""
    points = [(e, b) for e, b in valid if e > 0]
    if not points or seconds_per_epoch <= 0:
        return None
    run_bpc = min(b for _, b in points)
    run_epoch = min(e for e, b in points if b == run_bpc)
    target_bpc, target_epoch = authors.best()
    authors_epoch = authors.epoch_reaching(run_bpc)
    if run_bpc <= target_bpc or authors_epoch is None or authors_epoch <= authors.epochs[0]:
        return None
    pace = authors_epoch / run_epoch
    return Projection(
        target_bpc=target_bpc,
        target_epoch=target_epoch,
        run_bpc=run_bpc,
        run_epoch=run_epoch,
        pace=pace,
        epochs_kept_pace=target_epoch / pace,
        epochs_authors_pace=run_epoch + (target_epoch - authors_epoch),
        seconds_per_epoch=seconds_per_epoch,
    )


def model_of_run(config: dict) -> str | None:
    """The authors' model a run's saved config (config.json) trains, or None: only a
    HyperRHN or RHN on PTB characters is theirs."""
    model = (config.get("model") or {}).get("type")
    ptb = (config.get("data") or {}).get("format", "chars") in PTB_FORMATS
    return model if ptb and model in MODELS else None


def project_workdir(workdir: str | Path) -> Projection | None:
    """The projection of a training workdir to the authors' best, from its config.json and
    metrics.jsonl (whole-validation BPC, windows protocol; the seconds an epoch of its last
    progress line); None for a run that is not of the authors' model and data, or that
    ``project`` cannot project."""
    workdir = Path(workdir)
    try:
        config = json.loads((workdir / CONFIG_FILE).read_text())
        lines = (workdir / METRICS_FILE).read_text().splitlines()
    except (OSError, ValueError):
        return None
    model = model_of_run(config)
    if model is None:
        return None
    valid, seconds_per_epoch = [], 0.0
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        kind, epoch = record.get("kind"), record.get("epoch")
        if kind == "valid" and record.get("protocol", "windows") == "windows" and epoch:
            valid.append((float(epoch), float(record["bpc"])))
        elif kind == "train" and epoch and record.get("train_seconds"):
            seconds_per_epoch = float(record["train_seconds"]) / float(epoch)
    return project(valid, seconds_per_epoch, curve(model))
