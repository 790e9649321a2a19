"""The files of a workdir: ``config.json``, ``metrics.jsonl``, ``results.json``, TensorBoard
events and the ``.lock`` of the running process; and the check that a workdir's run can be
resumed by a config (same model, data, sampler and optimizer shape)."""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ml_collections

from rhhjax import data as data_lib
from rhhjax import models, outputs
from rhhjax.errors import one_line
from rhhjax.train import checkpoint as ckpt_lib
from rhhjax.train import checkpoint_failures
from rhhjax.train.config import (
    MODEL_FIELDS_FREE,
    RESUME_FIELDS,
    TrainError,
    bound_reached,
    defaults,
)

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"
RESULTS_FILE = "results.json"
BUDGET_REFUSED_FILE = "budget_refused.json"  # a measured budget refused: not measured again
# The fields a budget's refusal depends on, beside the device that measured it.
REFUSAL_FIELDS = ("budget_minutes", "budget_step_seconds", "budget_probe_steps", "schedule",
                 "warmup_steps", "batch_size", "seq_len")  # fmt: skip


class WorkdirWriteError(TrainError):
    """A file of the workdir could not be written (a full disk, say); one line."""


def _write_failure(path: Path, nbytes: int, error: OSError) -> WorkdirWriteError:
    if error.errno == errno.ENOSPC:
        why = f"no space left on device ({checkpoint_failures.space_needed(path.parent, nbytes)})"
        fix = "free some space and run the same command again"
    else:
        why = error.strerror or " ".join(str(error).split())
        fix = "run the same command again once it can be written"
    return WorkdirWriteError(f"cannot write {path}: {why}; {checkpoints_left(path.parent)}: {fix}")


def checkpoints_left(workdir: Path) -> str:
    folder = workdir / ckpt_lib.LATEST_DIR
    steps = [int(p.name) for p in folder.iterdir() if p.name.isdigit()] if folder.is_dir() else []
    if steps:
        return f"the checkpoints are intact (the latest: step {max(steps)})"
    return "no checkpoint has been written yet"


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def json_dumps(value: Any, **kwargs) -> str:
    return json.dumps(json_safe(value), allow_nan=False, **kwargs)


class MetricsLog:
    """``metrics.jsonl``: one JSON object per line, appended and flushed as it goes."""

    def __init__(self, path: Path, enabled: bool = True):
        self.path = path
        self.enabled = enabled

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        records = []
        for line in self.path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return records

    def truncate_after(self, step: int) -> None:
        if not self.enabled or not self.path.exists():
            return
        kept = [r for r in self.read() if (r.get("step") or 0) <= step]
        atomic_write(self.path, "".join(json_dumps(r) + "\n" for r in kept))

    def append(self, record: dict) -> None:
        if not self.enabled:
            return
        line = json_dumps(record) + "\n"
        try:
            with open(self.path, "a") as f:
                f.write(line)
                f.flush()
        except OSError as e:
            raise _write_failure(self.path, len(line), e) from None


def file_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write(path: Path, text: str) -> None:
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, file_mode())  # mkstemp makes 0600; the other files are 0666 - umask
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise _write_failure(path, len(text.encode()), e) from None
        raise


class WorkdirLock:
    """An exclusive ``flock`` on ``<workdir>/.lock`` for the duration of a run."""

    NAME = outputs.WORKDIR_LOCK

    def __init__(self, workdir: Path):
        self.path = workdir / self.NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        import fcntl

        held = outputs.take_held(self.path)  # taken at start-up (trainer.console)
        if held is not None:
            self._fd = held
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, file_mode())
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            message = outputs.in_use_message(self.path.parent, fd)
            os.close(fd)
            raise TrainError(message) from None
        except OSError:  # a filesystem without flock (some network filesystems): no lock
            pass
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> WorkdirLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def finished_results(workdir: Path, cfg, meta: dict | None, steps_per_epoch: int) -> dict | None:
    """The stored results if the run already finished under ``cfg``'s bounds, else None."""
    path = workdir / RESULTS_FILE
    if meta is None or not path.is_file():
        return None
    try:
        results = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if results.get("status") != "finished" or results.get("step") != meta.get("step"):
        return None
    if (meta.get("config") or {}).get("eval") != cfg.to_dict()["eval"]:
        return None
    stop = bound_reached(
        cfg.train,
        steps_per_epoch,
        int(meta["step"]),
        int(meta.get("evals_since_best", 0)),
        float(meta.get("train_seconds", 0.0)),
        int(meta.get("budget_steps", 0)),
    )
    return results if stop is not None else None


