"""The ``train`` and ``eval`` blocks of a config, and the whole config as a run reads it.

``prepare_config(config)`` fills the fields an older config (a workdir's ``config.json``) lacks
from ``rhhjax.configs.ptb`` and validates every block: ``data`` (``rhhjax.data``), ``model``
(``rhhjax.models.ModelConfig``), ``train`` and ``eval`` (here). Errors are one line
(``TrainError``, ``ConfigError``, ``DataError``: all ``rhhjax.errors.UserError``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import ml_collections
import numpy as np

from rhhjax import configs, models
from rhhjax import data as data_lib
from rhhjax import evaluation as eval_lib
from rhhjax.errors import UserError


def defaults() -> dict[str, Any]:
    """Every field's default: ``configs/ptb.py`` (the paper recipe), as a nested dict."""
    return configs.load("ptb").to_dict()


def fill_defaults(items: dict[str, Any], default: Mapping[str, Any]) -> None:
    """Add to ``items`` (in place, recursively) every field of ``default`` it lacks: a config
    written before a field existed (a workdir's ``config.json``) gets its default."""
    for key, value in default.items():
        if key not in items:
            items[key] = value
        elif isinstance(value, Mapping) and isinstance(items[key], dict):
            fill_defaults(items[key], value)


# Fields that must match between a workdir's run and the config that resumes it (besides the
# vocabulary): everything that shapes the parameters, optimizer state or sampler state.
RESUME_FIELDS = (
    "seed",
    "data.format",
    "data.text_vocab",
    "data.unk",
    "data.sampler",
    "train.batch_size",
    "train.seq_len",
    "train.optimizer",
)
# May change on resume: how the recurrence runs, not what it computes.
MODEL_FIELDS_FREE = (
    "impl", "pallas_mode", "kernel", "dtype", "lowrank_op", "lowrank_remat", "vocab_size"
)  # fmt: skip


class TrainError(UserError):
    """A user-facing problem with the config or the workdir; the message is one line."""


def prepare_config(config: Any) -> ml_collections.ConfigDict:
    """An unlocked copy of ``config`` with the optional fields filled in, validated.

    Raises TrainError / ConfigError (one line) on the first invalid value.
    """
    try:
        items = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    except (OSError, AttributeError, TypeError) as e:
        raise TrainError(f"cannot read the config: {e}") from e
    for section in ("data", "model", "train", "eval"):
        if not isinstance(items.get(section), Mapping):
            raise TrainError(f"config has no {section!r} section")
    fill_defaults(items, defaults())
    cfg = ml_collections.ConfigDict(items)
    validate_config(cfg)
    return cfg


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise TrainError(f"{name}={value!r} must be an integer >= {minimum}")


def _check_float(name: str, value: Any, low: float, high: float = math.inf, **kw) -> None:
    low_open = kw.get("low_open", False)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and value <= high
    if not ok:
        bracket = "(" if low_open else "["
        raise TrainError(f"{name}={value!r} must be a number in {bracket}{low}, {high}]")


def _check_choice(name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise TrainError(f"{name}={value!r} is not one of {', '.join(map(str, choices))}")


def validate_config(cfg: ml_collections.ConfigDict) -> None:
    """Checks every field the trainer reads; raises TrainError / ConfigError (one line)."""
    _check_int("seed", cfg.seed, 0)
    models.ModelConfig.from_config(cfg.model)  # raises models.ConfigError
    data_lib.validate_data_config(cfg.data)  # raises DataError
    t, e = cfg.train, cfg.eval
    _check_int("train.batch_size", t.batch_size, 1)
    _check_int("train.seq_len", t.seq_len, 1)
    _check_choice("train.optimizer", t.optimizer, ("adam", "sgd"))
    _check_float("train.learning_rate", t.learning_rate, 0.0, low_open=True)
    _check_float("train.b1", t.b1, 0.0, 1.0)
    _check_float("train.b2", t.b2, 0.0, 1.0)
    _check_float("train.weight_decay", t.weight_decay, 0.0)
    _check_float("train.clip_norm", t.clip_norm, 0.0)
    _check_choice("train.clip_type", t.clip_type, ("l1", "l2"))
    _check_float("train.lr_decay", t.lr_decay, 1.0)
    _check_int("train.lr_decay_start_epoch", t.lr_decay_start_epoch, 0)
    _check_int("train.max_epochs", t.max_epochs, 0)
    _check_int("train.max_steps", t.max_steps, 0)
    _check_float("train.max_minutes", t.max_minutes, 0.0)
    _check_int("train.eval_every_steps", t.eval_every_steps, 0)
    _check_int("train.patience", t.patience, 0)
    _check_int("train.log_every_steps", t.log_every_steps, 1)
    _check_int("train.checkpoint_every_steps", t.checkpoint_every_steps, 0)
    _check_int("train.keep_checkpoints", t.keep_checkpoints, 1)
    _check_float("train.checkpoint_every_minutes", t.checkpoint_every_minutes, 0.0)
    _check_float("train.divergence_factor", t.divergence_factor, 0.0)
    if 0 < t.divergence_factor <= 1:
        raise TrainError(
            f"train.divergence_factor={t.divergence_factor!r} must be 0 (off) or > 1: a loss of "
            f"ln(vocab) is what an untrained model scores"
        )
    _check_choice("train.tensorboard", t.tensorboard, (False, True))
    _check_choice("train.on_nonfinite", t.on_nonfinite, ("stop", "rollback"))
    _check_choice("train.distributed", t.distributed, (False, True))
    _check_choice("train.fsdp", t.fsdp, (False, True))
    if not (t.max_epochs or t.max_steps or t.max_minutes or t.patience):
        raise TrainError(
            "nothing stops training: set train.max_steps, max_epochs, max_minutes or patience"
        )
    _check_int("eval.batch_size", e.batch_size, 1)
    _check_int("eval.seq_len", e.seq_len, 1)
    _check_int("eval.min_context", e.min_context, 0)
    if e.min_context >= e.seq_len:
        raise TrainError(f"eval.min_context={e.min_context} must be < eval.seq_len={e.seq_len}")
    _check_choice("eval.valid_protocol", e.valid_protocol, eval_lib.PROTOCOLS)
    try:
        eval_lib.parse_protocols(e.final_protocols)
    except data_lib.DataError as err:
        raise TrainError(f"eval.final_protocols={e.final_protocols!r}: {err}") from None
    _check_int("eval.max_valid_chars", e.max_valid_chars, 0)
    if e.max_valid_chars:
        need = data_lib.PAPER_SEQ_LEN + 1 if e.valid_protocol == "paper" else 2
        if e.max_valid_chars < need:
            raise TrainError(f"eval.max_valid_chars={e.max_valid_chars} must be 0 or >= {need}")


def config_to_json(cfg: ml_collections.ConfigDict) -> str:
    return json.dumps(cfg.to_dict(), indent=2, sort_keys=True) + "\n"
