"""Training and validation BPC of runs against epochs or training minutes, beside the paper
authors' validation curve (the paper's Fig. 1).

    python -m rhhjax.tools.plot WORKDIR [WORKDIR ...] [--out=FILE.png]
    python -m rhhjax.tools.plot --x=minutes --notrain --authors=none --out=F.png WORKDIR ...

Reads ``WORKDIR/metrics.jsonl`` and writes ``WORKDIR/bpc.png`` (or ``--out``)."""

from __future__ import annotations

import json
from pathlib import Path

from rhhjax import authors as authors_lib
from rhhjax import outputs
from rhhjax.errors import UserError

METRICS_FILE = "metrics.jsonl"
AUTHORS = ("auto", "hyperrhn", "rhn", "none")
FORMATS = (".png", ".pdf", ".svg")


class PlotError(UserError):
    """Missing or empty metrics, a bad flag; the message is one line."""


X_AXES = {"epoch": "epoch", "minutes": "training minutes"}


def _x_value(record: dict, x: str) -> float | None:
    if x == "epoch":
        return float(record["epoch"])
    seconds = record.get("train_seconds")
    return None if seconds is None else float(seconds) / 60.0


def load_curves(workdir: str | Path, x: str = "epoch") -> dict:
    """{"train": [(x, bpc)], "valid": [(x, bpc)], "protocol": str | None} of a workdir."""
    if x not in X_AXES:
        raise PlotError(f"--x={x!r}: expected one of {', '.join(X_AXES)}, both")
    path = Path(workdir) / METRICS_FILE
    if not path.is_file():
        raise PlotError(f"{path} not found (is {workdir} a training workdir?)")
    by_kind: dict[str, dict[int, tuple[float, float]]] = {"train": {}, "valid": {}}
    protocol = None
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        kind = record.get("kind")
        if kind in by_kind and record.get("bpc") is not None:
            value = _x_value(record, x)
            if value is None:
                continue
            by_kind[kind][int(record["step"])] = (value, float(record["bpc"]))
            if kind == "valid":
                protocol = record.get("protocol", protocol)
    curves = {kind: [v for _, v in sorted(d.items())] for kind, d in by_kind.items()}
    if not curves["train"] and not curves["valid"]:
        if x == "minutes":
            raise PlotError(f"{path} records no training time (older trainer): use --x=epoch")
        raise PlotError(f"{path} holds no train or valid records yet")
    curves["protocol"] = protocol
    return curves