# May change on resume: they take effect from the resumed step, each with one line.
RESUME_FIELDS_APPLIED = (
    "train.learning_rate", "train.b1", "train.b2", "train.weight_decay", "train.clip_norm",
    "train.clip_type", "train.lr_decay", "train.lr_decay_start_epoch",
)  # fmt: skip
# Fixed when the schedule starts: a change on resume is refused (docs/operations.md).
SCHEDULE_FIELDS = ("train.warmup_steps", "train.final_lr_fraction")
BUDGET_FIELDS = ("train.budget_minutes", "train.budget_step_seconds")


def resume_changes(workdir: Path, cfg, meta: Mapping[str, Any] | None) -> list[str]:
    """A line per field changed since ``meta`` that applies; TrainError for a refused one."""
    if meta is None:
        return []
    default = flat_fields(defaults())
    old = {**default, **flat_fields(meta.get("config") or {})}
    new = flat_fields(cfg.to_dict())
    step, budget_steps = meta.get("step"), int(meta.get("budget_steps") or 0)
    back = "use another --workdir to start over with it"
    refused = list(BUDGET_FIELDS) if budget_steps else []
    refused += list(SCHEDULE_FIELDS) if new["train.schedule"] != "constant" else []
    for name in refused:
        if old.get(name) != new.get(name):
            why = (
                f"its budget is fixed at {budget_steps:,} steps"
                if name in BUDGET_FIELDS
                else "its schedule is fixed at the start"
            )
            raise TrainError(
                f"workdir {workdir} holds a run with {name}={old.get(name)!r}, this config has "
                f"{new.get(name)!r}: {why}; set {name}={old.get(name)!r} to resume it, or {back}"
            )
    applied = RESUME_FIELDS_APPLIED + (() if budget_steps else BUDGET_FIELDS)
    lines = [
        f"resume: {name} {old.get(name)!r} -> {new.get(name)!r} from step {step} on"
        for name in applied
        if old.get(name) != new.get(name)
    ]
    return lines + _bound_changes(old, new, step)


def _bound_changes(old: dict, new: dict, step: Any) -> list[str]:
    """The line for a step bound changed under a schedule: its horizon stays."""
    if new["train.schedule"] == "constant":
        return []
    changed = [n for n in ("train.max_steps", "train.max_epochs") if old.get(n) != new.get(n)]
    return [
        f"resume: {name} {old.get(name)!r} -> {new.get(name)!r} from step {step} on; the "
        "schedule keeps the length fixed at its start (after it: the floor, final_lr_fraction "
        "x learning_rate)"
        for name in changed
    ]


def tensorboard_writer_class():
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        raise TrainError(
            "train.tensorboard=True needs the tensorboardX package: "
            'pip install -e ".[tensorboard]" (or set train.tensorboard=False)'
        ) from None
    return SummaryWriter


