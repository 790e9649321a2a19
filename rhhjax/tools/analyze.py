"""Figures of a trained model: weight norms, gradient flow, gate activity, lesions.

    python -m rhhjax.tools.analyze --workdir=A [--workdir=B@init ...] [--init=CONFIG ...] --out=DIR

What each analysis computes: ``rhhjax.analysis``.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from rhhjax import analysis
from rhhjax.analysis import ANALYSES, Settings
from rhhjax.errors import UserError, exit_with_error


def _command_line() -> str:
    argv = list(sys.argv)
    if argv and Path(argv[0]).name == "analyze.py":
        argv = ["python", "-m", "rhhjax.tools.analyze", *argv[1:]]
    return shlex.join(argv)


def main(argv: list[str]) -> int:
    from absl import app, flags, logging

    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    f = flags.FLAGS
    if not f["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    analyses = (
        ANALYSES
        if f.analyses == "all"
        else tuple(a.strip() for a in f.analyses.split(",") if a.strip())
    )
    settings = Settings(
        analyses=analyses,
        split=f.split,
        seq_len=f.seq_len,
        grad_sequences=f.grad_sequences,
        gate_sequences=f.gate_sequences,
        lesion_chars=f.lesion_chars,
        batch_size=f.batch_size,
    )
    labels = [x.strip() for x in f.labels.split(",")] if f.labels else []
    try:
        analysis.run(
            f.workdir or [],
            f.init or [],
            f.out,
            checkpoint=f.checkpoint,
            settings=settings,
            data_dir=f.data_dir,
            impl=f.impl,
            float64=f.float64,
            labels=labels,
            prefix=f.prefix,
            command=_command_line(),
        )
    except UserError as e:
        exit_with_error(e)
    return 0


def _define_flags() -> None:
    from absl import flags

    flags.DEFINE_multi_string("workdir", [], "Training workdir[@best|latest|init|STEP].")
    flags.DEFINE_multi_string(
        "init", [], "Config at initialisation: FILE[:VARIANT][,section.key=value...]."
    )
    flags.DEFINE_string("out", None, "Output folder for the PNGs and analysis.json.", required=True)
    flags.DEFINE_string("checkpoint", "best", "Default for workdirs: best|latest|init|STEP.")
    flags.DEFINE_string("analyses", "all", "all, or a comma list of " + ", ".join(ANALYSES))
    flags.DEFINE_enum("split", "valid", ["valid", "test", "train"], "Held-out split.")
    flags.DEFINE_string("data_dir", "", "Override data.dir of every model (e.g. the PTB folder).")
    flags.DEFINE_integer("seq_len", 100, "Window length (time steps) of every analysis.")
    flags.DEFINE_integer("grad_sequences", 64, "Windows averaged for the gradient curve.")
    flags.DEFINE_integer("gate_sequences", 4, "Windows drawn in the gate figure.")
    flags.DEFINE_integer("lesion_chars", 20_000, "Held-out symbols scored per lesion (0 = all).")
    flags.DEFINE_integer("batch_size", 32, "Rows per forward / backward pass.")
    flags.DEFINE_string("impl", "scan", "model.impl for the analysis ('' = as trained).")
    flags.DEFINE_bool("float64", False, "Compute in float64 (gradients below float32 range).")
    flags.DEFINE_string("labels", "", "Comma list of legend labels, one per model (in order).")
    flags.DEFINE_string("prefix", "", "Prefix of every output file name (e.g. init_).")


if __name__ == "__main__":
    from absl import app

    _define_flags()
    app.run(main)