def authors_model(workdir: str | Path, choice: str) -> str | None:
    if choice not in AUTHORS:
        raise PlotError(f"--authors={choice!r}: expected one of {', '.join(AUTHORS)}")
    if choice != "auto":
        return None if choice == "none" else choice
    try:
        config = json.loads((Path(workdir) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return authors_lib.model_of_run(config)


def check_out(out: Path) -> Path:
    if out.suffix.lower() not in FORMATS:
        raise PlotError(
            f"--out={out}: the figure is written as {', '.join(FORMATS)}; name the file so "
            f"(e.g. {out.with_suffix('.png').name})"
        )
    return outputs.check_file(out, "--out")


def _draw_runs(ax, workdirs, runs: list[dict], train: bool, colors) -> float:
    x_max = 0.0
    for i, (workdir, curves) in enumerate(zip(workdirs, runs, strict=True)):
        color = colors[i % len(colors)]
        prefix = f"{Path(workdir).resolve().name}: " if len(workdirs) > 1 else ""
        if curves["train"] and train:
            xs, y = zip(*curves["train"], strict=True)
            style = ":" if len(workdirs) > 1 else "-"
            ax.plot(xs, y, style, color=color, alpha=0.6, label=f"{prefix}train")
            x_max = max(x_max, max(xs))
        if curves["valid"]:
            xs, y = zip(*curves["valid"], strict=True)
            second = colors[(i + 1) % len(colors)] if len(workdirs) == 1 and train else color
            label = f"{prefix}validation ({curves['protocol']})"
            ax.plot(xs, y, "o-", color=second, markersize=3, label=label)
            ax.axhline(min(y), color=second, linewidth=0.6, linestyle="--")
            x_max = max(x_max, max(xs))
    return x_max


def _draw_authors(ax, authors: authors_lib.Curve, x: str, x_max: float, projection) -> None:
    scale = 1.0 if x == "epoch" else authors.minutes_per_epoch
    xs = [e * scale for e in authors.epochs]
    shown = [(a, b) for a, b in zip(xs, authors.bpc, strict=True) if a <= 1.05 * x_max]
    label = authors.label + ("" if x == "epoch" else ", time assumed")
    if shown:
        ax.plot(*zip(*shown, strict=True), "s-", color="0.35", markersize=3, label=label)
    best, at = authors.best()
    their_best = f"their best {best:.4f} (epoch {at:.0f})"
    ax.axhline(best, color="0.35", linewidth=0.8, linestyle="--", label=their_best)
    ax.set_xlim(0, 1.05 * x_max)
    if projection is not None:  # the run's projection to their best, in the panel's units
        low, high = projection.epochs if x == "epoch" else projection.minutes
        text = f"PREDICTION: {best:.4f} after {low:.0f}-{high:.0f} {X_AXES[x].split()[-1]}"
        ax.text(0.98, 0.02, text, transform=ax.transAxes, ha="right", va="bottom", fontsize=8)


def plot(
    workdirs: list[str | Path],
    out: str | Path | None = None,
    x: str = "both",
    train: bool = True,
    title: str = "",
    authors: str = "auto",
) -> Path:
    """Draw the BPC curves of ``workdirs`` into a PNG (PDF, SVG); returns its path."""
    if not workdirs:
        raise PlotError("give at least one workdir: python -m rhhjax.tools.plot WORKDIR [...]")
    out = check_out(Path(out) if out else Path(workdirs[0]) / "bpc.png")
    if x not in (*X_AXES, "both"):
        raise PlotError(f"--x={x!r}: expected one of {', '.join(X_AXES)}, both")
    model = authors_model(workdirs[0], authors)
    curve = authors_lib.curve(model) if model is not None else None
    projection = authors_lib.project_workdir(workdirs[0]) if len(workdirs) == 1 else None
    try:
        import matplotlib
    except ImportError:
        raise PlotError(
            'matplotlib is not installed: pip install -e ".[plot]" (or pip install matplotlib)'
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = {axis: [load_curves(w, axis) for w in workdirs] for axis in X_AXES if x == axis}
    if x == "both":
        panels["epoch"] = [load_curves(w, "epoch") for w in workdirs]
        try:
            panels["minutes"] = [load_curves(w, "minutes") for w in workdirs]
        except PlotError:
            pass
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 4.5), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    default_title = Path(workdirs[0]).resolve().name if len(workdirs) == 1 else "BPC"
    for ax, (axis, runs) in zip(axes[0], panels.items(), strict=True):
        x_max = _draw_runs(ax, workdirs, runs, train, colors)
        if curve is not None:
            _draw_authors(ax, curve, axis, x_max, projection)
        ax.set_xlabel(X_AXES[axis])
        ax.set_ylabel("bits per character")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title or default_title)
    fig.tight_layout()
    try:
        with outputs.atomic_path(out, "--out") as tmp:
            fig.savefig(tmp, dpi=120, format=out.suffix[1:].lower())
    finally:
        plt.close(fig)
    return out


def main(argv: list[str]) -> int:
    from absl import flags

    if not argv[1:]:
        raise PlotError("give at least one workdir: python -m rhhjax.tools.plot WORKDIR [...]")
    f = flags.FLAGS
    out = plot(argv[1:], f.out or None, x=f.x, train=f.train, title=f.title, authors=f.authors)
    print(out)
    return 0


def define_flags() -> None:
    from absl import flags

    flags.DEFINE_string("out", "", "Figure path, .png, .pdf or .svg (default WORKDIR/bpc.png).")
    flags.DEFINE_enum("x", "both", [*X_AXES, "both"], "x axis: epoch, minutes or both panels.")
    flags.DEFINE_bool("train", True, "Also draw the training curves (--notrain: only valid).")
    flags.DEFINE_string("title", "", "Figure title (default: the workdir's name or 'BPC').")
    flags.DEFINE_enum("authors", "auto", list(AUTHORS), "The authors' curve to draw beside.")


def console() -> None:
    from rhhjax import cli

    cli.run_program(main, define_flags, __doc__, flag=None, positional=True)


if __name__ == "__main__":
    console()
