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


def _command_line() -> str:
    argv = list(sys.argv)
    if argv and Path(argv[0]).name == "analyze.py":
        argv = ["python", "-m", "rhhjax.tools.analyze", *argv[1:]]
    return shlex.join(argv)


def settings_from_flags(f) -> Settings:
    """The `Settings` given by parsed flags ``f`` (``--analyses=all`` or a comma list)."""
    analyses = (
        ANALYSES
        if f.analyses == "all"
        else tuple(a.strip() for a in f.analyses.split(",") if a.strip())
    )
    return Settings(
        analyses=analyses,
        split=f.split,
        seq_len=f.seq_len,
        grad_sequences=f.grad_sequences,
        gate_sequences=f.gate_sequences,
        lesion_chars=f.lesion_chars,
        batch_size=f.batch_size,
    )


def run_from_flags(f, command: str | None = None) -> list[Path]:
    labels = [x.strip() for x in f.labels.split(",")] if f.labels else []
    return analysis.run(
        f.workdir or [],
        f.init or [],
        f.out,
        checkpoint=f.checkpoint,
        settings=settings_from_flags(f),
        data_dir=f.data_dir,
        impl=f.impl,
        float64=f.float64,
        labels=labels,
        prefix=f.prefix,
        command=command,
    )


def main(argv: list[str]) -> int:
    from absl import flags

    run_from_flags(flags.FLAGS, _command_line())
    return 0


def define_flags(flag_values=None) -> None:
    from absl import flags

    fv = flags.FLAGS if flag_values is None else flag_values
    flags.DEFINE_multi_string(
        "workdir", [], "Training workdir[@best|latest|init|STEP].", flag_values=fv
    )
    flags.DEFINE_multi_string(
        "init", [], "Config at initialisation: FILE[:VARIANT][,section.key=value...].",
        flag_values=fv,
    )  # fmt: skip
    flags.DEFINE_string(
        "out", None, "Output folder for the PNGs and analysis.json.", required=True, flag_values=fv
    )
    flags.DEFINE_string(
        "checkpoint", "best", "Default for workdirs: best|latest|init|STEP.", flag_values=fv
    )
    flags.DEFINE_string(
        "analyses", "all", "all, or a comma list of " + ", ".join(ANALYSES), flag_values=fv
    )
    flags.DEFINE_enum(
        "split", "valid", ["valid", "test", "train"], "Held-out split.", flag_values=fv
    )
    flags.DEFINE_string(
        "data_dir", "", "Override data.dir of every model (e.g. the PTB folder).", flag_values=fv
    )
    flags.DEFINE_integer(
        "seq_len", 100, "Window length (time steps) of every analysis.", flag_values=fv
    )
    flags.DEFINE_integer(
        "grad_sequences", 64, "Windows averaged for the gradient curve.", flag_values=fv
    )
    flags.DEFINE_integer("gate_sequences", 4, "Windows drawn in the gate figure.", flag_values=fv)
    flags.DEFINE_integer(
        "lesion_chars", 20_000, "Held-out symbols scored per lesion (0 = all).", flag_values=fv
    )
    flags.DEFINE_integer("batch_size", 32, "Rows per forward / backward pass.", flag_values=fv)
    flags.DEFINE_string(
        "impl", "scan", "model.impl for the analysis ('' = as trained).", flag_values=fv
    )
    flags.DEFINE_bool(
        "float64", False, "Compute in float64 (gradients below float32 range).", flag_values=fv
    )
    flags.DEFINE_string(
        "labels", "", "Comma list of legend labels, one per model (in order).", flag_values=fv
    )
    flags.DEFINE_string(
        "prefix", "", "Prefix of every output file name (e.g. init_).", flag_values=fv
    )


def console() -> None:
    from rhhjax import cli

    cli.run_program(main, define_flags, __doc__, flag=None)


if __name__ == "__main__":
    console()
