"""Evaluate a checkpoint of a workdir, no training.

    python -m rhhjax.tools.evaluate --workdir=workdirs/ptb [--split=valid|test|all]
        [--protocol=windows|stream|paper|all] [--checkpoint=best|latest] [--output=FILE.json]
        [--data_dir=FOLDER | --text_files=FILE[,FILE,FILE]]

The data is found as the run's config says (its ``data`` section); ``--data_dir`` (PTB) or
``--text_files`` (format=text) point it at data that has moved since training. The vocabulary
must still match the checkpoint's. Protocols and metrics: ``rhhjax.evaluation``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rhhjax import data as data_lib
from rhhjax import models
from rhhjax.errors import UserError, exit_with_error
from rhhjax.evaluation import evaluate_splits, format_table, parse_protocols


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
    """Evaluate a checkpoint of ``workdir``; returns {"step", "checkpoint", "results"}.

    ``data_dir`` / ``text_files``: override the run's ``data.dir`` / ``data.text_files``."""
    import ml_collections

    from rhhjax.train import checkpoint as ckpt_lib

    splits = ["valid", "test"] if split == "all" else [split]
    for s in splits:
        if s not in ("valid", "test", "train"):
            raise data_lib.DataError(f"unknown split {s!r}: expected valid, test, train or all")
    protocols = parse_protocols(protocol)
    params, meta, used = ckpt_lib.load_for_inference(workdir, which)
    config = ml_collections.ConfigDict(meta["config"])
    if data_dir:
        if config.data.get("format") == "text":
            raise data_lib.DataError(
                "--data_dir is for PTB runs; this run read text files: use --text_files"
            )
        config.data.dir = data_dir
    if text_files:
        if config.data.get("format") != "text":
            raise data_lib.DataError(
                "--text_files is for format=text runs; this run read PTB: use --data_dir"
            )
        config.data.text_files = text_files
    fields = dict(meta["model"])
    if impl:
        fields["impl"] = impl
    model_config = models.ModelConfig.from_config(fields)
    corpus = data_lib.load_corpus(config.data)
    if corpus.vocab.to_dict() != meta["vocab"]:
        raise ckpt_lib.CheckpointError(
            f"the data's vocabulary ({corpus.vocab.size} symbols) differs from the checkpoint's "
            f"({len(meta['vocab']['symbols'])} symbols): the config's data section no longer "
            f"describes the training data"
        )
    eval_config = config.eval
    if batch_size:
        eval_config.batch_size = batch_size
    log(
        f"evaluating the {used} checkpoint of {workdir} (step {meta['step']}) on "
        f"{corpus.name} from {corpus.source or '?'}"
    )
    results = evaluate_splits(model_config, params, corpus, eval_config, splits, protocols, log)
    log(format_table(results))
    return {"step": meta["step"], "checkpoint": used, "results": results}


def main(argv: list[str]) -> int:
    from absl import flags

    f = flags.FLAGS
    try:
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
    except UserError as e:
        exit_with_error(e)
    if f.output:
        from rhhjax.train.workdir import json_dumps  # NaN / inf as null: valid JSON

        Path(f.output).write_text(json_dumps(out, indent=2) + "\n")
    return 0


def define_flags() -> None:
    from absl import flags

    flags.DEFINE_string("workdir", None, "Training workdir holding checkpoints.", required=True)
    flags.DEFINE_enum("split", "valid", ["valid", "test", "train", "all"], "Split to evaluate.")
    flags.DEFINE_string("protocol", "all", "windows | stream | paper | all (comma-separated ok).")
    flags.DEFINE_enum("checkpoint", "best", ["best", "latest"], "Which checkpoint.")
    flags.DEFINE_string("impl", "", "Override model.impl (auto | scan | fused | pallas).")
    flags.DEFINE_integer("batch_size", 0, "Override eval.batch_size (0 = from the config).")
    flags.DEFINE_string("output", "", "Also write the results as JSON to this file.")
    flags.DEFINE_string("data_dir", "", "PTB folder, instead of the run's data.dir (moved data).")
    flags.DEFINE_string(
        "text_files",
        "",
        "format=text runs: the text file(s), instead of the run's data.text_files.",
    )


if __name__ == "__main__":
    from rhhjax.tools import common as cli

    cli.run_program(main, define_flags, __doc__, flag=None)
