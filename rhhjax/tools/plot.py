"""Training and validation BPC against epochs (the paper's Fig. 1) from a workdir.

    python -m rhhjax.tools.plot WORKDIR [--out=FILE.png] [WORKDIR ...]

Reads ``WORKDIR/metrics.jsonl`` (``train`` and ``valid`` records written by the trainer) and
writes ``WORKDIR/bpc.png`` (or ``--out``). Several workdirs are drawn in one figure (one
colour per run; solid = validation, dotted = training), written to ``--out`` (default: the
first workdir's ``bpc.png``). Uses matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import json
from pathlib import Path

from rhhjax.errors import UserError

METRICS_FILE = "metrics.jsonl"


class PlotError(UserError):
    """Missing or empty metrics; the message is one line."""


def load_curves(workdir: str | Path) -> dict:
    """{"train": [(epoch, bpc)], "valid": [(epoch, bpc)], "protocol": str | None}.

    When a step was recorded twice (a resumed run re-logging it), the later record wins.
    """
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
            by_kind[kind][int(record["step"])] = (float(record["epoch"]), float(record["bpc"]))
            if kind == "valid":
                protocol = record.get("protocol", protocol)
    curves = {kind: [v for _, v in sorted(d.items())] for kind, d in by_kind.items()}
    if not curves["train"] and not curves["valid"]:
        raise PlotError(f"{path} holds no train or valid records yet")
    curves["protocol"] = protocol
    return curves


def plot(workdirs: list[str | Path], out: str | Path | None = None) -> Path:
    """Draw the BPC curves of ``workdirs`` into a PNG; returns its path."""
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
    out = Path(out) if out else Path(workdirs[0]) / "bpc.png"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, workdir in enumerate(workdirs):
        curves = load_curves(workdir)
        color = colors[i % len(colors)]
        name = Path(workdir).resolve().name
        prefix = f"{name}: " if len(workdirs) > 1 else ""
        if curves["train"]:
            x, y = zip(*curves["train"], strict=True)
            ax.plot(
                x,
                y,
                ":" if len(workdirs) > 1 else "-",
                color=color,
                alpha=0.6,
                label=f"{prefix}train",
            )
        if curves["valid"]:
            x, y = zip(*curves["valid"], strict=True)
            second = colors[(i + 1) % len(colors)] if len(workdirs) == 1 else color
            ax.plot(
                x,
                y,
                "o-",
                color=second,
                markersize=3,
                label=f"{prefix}validation ({curves['protocol']})",
            )
            best = min(y)
            ax.axhline(best, color=second, linewidth=0.6, linestyle="--")
    ax.set_xlabel("epoch")
    ax.set_ylabel("bits per character")
    title = Path(workdirs[0]).resolve().name if len(workdirs) == 1 else "BPC"
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv: list[str]) -> int:
    """``argv[1:]``: the workdirs (absl leaves positional arguments to the program)."""
    from absl import flags

    workdirs = argv[1:]
    if not workdirs:
        raise PlotError("give at least one workdir: python -m rhhjax.tools.plot WORKDIR [...]")
    print(plot(workdirs, flags.FLAGS.out or None))
    return 0


def define_flags() -> None:
    from absl import flags

    flags.DEFINE_string("out", "", "PNG path (default WORKDIR/bpc.png).")


if __name__ == "__main__":
    from rhhjax.tools import common as cli

    cli.run_program(main, define_flags, __doc__, flag=None, positional=True)