class EventWriter:
    """TensorBoard events in ``<workdir>/tensorboard``; a resume hides later ones."""

    DIR = "tensorboard"

    def __init__(self, writer_class, workdir: Path, start_step: int):
        self._logdir = str(workdir / self.DIR)
        self._writer_class = writer_class
        self._writer = self._open(start_step)

    def _open(self, step: int):
        """A writer whose file sorts after every earlier one (a nanosecond suffix)."""
        suffix = f".{time.time_ns():020d}"
        return self._writer_class(logdir=self._logdir, purge_step=step + 1, filename_suffix=suffix)

    def rewind(self, step: int) -> None:
        self._writer.close()
        self._writer = self._open(step)

    def _scalars(self, step: int, values: dict) -> None:
        for tag, value in values.items():
            if value is not None and math.isfinite(value):
                self._writer.add_scalar(tag, value, global_step=step)
        self._writer.flush()

    def train(self, r: dict) -> None:
        self._scalars(
            r["step"],
            {
                "train/loss": r["loss"],
                "train/bpc": r["bpc"],
                "train/grad_norm": r["grad_norm"],
                "train/learning_rate": r["lr"],
                "train/chars_per_sec": r["chars_per_sec"],
            },
        )

    def valid(self, r: dict) -> None:
        self._scalars(
            r["step"],
            {
                f"valid_{r['protocol']}/bpc": r["bpc"],
                f"valid_{r['protocol']}/accuracy": r["acc"],
                f"valid_{r['protocol']}/loss": r["loss"],
            },
        )

    def close(self) -> None:
        self._writer.close()


def config_json_warning(workdir: Path, meta: Mapping[str, Any]) -> str | None:
    """One line when ``config.json`` is missing or disagrees with the checkpoint."""
    path = workdir / CONFIG_FILE
    step = meta.get("step")
    follow = f"following the checkpoint of step {step}"
    if not path.exists():
        return f"{path} is missing; {follow}"
    try:
        written = json.loads(path.read_text())
        if not isinstance(written, dict):
            raise ValueError("not an object")
    except (OSError, UnicodeDecodeError, ValueError) as e:
        reason = "not JSON" if isinstance(e, json.JSONDecodeError) else one_line(e)
        return f"{path} does not read ({reason}); {follow}"
    differing = _differing_fields(written, meta)
    if not differing:
        return None
    shown = ", ".join(f"{name} ({mine!r} there, {saved!r} in the checkpoint)"
                      for name, mine, saved in differing[:3])  # fmt: skip
    more = f" and {len(differing) - 3} more" if len(differing) > 3 else ""
    return f"{path} differs from the checkpoint of step {step} in {shown}{more}; {follow}"


