"""Training and validation BPC against epochs (the paper's Fig. 1) from a workdir.

    python -m rhhjax.tools.plot WORKDIR [--out=FILE.png] [WORKDIR ...]
    python -m rhhjax.tools.plot --x=minutes --notrain --out=FILE.png WORKDIR [WORKDIR ...]

Reads ``WORKDIR/metrics.jsonl`` (``train`` and ``valid`` records written by the trainer) and
writes ``WORKDIR/bpc.png`` (or ``--out``). Several workdirs are drawn in one figure (one
colour per run; solid = validation, dotted = training), written to ``--out`` (default: the
first workdir's ``bpc.png``). ``--x=minutes`` puts training time on the x axis (the
``train.max_minutes`` clock: compilation counts, validation and saving do not; recorded by
the trainer since 2026-11-23), to compare runs at equal wall-clock budget. Uses
matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import json
from pathlib import Path

from rhhjax import outputs
from rhhjax.errors import UserError

METRICS_FILE = "metrics.jsonl"


class PlotError(UserError):
    """Missing or empty metrics; the message is one line."""


X_AXES = {"epoch": "epoch", "minutes": "training minutes"}


def _x_value(record: dict, x: str) -> float | None:
    if x == "epoch":
        return float(record["epoch"])
    seconds = record.get("train_seconds")
    return None if seconds is None else float(seconds) / 60.0


def load_curves(workdir: str | Path, x: str = "epoch") -> dict:
    """{"train": [(x, bpc)], "valid": [(x, bpc)], "protocol": str | None}, x = epoch or
    training minutes (`X_AXES`).

    When a step was recorded twice (a resumed run re-logging it), the later record wins.
    """
    if x not in X_AXES:
        raise PlotError(f"--x={x!r}: expected one of {', '.join(X_AXES)}")
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


def plot(
    workdirs: list[str | Path],
    out: str | Path | None = None,
    x: str = "epoch",
    train: bool = True,
    title: str = "",
) -> Path:
    """Draw the BPC curves of ``workdirs`` into a PNG (x: `X_AXES`; train: also the training
    curves); returns its path."""
    try:
        import matplotlib
    except ImportError:
        raise PlotError(
            'matplotlib is not installed: pip install -e ".[plot]" (or pip install matplotlib)'
        ) from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not workdirs:
        raise PlotError("no workdir given")
    out = outputs.check_file(Path(out) if out else Path(workdirs[0]) / "bpc.png", "--out")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, workdir in enumerate(workdirs):
        curves = load_curves(workdir, x)
        color = colors[i % len(colors)]
        name = Path(workdir).resolve().name
        prefix = f"{name}: " if len(workdirs) > 1 else ""
        if curves["train"] and train:
            xs, y = zip(*curves["train"], strict=True)
            ax.plot(
                xs,
                y,
                ":" if len(workdirs) > 1 else "-",
                color=color,
                alpha=0.6,
                label=f"{prefix}train",
            )
        if curves["valid"]:
            xs, y = zip(*curves["valid"], strict=True)
            second = colors[(i + 1) % len(colors)] if len(workdirs) == 1 and train else color
            ax.plot(
                xs,
                y,
                "o-",
                color=second,
                markersize=3,
                label=f"{prefix}validation ({curves['protocol']})",
            )
            best = min(y)
            ax.axhline(best, color=second, linewidth=0.6, linestyle="--")
    ax.set_xlabel(X_AXES[x])
    ax.set_ylabel("bits per character")
    default_title = Path(workdirs[0]).resolve().name if len(workdirs) == 1 else "BPC"
    ax.set_title(title or default_title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    try:
        with outputs.atomic_path(out, "--out") as tmp:
            fig.savefig(tmp, dpi=120)
    finally:
        plt.close(fig)
    return out


def main(argv: list[str]) -> int:
    """``argv[1:]``: the workdirs (absl leaves positional arguments to the program)."""
    from absl import flags

    workdirs = argv[1:]
    if not workdirs:
        raise PlotError("give at least one workdir: python -m rhhjax.tools.plot WORKDIR [...]")
    f = flags.FLAGS
    print(plot(workdirs, f.out or None, x=f.x, train=f.train, title=f.title))
    return 0


def define_flags() -> None:
    from absl import flags

    flags.DEFINE_string("out", "", "PNG path (default WORKDIR/bpc.png).")
    flags.DEFINE_enum("x", "epoch", list(X_AXES), "x axis: epoch or training minutes.")
    flags.DEFINE_bool("train", True, "Also draw the training curves (--notrain: only valid).")
    flags.DEFINE_string("title", "", "Figure title (default: the workdir's name or 'BPC').")


def console() -> None:
    """The program: ``rhhjax-plot`` or ``python -m rhhjax.tools.plot``."""
    from rhhjax.tools import common as cli

    cli.run_program(main, define_flags, __doc__, flag=None, positional=True)


if __name__ == "__main__":
    console()
