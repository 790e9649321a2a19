"""A trained run loaded for inference (``evaluate``, ``sample``, ``rhhjax.analysis``):

    run = load_run("workdirs/ptb", "best")  # "latest", a step, "checkpoints/3", "best/6"
    run.params, run.model, run.vocab, run.corpus()

The checkpoint is what runs; a disagreeing ``config.json`` is one ``warning:`` line."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ml_collections

from rhhjax import data as data_lib
from rhhjax import models
from rhhjax.errors import one_line, warn
from rhhjax.train import checkpoint as ckpt_lib
from rhhjax.train import workdir as workdir_lib

CHECKPOINT_NAMES = ("best", "latest")
CHECKPOINT_FLAG_HELP = (
    "best | latest | STEP (any saved step) | checkpoints/STEP | best/STEP (one of the folder)"
)


@dataclasses.dataclass(frozen=True)
class SavedRun:
    """One checkpoint of a workdir: ``checkpoint``, ``config`` (as saved), ``model``, ``meta``."""

    workdir: Path
    checkpoint: str
    step: int
    epoch: float
    params: Any
    model: models.ModelConfig
    vocab: data_lib.Vocab
    config: ml_collections.ConfigDict
    meta: dict
    moved: bool = False  # the data's place came from --data_dir / --text_files

    def corpus(self) -> data_lib.Corpus:
        """The run's data; CheckpointError when its vocabulary is not the checkpoint's."""
        try:
            corpus = cached_corpus(self.config.data.to_dict())
        except data_lib.DataError as e:
            if self.moved:  # the place given is the one that fails: no advice to give it
                raise
            if self.config.data.get("format") == "text":
                flag = "--text_files=FILE (or FILE,FILE,FILE)"
            else:
                flag = "--data_dir=FOLDER"
            raise data_lib.DataError(
                f"{one_line(e)}; if the run's data has moved, give its new place with {flag}"
            ) from None
        if corpus.vocab.to_dict() != self.meta["vocab"]:
            raise ckpt_lib.CheckpointError(
                f"the data's vocabulary ({corpus.vocab.size} symbols) differs from the "
                f"checkpoint's ({self.vocab.size} symbols) in {self.workdir}: the run's data "
                f"section no longer describes its training data (--data_dir / --text_files "
                f"point at moved data)"
            )
        return corpus


def check_workdir(workdir: str | os.PathLike) -> Path:
    path = Path(workdir)
    if path.is_file():
        raise ckpt_lib.CheckpointError(f"{path} is a file, not a training workdir")
    if not path.is_dir():
        raise ckpt_lib.CheckpointError(f"workdir {path} does not exist")
    return path


def saved_steps(workdir: Path, *subs: str) -> list[int]:
    steps = set()
    for sub in subs or (ckpt_lib.LATEST_DIR, ckpt_lib.BEST_DIR):
        folder = workdir / sub
        if folder.is_dir():
            steps.update(int(p.name) for p in folder.iterdir() if p.name.isdigit())
    return sorted(steps)


def _saved(workdir: Path) -> list[str]:
    names = [
        f"{sub}/{step}"
        for sub in (ckpt_lib.LATEST_DIR, ckpt_lib.BEST_DIR)
        for step in saved_steps(workdir, sub)
    ]
    return names or ["none"]


def parse_checkpoint(text: str | int) -> str | int | tuple[str, int]:
    """A ``--checkpoint`` value: "best" | "latest" | a step | ("latest" | "best", step)."""
    if isinstance(text, int) and not isinstance(text, bool) and text >= 0:
        return text
    value = str(text).strip().strip("/")
    if value in CHECKPOINT_NAMES:
        return value
    if value.isdigit():
        return int(value)
    folder, _, step = value.rpartition("/")
    folders = {ckpt_lib.LATEST_DIR: "latest", ckpt_lib.BEST_DIR: "best"}
    if folder in folders and step.isdigit():
        return folders[folder], int(step)
    raise ckpt_lib.CheckpointError(f"--checkpoint={text}: expected {CHECKPOINT_FLAG_HELP}")


def checkpoint_flag(alternative: tuple[str, int], all_steps: list[tuple[str, int]]) -> str:
    which, step = alternative
    if sum(s == step for _, s in all_steps) > 1:
        return f"--checkpoint={ckpt_lib.folder_name(which, step)}"
    return f"--checkpoint={step}"


def _with_flags(error: ckpt_lib.DamagedCheckpointError, workdir: Path) -> ckpt_lib.CheckpointError:
    damaged = workdir / ckpt_lib.folder_name(error.which, error.step)
    everything = [*error.alternatives, (error.which, error.step)]
    flags = [checkpoint_flag(a, everything) for a in error.alternatives]
    if flags:
        return ckpt_lib.CheckpointError(
            f"checkpoint {damaged} is damaged ({error.reason}); use an undamaged one: "
            f"{' or '.join(flags)}"
        )
    return ckpt_lib.CheckpointError(
        f"checkpoint {damaged} is damaged ({error.reason}); no undamaged checkpoint is left in "
        f"{workdir}"
    )


def load_run(
    workdir: str | os.PathLike,
    which: str | int | tuple[str, int] = "best",
    *,
    impl: str = "",
    data_dir: str = "",
    text_files: str = "",
) -> SavedRun:
    """The ``which`` checkpoint of ``workdir`` (``best`` falls back to the latest); ``impl``,
    ``data_dir`` and ``text_files`` override the saved config."""
    path = check_workdir(workdir)
    which = which if isinstance(which, tuple) else parse_checkpoint(which)
    try:
        if isinstance(which, str):
            params, meta, used = ckpt_lib.load_for_inference(path, which)
        else:
            folder, step = which if isinstance(which, tuple) else (None, which)
            params, meta = _restore_step(path, step, folder)
            used = f"step {step}"
    except ckpt_lib.DamagedCheckpointError as e:
        raise _with_flags(e, path) from None
    warning = workdir_lib.config_json_warning(path, meta)
    if warning:
        warn(warning)
    config = ml_collections.ConfigDict(meta["config"])
    _move_data(config, data_dir, text_files)
    fields = dict(meta["model"])
    if impl:
        fields["impl"] = impl
    return SavedRun(
        workdir=path,
        checkpoint=used,
        step=int(meta["step"]),
        epoch=float(meta.get("epoch", float("nan"))),
        params=params,
        model=models.ModelConfig.from_config(fields),
        vocab=data_lib.Vocab.from_dict(meta["vocab"]),
        config=config,
        meta=meta,
        moved=bool(data_dir or text_files),
    )


def _move_data(config: ml_collections.ConfigDict, data_dir: str, text_files: str) -> None:
    is_text = config.data.get("format") == "text"
    if data_dir:
        if is_text:
            raise data_lib.DataError(
                "--data_dir is for PTB runs; this run read text files: use --text_files"
            )
        config.data.dir = data_dir
    if text_files:
        if not is_text:
            raise data_lib.DataError(
                "--text_files is for format=text runs; this run read PTB: use --data_dir"
            )
        config.data.text_files = text_files


def _restore_step(workdir: Path, step: int, folder: str | None = None) -> tuple[Any, dict]:
    sub = {"latest": ckpt_lib.LATEST_DIR, "best": ckpt_lib.BEST_DIR}
    in_folder = saved_steps(workdir, sub[folder]) if folder else saved_steps(workdir)
    if step not in in_folder:
        where = f"{workdir / sub[folder]}" if folder else f"{workdir}"
        raise ckpt_lib.CheckpointError(
            f"no checkpoint of step {step} in {where} (saved: {', '.join(_saved(workdir))})"
        )
    with ckpt_lib.Checkpoints(workdir, read_only=True) as ckpts:
        which = folder or ("latest" if step in ckpts.steps("latest") else "best")
        params, meta = ckpts.restore_params(which, step)
    if meta.get("version") != ckpt_lib.META_VERSION:
        raise ckpt_lib.CheckpointError(
            f"unsupported checkpoint meta version {meta.get('version')!r}"
        )
    return params, meta


def cached_corpus(data: Mapping[str, Any]) -> data_lib.Corpus:
    """``data_lib.load_corpus(data)``, read once per process."""
    return _load_corpus(json.dumps(dict(data), sort_keys=True))


@functools.lru_cache(maxsize=8)
def _load_corpus(data_json: str) -> data_lib.Corpus:
    return data_lib.load_corpus(json.loads(data_json))
