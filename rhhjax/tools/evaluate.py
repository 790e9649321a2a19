"""Evaluate a checkpoint of a workdir, no training.

    python -m rhhjax.tools.evaluate --workdir=workdirs/ptb [--split=valid|test|all]
        [--protocol=windows|stream|paper|all] [--checkpoint=best|latest|STEP] [--output=FILE.json]
        [--data_dir=FOLDER | --text_files=FILE[,FILE,FILE]]

A signal stops it at once, nothing written, exit status 128 + signum."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rhhjax import memory, outputs
from rhhjax.errors import UserError

# numpy and jax are imported where used, after console() enters the signal catcher
if TYPE_CHECKING:  # saved_run imports orbax: not for --help
    from rhhjax.train.saved_run import SavedRun


def run(
    workdir: str,
    split: str = "valid",
    protocol: str = "all",
    which: str = "best",
    impl: str = "",
    batch_size: int = 0,
    log: Callable[[str], None] = print,
    data_dir: str = "",
    text_files: str = "",
) -> dict:
    """Evaluate a checkpoint of ``workdir``: {"step", "checkpoint", "results"}."""
    from rhhjax import data as data_lib
    from rhhjax.evaluation import evaluate_splits, format_table, parse_protocols
    from rhhjax.train.saved_run import load_run

    splits = ["valid", "test"] if split == "all" else [split]
    for s in splits:
        if s not in ("valid", "test", "train"):
            raise data_lib.DataError(f"unknown split {s!r}: expected valid, test, train or all")
    protocols = parse_protocols(protocol)
    if batch_size < 0:
        raise UserError(
            f"--batch_size must be >= 1 (0: the run's eval.batch_size), got {batch_size}"
        )
    saved = load_run(workdir, which, impl=impl, data_dir=data_dir, text_files=text_files)
    if impl:
        check_impl(saved.model)
    corpus = saved.corpus()
    eval_config = saved.config.eval
    if batch_size:
        eval_config.batch_size = batch_size
    check_memory(saved, eval_config, protocols)
    log(
        f"evaluating the {saved.checkpoint} checkpoint of {workdir} (step {saved.step}) on "
        f"{corpus.name} from {corpus.source or '?'}"
    )
    try:
        results = evaluate_splits(
            saved.model, saved.params, corpus, eval_config, splits, protocols, log
        )
    except Exception as e:
        if not memory.is_out_of_memory(e):
            raise
        line = memory.out_of_memory_line(e, "the evaluation", BATCH_FIELDS, "nothing was written")
        raise memory.OutOfMemoryError(line) from None
    log(format_table(results))
    return {"step": saved.step, "checkpoint": saved.checkpoint, "results": results}


BATCH_FIELDS = ("--batch_size (0: the run's eval.batch_size)",)


def check_impl(model) -> None:
    """UserError when ``--impl`` cannot run here, in the words of evaluate's flags."""
    from rhhjax import models

    try:
        models.sequence_spec(model, execute=True)
    except UserError as e:
        line = str(e).replace("use model.impl='fused' or 'scan'", "use --impl=fused or scan")
        raise UserError(line.replace("model.impl=", "--impl=")) from None


def check_memory(saved: SavedRun, eval_config: Any, protocols: list[str]) -> None:
    """MemoryCheckError when an evaluation batch of ``eval_config`` cannot fit."""
    from rhhjax import models

    impl = models.sequence_spec(saved.model).impl
    n_params = models.count_params(saved.params)
    needs = memory.evaluations(
        saved.model,
        n_params,
        int(eval_config.batch_size),
        int(eval_config.seq_len),
        protocols,
        impl,
        batch_field="--batch_size",
    )
    memory.check(needs, memory.free_memory())


def main(argv: list[str]) -> int:
    from absl import flags

    f = flags.FLAGS
    if f.output:
        outputs.check_file(f.output, "--output")
    out = run(
        f.workdir,
        f.split,
        f.protocol,
        f.checkpoint,
        f.impl,
        f.batch_size,
        data_dir=f.data_dir,
        text_files=f.text_files,
    )
    if f.output:
        from rhhjax.train.workdir import json_dumps

        outputs.write_text(f.output, json_dumps(out, indent=2) + "\n", "--output")
    return 0


def define_flags() -> None:
    from absl import flags

    flags.DEFINE_string("workdir", None, "Training workdir holding checkpoints.", required=True)
    flags.DEFINE_enum("split", "valid", ["valid", "test", "train", "all"], "Split to evaluate.")
    flags.DEFINE_string("protocol", "all", "windows | stream | paper | all (comma-separated ok).")
    flags.DEFINE_string(
        "checkpoint", "best", "best | latest | STEP (a saved step) | checkpoints/STEP | best/STEP."
    )
    from rhhjax.ops.spec import CHOICES

    flags.DEFINE_string("impl", "", f"Override model.impl ({' | '.join(CHOICES)}).")
    flags.DEFINE_integer("batch_size", 0, "Override eval.batch_size (0 = from the config).")
    flags.DEFINE_string("output", "", "Also write the results as JSON to this file.")
    flags.DEFINE_string("data_dir", "", "PTB folder, instead of the run's data.dir (moved data).")
    flags.DEFINE_string(
        "text_files",
        "",
        "format=text runs: the text file(s), instead of the run's data.text_files.",
    )


def console() -> None:
    """The program; the signal catcher starts before jax is imported."""
    from rhhjax import cli
    from rhhjax.train.signals import SignalCatcher

    stopped = "stopped by {name} during the evaluation; nothing was written"
    SignalCatcher(thread=True, abort=stopped).__enter__()
    cli.run_program(main, define_flags, __doc__, flag=None)


if __name__ == "__main__":
    console()
