"""The models to analyse ("subjects"): a workdir's checkpoint or init, or a config at init;
and the held-out windows every analysis reads."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rhhjax import config_files, models
from rhhjax import data as data_lib
from rhhjax.errors import UserError
from rhhjax.train import saved_run

CHECKPOINT_NAMES = ("best", "latest", "init")


class AnalysisError(UserError):
    """Bad input to the analysis (unknown checkpoint, too little data); one line."""


@dataclasses.dataclass
class Subject:
    """One model to analyse: its config, parameters, held-out tokens and provenance."""

    label: str
    config: models.ModelConfig
    params: Any
    tokens: np.ndarray
    vocab: data_lib.Vocab | None = None
    source: dict = dataclasses.field(default_factory=dict)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "model"


def load_config_spec(spec: str) -> ml_collections.ConfigDict:
    """``FILE[:VARIANT][,section.key=value ...]`` -> the config (overrides applied)."""
    head, *overrides = [part for part in spec.split(",") if part]
    return config_files.load(head, overrides)


def init_params(model_config: models.ModelConfig, seed: int):
    """The parameters a training run with ``seed`` starts from (the trainer's own init)."""
    from rhhjax.train import step as train_step

    return train_step.make_init(model_config)(train_step.init_key(int(seed)))


def _corpus(cfg: ml_collections.ConfigDict, data_dir: str) -> data_lib.Corpus:
    data = cfg.data.to_dict()
    if data_dir:
        data["dir"] = data_dir
    return saved_run.cached_corpus(data)


def _model_config(fields: dict, impl: str) -> models.ModelConfig:
    overrides = {"impl": impl} if impl else {}
    return models.ModelConfig.from_config(dict(fields), **overrides)


def to_float64(subject: Subject) -> Subject:
    """The subject in float64 (``jax_enable_x64``); load the parameters BEFORE enabling x64
    (under x64 the orthogonal initialiser draws other parameters)."""
    return dataclasses.replace(
        subject,
        config=dataclasses.replace(subject.config, dtype="float64"),
        params=jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), subject.params),
    )


def parse_which(text: str) -> str | int:
    text = str(text).strip()
    if text in CHECKPOINT_NAMES:
        return text
    if text.isdigit():
        return int(text)
    raise AnalysisError(f"checkpoint must be best, latest, init or a step number, got {text!r}")


def split_workdir_spec(spec: str, default: str) -> tuple[str, str | int]:
    """``DIR[@WHICH]`` -> (DIR, WHICH); a suffix that is no checkpoint name stays in DIR."""
    path, sep, which = spec.rpartition("@")
    if sep and path and (which in CHECKPOINT_NAMES or which.isdigit()):
        return path, parse_which(which)
    return spec, parse_which(default)


def _at_init(workdir: Path, data_dir: str, impl: str):
    from rhhjax.train import config as train_config
    from rhhjax.train import workdir as workdir_lib

    config_file = workdir / workdir_lib.CONFIG_FILE
    if not config_file.is_file():
        raise AnalysisError(f"{workdir} has neither a checkpoint nor {workdir_lib.CONFIG_FILE}")
    cfg = train_config.prepare_config(json.loads(config_file.read_text()))
    corpus = _corpus(cfg, data_dir)
    fields = cfg.model.to_dict()
    fields["vocab_size"] = corpus.vocab.size
    mc = _model_config(fields, impl)
    source = {"workdir": str(workdir), "checkpoint": "init", "seed": int(cfg.seed)}
    source.update(step=0, epoch=0.0)
    return mc, init_params(mc, int(cfg.seed)), corpus, source


def _saved(workdir: Path, which: str | int, data_dir: str, impl: str):
    saved = saved_run.load_run(workdir, which, impl=impl)
    if data_dir:
        saved.config.data.dir = data_dir
    source = {
        "workdir": str(workdir),
        "checkpoint": saved.checkpoint,
        "step": saved.step,
        "epoch": saved.epoch,
    }
    return saved.model, saved.params, saved.corpus(), source


def subject_from_workdir(
    spec: str,
    default_which: str = "best",
    *,
    split: str = "valid",
    data_dir: str = "",
    impl: str = "scan",
    label: str = "",
) -> Subject:
    from rhhjax.train import checkpoint as ckpt_lib

    path, which = split_workdir_spec(spec, default_which)
    workdir = saved_run.check_workdir(path)
    if which != "init" and not ckpt_lib.has_checkpoint(workdir):
        which = "init"
    if which == "init":
        mc, params, corpus, source = _at_init(workdir, data_dir, impl)
        default_label = f"{workdir.name} init"
    else:
        mc, params, corpus, source = _saved(workdir, which, data_dir, impl)
        default_label = f"{workdir.name} step {source['step']} (ep {source['epoch']:.2f})"
    return Subject(
        label=label or default_label,
        config=mc,
        params=params,
        tokens=corpus.split(split),
        vocab=corpus.vocab,
        source=source,
    )


def subject_from_config(
    spec: str,
    *,
    split: str = "valid",
    data_dir: str = "",
    impl: str = "scan",
    label: str = "",
) -> Subject:
    from rhhjax.train import config as train_config

    cfg = train_config.prepare_config(load_config_spec(spec))
    corpus = _corpus(cfg, data_dir)
    fields = cfg.model.to_dict()
    fields["vocab_size"] = corpus.vocab.size
    mc = _model_config(fields, impl)
    params = init_params(mc, int(cfg.seed))
    variant = cfg.get("variant", "") or ""
    default_label = f"{mc.type} {variant} init".replace("  ", " ")
    return Subject(
        label=label or default_label,
        config=mc,
        params=params,
        tokens=corpus.split(split),
        vocab=corpus.vocab,
        source={"config": spec, "checkpoint": "init", "seed": int(cfg.seed), "step": 0},
    )


def heldout_windows(
    tokens: np.ndarray, count: int, length: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``count`` evenly spaced windows of ``length``: (inputs, targets) int32 [count, length]
    and their starts [count]."""
    tokens = np.asarray(tokens)
    if count < 1 or length < 1:
        raise AnalysisError(f"need count >= 1 and length >= 1, got {count}, {length}")
    last = len(tokens) - length - 1
    if last < 0:
        raise AnalysisError(f"the split has {len(tokens)} symbols; windows need {length + 1}")
    starts = np.linspace(0, last, count).round().astype(np.int64)
    idx = starts[:, None] + np.arange(length + 1)[None, :]
    rows = tokens[idx].astype(np.int32)
    return rows[:, :-1], rows[:, 1:], starts