def _differing_fields(written: dict, meta: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(field, config.json's value, the checkpoint's) of each model / data field."""
    default = flat_fields(defaults())
    mine = {**default, **flat_fields(written)}
    saved = {**default, **flat_fields(meta.get("config") or {})}
    saved.update({f"model.{k}": v for k, v in flat_fields(meta.get("model") or {}).items()})
    names = [f"model.{f.name}" for f in dataclasses.fields(models.ModelConfig)]
    names = [n for n in names if n.split(".")[1] not in MODEL_FIELDS_FREE] + list(RESUME_FIELDS)
    return [(n, mine.get(n), saved.get(n)) for n in names if mine.get(n) != saved.get(n)]


def check_workdir_writable(workdir: Path) -> None:
    if workdir.exists() and not workdir.is_dir():
        raise TrainError(f"workdir {workdir} exists and is not a directory")
    probe = workdir
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise TrainError(f"cannot create workdir {workdir}: {probe} is not a directory")
    try:
        fd, name = tempfile.mkstemp(prefix=".rhhjax-write-test.", dir=probe)
        os.close(fd)
        os.unlink(name)
    except OSError as e:
        reason = e.strerror or str(e)
        raise TrainError(f"workdir {workdir} is not writable ({probe}: {reason})") from None


def flat_fields(d: Mapping, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(flat_fields(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def check_compatible(
    workdir: Path,
    cfg: ml_collections.ConfigDict,
    mc: models.ModelConfig,
    vocab: data_lib.Vocab,
    sampler_state: dict,
) -> dict | None:
    """The newest readable checkpoint's meta (or None); TrainError on a difference."""
    meta = None
    if ckpt_lib.has_checkpoint(workdir):
        try:
            with ckpt_lib.Checkpoints(workdir, read_only=True) as ckpts:
                meta = ckpts.newest_readable_meta()
        except Exception as e:
            raise TrainError(f"cannot read the checkpoint in {workdir}: {e}") from None
    saved_cfg = meta["config"] if meta else None
    where = "its checkpoint"
    if saved_cfg is None and (workdir / CONFIG_FILE).exists():
        try:
            saved_cfg = json.loads((workdir / CONFIG_FILE).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise TrainError(f"cannot read {workdir / CONFIG_FILE}: {e}") from None
        where = CONFIG_FILE
    if saved_cfg is None:
        return None
    hint = "use another --workdir, or delete this one to start over"
    if meta is not None and meta.get("version") != ckpt_lib.META_VERSION:
        raise TrainError(f"workdir {workdir} holds a checkpoint of another format; {hint}")
    old_model = dict(meta["model"]) if meta else dict(saved_cfg.get("model", {}))
    new_model = dataclasses.asdict(mc)
    model_defaults = {f.name: f.default for f in dataclasses.fields(models.ModelConfig)}
    for name, value in new_model.items():
        if name in MODEL_FIELDS_FREE:
            continue
        if old_model.get(name, model_defaults[name]) != value:
            raise TrainError(
                f"workdir {workdir} holds a run with model.{name}={old_model.get(name)!r} "
                f"({where}), this config has {value!r}; {hint}"
            )
    old_flat, new_flat = flat_fields(saved_cfg), flat_fields(cfg.to_dict())
    default_flat = flat_fields(defaults())
    for name in RESUME_FIELDS:
        old = old_flat.get(name, default_flat.get(name))
        if old != new_flat.get(name):
            raise TrainError(
                f"workdir {workdir} holds a run with {name}={old!r} ({where}), this config has "
                f"{new_flat.get(name)!r}; {hint}"
            )
    if meta is not None and meta.get("vocab") != vocab.to_dict():
        raise TrainError(
            f"workdir {workdir} holds a run with a different vocabulary "
            f"({len(meta['vocab']['symbols'])} symbols, the data now gives {len(vocab.symbols)}); "
            f"{hint}"
        )
    if meta is not None:
        old_sampler = meta.get("sampler", {})
        for key in ("sampler", "n_tokens", "batch_size", "seq_len", "random_offset"):
            if old_sampler.get(key) != sampler_state.get(key):
                raise TrainError(
                    f"workdir {workdir} holds a run whose sampler had {key}="
                    f"{old_sampler.get(key)!r}, this config's has {sampler_state.get(key)!r} "
                    f"(different training data?); {hint}"
                )
    return meta


def _budget_key(train, device: str) -> dict:
    return {**{name: train[name] for name in REFUSAL_FIELDS}, "device": device}


def record_budget_refusal(
    workdir: Path, train, device: str, line: str, step_seconds: float
) -> None:
    """Keep a refused budget's line and step time, so that a rerun of the same budget on the
    same device that its step time alone refuses is refused before it compiles."""
    record = {"key": _budget_key(train, device), "line": line, "step_seconds": step_seconds}
    atomic_write(workdir / BUDGET_REFUSED_FILE, json.dumps(record, indent=1) + "\n")


def check_budget_refusal(workdir: Path, train, device: str) -> None:
    """TrainError (the recorded line) when this budget was refused here on this device and
    its measured step time alone leaves no decay after the warm-up."""
    path = workdir / BUDGET_REFUSED_FILE
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if record.get("key") != json_safe(_budget_key(train, device)):
        return
    # a budget the first steps' compilation alone made too short is measured again
    steps = int(60.0 * train.budget_minutes / max(float(record.get("step_seconds", 0)), 1e-9))
    if steps <= train.warmup_steps + 1:
        raise TrainError(
            f"{record['line']} (measured by an earlier run in this workdir on {device}; change "
            f"a budget field, or delete {path} to measure again)"
        )
