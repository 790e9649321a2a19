"""Every default of a run (``default_config()``: the paper's HyperRHN on PTB), the ``train`` and
``eval`` blocks, and ``prepare_config(config)``: fills the fields an older config lacks and
validates every block, errors one line (``rhhjax.errors.UserError``)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

import ml_collections
import numpy as np

from rhhjax import data as data_lib
from rhhjax import evaluation as eval_lib
from rhhjax import models
from rhhjax.errors import UserError
from rhhjax.ops import persistent_variant


def default_config() -> ml_collections.ConfigDict:
    """Every field of every block at its default (the paper's HyperRHN on PTB)."""
    config = ml_collections.ConfigDict()
    config.variant = ""  # Which variant of its config file produced the config.
    config.seed = 0  # Seeds parameters, dropout and the batch sampler.
    config.data = data_lib.default_data_config()
    config.model = dataclasses.asdict(models.ModelConfig())
    config.train = default_train_config()
    config.eval = default_eval_config()
    return config


def default_train_config() -> ml_collections.ConfigDict:
    """The ``train`` block at its defaults (the paper's optimizer and batch)."""
    train = ml_collections.ConfigDict()
    train.batch_size = 256  # Sequences per step (paper: 256; the paper's code used 200).
    train.seq_len = 100  # Characters per training sequence (inputs and targets each).
    train.optimizer = "adam"  # adam (paper) | sgd (Zilly's recipe, with lr_decay).
    train.learning_rate = 1e-3  # Step size (paper HyperRHN: Adam 1e-3; RHN: 5e-4).
    train.lr_decay = 1.0  # sgd: divide the learning rate by this once per epoch...
    train.lr_decay_start_epoch = 0  # ...from this 0-based epoch on.
    train.schedule = "constant"  # adam: constant (paper) | cosine | linear (warm-up, decay).
    train.warmup_steps = 0  # Steps of the linear warm-up from 0 (schedule cosine / linear).
    train.final_lr_fraction = 0.1  # The floor of the decay, as a fraction of learning_rate.
    train.b1 = 0.9  # Adam beta1.
    train.b2 = 0.999  # Adam beta2.
    train.weight_decay = 0.0  # Decoupled weight decay (AdamW) when > 0.
    train.clip_norm = 10.0  # Gradient clipping threshold; 0 disables clipping.
    train.clip_type = "l1"  # l1 (the paper code's total L1 norm) | l2 (global L2 norm).
    train.max_epochs = 1000  # Upper bound on epochs (an epoch = len(train) / (batch*seq_len)).
    train.max_steps = 0  # Stop after this many steps when > 0 (takes precedence).
    train.max_minutes = 0.0  # Stop after this much training time when > 0 (over restarts).
    train.budget_minutes = 0.0  # A budget in minutes when > 0, fixed in steps after the probe.
    train.budget_probe_steps = 20  # Steps timed to turn budget_minutes into steps.
    train.budget_step_seconds = 0.0  # > 0: seconds per step instead of measured ones.
    train.eval_every_steps = 0  # Validate every N steps; 0 = once per epoch (and at the stop).
    train.patience = 20  # Early stopping: evaluations without a new best valid BPC; 0 = off.
    train.log_every_steps = 50  # Progress line and metrics record every N steps.
    train.checkpoint_every_steps = 0  # Extra checkpoints every N steps; 0 = at evaluations.
    train.keep_checkpoints = 3  # Latest checkpoints kept (the best one is kept as well).
    train.checkpoint_every_minutes = 10.0  # Also checkpoint after this wall time; 0 = off.
    train.on_nonfinite = "stop"  # stop | rollback (restore the last checkpoint and go on).
    train.divergence_factor = 10.0  # A loss above this x ln(vocab) diverged; 0 = off.
    train.tensorboard = False  # Also write TensorBoard events (pip install -e ".[tensorboard]").
    train.distributed = False  # Several hosts: call jax.distributed.initialize().
    train.fsdp = False  # Also split parameters / optimizer state over devices (FSDP-style).
    train.check_memory = True  # Refuse a config whose estimated peak memory is not free.
    train.autotune_seconds = 60.0  # model.impl=auto on one GPU: time fused / persistent; 0 = off.
    return train


def default_eval_config() -> ml_collections.ConfigDict:
    """The ``eval`` block at its defaults: the periodic validation and the final evaluation."""
    evaluation = ml_collections.ConfigDict()
    evaluation.batch_size = 256  # Rows per evaluation batch.
    evaluation.seq_len = 100  # Window / chunk length of the windows and stream protocols.
    evaluation.min_context = 50  # windows protocol: minimum context of every scored char.
    evaluation.valid_protocol = "windows"  # Protocol of the periodic validation.
    evaluation.final_protocols = "windows,stream,paper"  # Run on the best checkpoint at the end.
    evaluation.max_valid_chars = 0  # Periodic validation on a prefix of valid if > 0.
    return evaluation


def defaults() -> dict[str, Any]:
    return default_config().to_dict()


def fill_defaults(items: dict[str, Any], default: Mapping[str, Any]) -> None:
    """Add to ``items`` (in place, recursively) every field of ``default`` it lacks."""
    for key, value in default.items():
        if key not in items:
            items[key] = value
        elif isinstance(value, Mapping) and isinstance(items[key], dict):
            fill_defaults(items[key], value)


# must match between a workdir's run and the config that resumes it
RESUME_FIELDS = (
    "seed",
    "data.format",
    "data.text_vocab",
    "data.unk",
    "data.sampler",
    "train.batch_size",
    "train.seq_len",
    "train.optimizer",
    "train.schedule",  # constant or not: the optimizer state's shape
)
# May change on resume: how the recurrence runs, not what it computes.
MODEL_FIELDS_FREE = (
    "impl", "pallas_mode", "dtype", "lowrank_op", "lowrank_remat", "vocab_size", "persistent",
)  # fmt: skip


class TrainError(UserError):
    """A user-facing problem with the config or the workdir; the message is one line."""


def prepare_config(config: Any) -> ml_collections.ConfigDict:
    """An unlocked copy of ``config`` with the optional fields filled in, validated."""
    try:
        items = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    except (OSError, AttributeError, TypeError) as e:
        raise TrainError(f"cannot read the config: {e}") from e
    for section in ("data", "model", "train", "eval"):
        if not isinstance(items.get(section), Mapping):
            raise TrainError(f"config has no {section!r} section")
    _variant_fields_of_text(items["model"])
    fill_defaults(items, defaults())
    cfg = ml_collections.ConfigDict(items)
    validate_config(cfg)
    return cfg


def _variant_fields_of_text(model: dict) -> None:
    """An older config's ``persistent_variant`` text (its default layout the grid; "auto" the
    default) -> ``model.persistent``'s fields, in place."""
    if "persistent_variant" not in model:
        return
    text = str(model.pop("persistent_variant")).strip()
    if text in ("default", "auto"):
        return
    if "layout=" not in text:
        text = "layout=grid," + text
    try:
        variant = persistent_variant.parse_variant(text)
    except persistent_variant.VariantError as error:
        raise TrainError(f"model.persistent_variant={text!r} {error}") from None
    model.setdefault("persistent", dataclasses.asdict(variant))


def bound_reached(
    train,
    steps_per_epoch: int,
    step: int,
    evals_since_best: int,
    train_seconds: float,
    budget_steps: int = 0,
) -> str | None:
    """Which bound of the ``train`` block stops a run at ``step``, or None."""
    if budget_steps and step >= budget_steps:
        return "budget"
    if train.max_steps and step >= train.max_steps:
        return "max_steps"
    if train.max_epochs and step >= train.max_epochs * steps_per_epoch:
        return "max_epochs"
    if train.max_minutes and train_seconds >= 60.0 * train.max_minutes:
        return "max_minutes"
    if train.patience and evals_since_best >= train.patience:
        return "early_stopping"
    return None


def budget_steps_for(train, elapsed_seconds: float, step: int, step_seconds: float) -> int:
    """Steps ``train.budget_minutes`` buys (at least ``step``)."""
    budget = 60.0 * float(train.budget_minutes)
    if train.budget_step_seconds:
        return _whole(budget / float(train.budget_step_seconds))
    return step + max(0, _whole((budget - elapsed_seconds) / step_seconds))


def _whole(steps: float) -> int:
    """``floor(steps)``, a ratio whole up to rounding (0.6 / 0.05) counting whole."""
    return int(math.floor(steps + 1e-6))


def check_budget_steps(
    train, budget_steps: int, step_seconds: float, elapsed_seconds: float = 0.0, fix: str = ""
) -> None:
    """TrainError (one line) when the budget's steps leave no decay after the warm-up."""
    if train.schedule != "constant" and budget_steps <= train.warmup_steps + 1:
        spent = f"{elapsed_seconds:.1f} s on the first steps (compilation included), then "
        raise TrainError(
            f"train.budget_minutes={train.budget_minutes:g} buys {budget_steps} steps "
            f"({spent if elapsed_seconds else ''}{step_seconds:.3g} s a step), too few for "
            f"train.warmup_steps={train.warmup_steps} and a decay: "
            f"{fix or 'raise budget_minutes or lower warmup_steps'}"
        )


def step_bounds(train, steps_per_epoch: int) -> list[tuple[str, int]]:
    """(field, step) of each step bound set before the run starts: max_steps, max_epochs'."""
    bounds = [("max_steps", int(train.max_steps))]
    bounds.append(("max_epochs", int(train.max_epochs) * int(steps_per_epoch)))
    return [(name, step) for name, step in bounds if step]


def check_schedule_horizon(train, steps_per_epoch: int) -> None:
    """TrainError (one line) when a step bound leaves no decay after the warm-up."""
    if train.schedule == "constant":
        return
    for name, step in step_bounds(train, steps_per_epoch):
        if step <= train.warmup_steps + 1:
            shown = f"{name}={getattr(train, name)}"
            shown += "" if name == "max_steps" else f" ({step} steps)"
            raise TrainError(
                f"train.{shown} leaves no decay after train.warmup_steps={train.warmup_steps}: "
                f"raise {name} or lower warmup_steps"
            )


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise TrainError(f"{name}={value!r} must be an integer >= {minimum}")


def _check_float(name: str, value: Any, low: float, high: float = math.inf, **kw) -> None:
    low_open = kw.get("low_open", False)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and value <= high
    if not ok:
        if high == math.inf:  # "in (0.0, inf]" would admit the inf it refuses
            above = ">" if low_open else ">="
            raise TrainError(f"{name}={value!r} must be a finite number {above} {low}")
        bracket = "(" if low_open else "["
        raise TrainError(f"{name}={value!r} must be a finite number in {bracket}{low}, {high}]")


def _check_choice(name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise TrainError(f"{name}={value!r} is not one of {', '.join(map(str, choices))}")


def validate_config(cfg: ml_collections.ConfigDict) -> None:
    """Checks every field the trainer reads; raises TrainError / ConfigError (one line)."""
    _check_int("seed", cfg.seed, 0)
    models.ModelConfig.from_config(cfg.model)
    data_lib.validate_data_config(cfg.data)
    t, e = cfg.train, cfg.eval
    _check_int("train.batch_size", t.batch_size, 1)
    _check_int("train.seq_len", t.seq_len, 1)
    _check_choice("train.optimizer", t.optimizer, ("adam", "sgd"))
    _check_float("train.learning_rate", t.learning_rate, 0.0, low_open=True)
    _check_choice("train.schedule", t.schedule, ("constant", "cosine", "linear"))
    _check_int("train.warmup_steps", t.warmup_steps, 0)
    _check_float("train.final_lr_fraction", t.final_lr_fraction, 0.0, 1.0)
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
    _check_float("train.budget_minutes", t.budget_minutes, 0.0)
    _check_int("train.budget_probe_steps", t.budget_probe_steps, 1)
    _check_float("train.budget_step_seconds", t.budget_step_seconds, 0.0)
    _check_schedule(t)
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
    _check_choice("train.check_memory", t.check_memory, (False, True))
    _check_float("train.autotune_seconds", t.autotune_seconds, 0.0)
    if not (t.max_epochs or t.max_steps or t.max_minutes or t.budget_minutes or t.patience):
        raise TrainError(
            "nothing stops training: set train.max_steps, max_epochs, max_minutes, "
            "budget_minutes or patience"
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


def _check_schedule(t) -> None:
    if t.schedule == "constant":
        return
    if t.optimizer != "adam":
        raise TrainError(
            f"train.schedule={t.schedule!r} applies to adam; sgd decays with train.lr_decay"
        )
    if not (t.budget_minutes or t.max_steps or t.max_epochs):
        raise TrainError(
            f"train.schedule={t.schedule!r} decays over the run: set train.budget_minutes, "
            "max_steps or max_epochs"
        )
    if t.max_minutes and not t.budget_minutes:
        raise TrainError(
            f"train.schedule={t.schedule!r} decays to the run's last step, which "
            f"train.max_minutes={t.max_minutes:g} does not fix: set train.budget_minutes="
            f"{t.max_minutes:g} instead (the time turned into steps), and max_minutes=0"
        )
    if t.budget_minutes and t.budget_step_seconds:
        steps = budget_steps_for(t, 0.0, 0, t.budget_step_seconds)
        check_budget_steps(t, steps, t.budget_step_seconds)
    elif t.budget_minutes and t.warmup_steps <= t.budget_probe_steps + 1:
        raise TrainError(
            f"train.warmup_steps={t.warmup_steps} must exceed budget_probe_steps + 1 = "
            f"{t.budget_probe_steps + 1}: the budget is fixed after the probe, before the "
            "decay starts"
        )
    if t.max_steps and t.max_steps <= t.warmup_steps + 1:
        check_schedule_horizon(t, 0)  # max_epochs needs the data: prepare_run checks it


def config_to_json(cfg: ml_collections.ConfigDict) -> str:
    return json.dumps(cfg.to_dict(), indent=2, sort_keys=True) + "\n"
