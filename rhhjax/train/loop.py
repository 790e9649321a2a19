"""The training loop: ``train_and_evaluate(config, workdir) -> results``.

What a run does, in order:

1. Validates the whole config, loads the data (downloading it if configured), checks the
   workdir (writable; if it holds a run, that run's model config, vocabulary and sampler shape
   match) -- all before anything is written or compiled. Problems raise a
   ``rhhjax.errors.UserError`` (``TrainError``, ``ConfigError``, ``DataError``, ...) with a
   one-line message.
2. Resumes from the latest checkpoint of the workdir if there is one (``metrics.jsonl`` is cut
   back to that step, later checkpoints are deleted), else initialises from ``config.seed``.
3. Trains with a jitted step: Adam (AdamW when ``train.weight_decay > 0``) or SGD with the RHN
   paper's per-epoch decay (``train.optimizer="sgd"``), gradient clipping by the total L1 norm
   (the paper code's) or the global L2 norm. Dropout keys are ``fold_in(key(seed), step)``.
   A progress line every ``train.log_every_steps`` (also a ``train`` record in
   ``metrics.jsonl``); validation BPC every ``train.eval_every_steps`` (0 = once per epoch) on
   ``eval.valid_protocol`` (a ``valid`` record); checkpoints (see ``rhhjax.checkpoint``).
4. Stops at ``max_steps`` / ``max_epochs`` / ``max_minutes``, or when ``patience`` validations
   in a row brought no new best (``patience=0`` disables early stopping). ``max_minutes``
   counts training time across restarts (first-step compilation included, validation and
   saving not); a stop by it validates and checkpoints the stop step first.
5. Evaluates the best checkpoint (the best validation; the final parameters if no
   validation ran) on valid and test under every protocol in ``eval.final_protocols``, prints
   a table and writes ``results.json``. A rerun of a finished run with the same ``eval``
   settings does nothing (the stored results are returned).

The host keeps at most one step queued behind the one the device runs, so a stop takes effect
after the step in flight. Checkpoints: at every validation, every ``checkpoint_every_steps``,
every ``checkpoint_every_minutes`` of wall time, and at the stop.

Interruptions: SIGTERM / SIGINT (``signals.SignalCatcher``) stop after the step in flight, save a
checkpoint and return with ``results["exit_code"] = 128 + signum`` (``train.py`` exits with
it); before training starts, nothing is written; a second signal aborts at once. Rerunning
the same command resumes; the continued run's records in ``metrics.jsonl`` (``train`` and
``valid``; timing fields aside) and parameters are bitwise identical to an uninterrupted
run's, also after ``kill -9`` (the restart goes back to the last checkpoint, and ``best/``
to the best checkpoint that one records).

Non-finite or diverged loss (above ``train.divergence_factor`` x ln(vocab)):
``on_nonfinite="stop"`` raises ``NonFiniteLossError`` (the last checkpoint, which only ever
holds finite parameters, is left as it is); ``"rollback"`` restores the last checkpoint and
continues with the dropout keys folded with a retry counter (an error at once when there is
no checkpoint yet). JSON outputs write non-finite numbers as null.

Files in the workdir: ``config.json`` (the resolved config of the latest start),
``metrics.jsonl``, ``results.json``, ``checkpoints/``, ``best/``, ``tensorboard/`` (with
``train.tensorboard=True``) and ``.lock`` (held by the running process: one run per workdir).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rhhjax import data as data_lib
from rhhjax import evaluation as eval_lib
from rhhjax import models, parallel
from rhhjax.data import downloads
from rhhjax.errors import UserError
from rhhjax.train import checkpoint as ckpt_lib
from rhhjax.train import signals
from rhhjax.train.optim import OptimizerConfig, make_optimizer
from rhhjax.train.step import init_key, make_init, make_train_step

LN2 = math.log(2.0)
MAX_ROLLBACKS = 10
METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"
RESULTS_FILE = "results.json"

# Fields a config file may leave out (configs/ptb.py predates them).
OPTIONAL_DEFAULTS: dict[str, dict[str, Any]] = {
    "train": {
        "optimizer": "adam",
        "lr_decay": 1.0,
        "lr_decay_start_epoch": 0,
        "distributed": False,
        "fsdp": False,
        "checkpoint_every_minutes": 10.0,
        "divergence_factor": 10.0,
        "tensorboard": False,
    },
    "data": {"corpus": "", "url": "", "sha256": ""},
}

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


class NonFiniteLossError(TrainError):
    """The training loss became NaN or inf (``train.on_nonfinite="stop"``)."""


# ----------------------------------------------------------------------------- config


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
    for section, defaults in OPTIONAL_DEFAULTS.items():
        for key, value in defaults.items():
            items[section].setdefault(key, value)
    items.setdefault("seed", 0)
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
    d, t, e = cfg.data, cfg.train, cfg.eval
    _check_choice("data.format", d.get("format"), data_lib.FORMATS)
    _check_choice("data.sampler", d.get("sampler", "windows"), ("windows", "stream"))
    if d.get("corpus"):
        _check_choice("data.corpus", d.corpus, tuple(downloads.CORPORA))
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


# ----------------------------------------------------------------------------- helpers


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (JSON has no NaN / Infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def json_dumps(value: Any, **kwargs) -> str:
    """``json.dumps`` that always writes valid JSON: NaN / inf become null."""
    return json.dumps(json_safe(value), allow_nan=False, **kwargs)


class MetricsLog:
    """``metrics.jsonl``: one JSON object per line, appended and flushed as it goes."""

    def __init__(self, path: Path, enabled: bool = True):
        self.path = path
        self.enabled = enabled  # False on processes other than 0: nothing is written

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        records = []
        for line in self.path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut by kill -9
        return records

    def truncate_after(self, step: int) -> None:
        """Drop every record of a step after ``step`` (an abandoned continuation)."""
        if not self.enabled or not self.path.exists():
            return
        kept = [r for r in self.read() if (r.get("step") or 0) <= step]
        _atomic_write(self.path, "".join(json_dumps(r) + "\n" for r in kept))

    def append(self, record: dict) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as f:
            f.write(json_dumps(record) + "\n")
            f.flush()


def _loss_limit(factor: float, vocab_size: int) -> float:
    """The training loss (nats) above which a run counts as diverged: ``factor`` x ln(V), the
    loss of a uniform guess; inf when ``factor`` is 0 (the guard is off)."""
    return factor * math.log(max(vocab_size, 2)) if factor else math.inf


def _file_mode() -> int:
    """0o666 less the process umask (what ``open()`` gives a new file)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, _file_mode())  # mkstemp makes 0600; the other files are 0666 - umask
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class _WorkdirLock:
    """An exclusive ``flock`` on ``<workdir>/.lock`` for the duration of a run, so a second
    run on the same workdir fails at once instead of interleaving ``metrics.jsonl``."""

    NAME = ".lock"

    def __init__(self, workdir: Path):
        self.path = workdir / self.NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        import fcntl

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, _file_mode())
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise TrainError(
                f"workdir {self.path.parent} is in use by another run (process {holder}); wait "
                f"for it to finish or use another --workdir"
            ) from None
        except OSError:  # a filesystem without flock (some network filesystems): no lock
            pass
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing releases the lock; the file stays (harmless)
            self._fd = None


def _reconcile_best(ckpts: ckpt_lib.Checkpoints, s: _State, log: Callable[[str], None]) -> None:
    """Make ``best/`` hold exactly the best checkpoint the state records (``s.best_step``).

    A kill between saving a new best and the latest checkpoint that records it leaves two best
    checkpoints: the one the resumed state points to is kept, the other deleted. A state
    pointing to a best checkpoint that is missing (workdirs of older versions) forgets it, so
    the next validation makes a new one.
    """
    if s.best_step is not None and s.best_step not in ckpts.steps("best"):
        log(
            f"the best checkpoint of step {s.best_step} is missing from "
            f"{ckpts.workdir / ckpt_lib.BEST_DIR}: the next validation makes a new one"
        )
        s.best_step, s.best_bpc = None, None
    ckpts.keep_only_best(s.best_step)


def _finished_results(workdir: Path, cfg, meta: dict | None, s: _State) -> dict | None:
    """The stored results when the workdir's run finished at ``s.step`` and evaluated with the
    same ``eval`` settings (so there is nothing to redo), else None."""
    path = workdir / RESULTS_FILE
    if meta is None or not path.is_file():
        return None
    try:
        results = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if results.get("status") != "finished" or results.get("step") != s.step:
        return None
    if (meta.get("config") or {}).get("eval") != cfg.to_dict()["eval"]:
        return None
    return results


# ----------------------------------------------------------------------------- TensorBoard


def _tensorboard_writer_class():
    """tensorboardX's ``SummaryWriter``; TrainError (one line) when it is not installed."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        raise TrainError(
            "train.tensorboard=True needs the tensorboardX package: "
            'pip install -e ".[tensorboard]" (or set train.tensorboard=False)'
        ) from None
    return SummaryWriter


class _EventWriter:
    """TensorBoard event files in ``<workdir>/tensorboard`` (``metrics.jsonl`` stays the
    source of truth). A resumed run purges the events after its start step."""

    DIR = "tensorboard"

    def __init__(self, writer_class, workdir: Path, start_step: int):
        kwargs = {"purge_step": start_step} if start_step > 0 else {}
        self._writer = writer_class(logdir=str(workdir / self.DIR), **kwargs)

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


def _check_workdir_writable(workdir: Path) -> None:
    """Raise TrainError unless ``workdir`` exists and is writable or can be created."""
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


def _flat(d: Mapping, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _check_compatible(
    workdir: Path,
    cfg: ml_collections.ConfigDict,
    mc: models.ModelConfig,
    vocab: data_lib.Vocab,
    sampler_state: dict,
) -> dict | None:
    """Compare the workdir's run (checkpoint meta, else config.json) with this config.

    Returns the latest checkpoint's meta (None if there is none); raises TrainError naming
    the first difference.
    """
    meta = None
    if ckpt_lib.has_checkpoint(workdir):
        try:
            with ckpt_lib.Checkpoints(workdir, read_only=True) as ckpts:
                meta = ckpts.read_meta("latest") or ckpts.read_meta("best")
        except Exception as e:  # unreadable checkpoint
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
    defaults = {f.name: f.default for f in dataclasses.fields(models.ModelConfig)}
    for name, value in new_model.items():
        if name in MODEL_FIELDS_FREE:
            continue
        if old_model.get(name, defaults[name]) != value:  # fields added later: their default
            raise TrainError(
                f"workdir {workdir} holds a run with model.{name}={old_model.get(name)!r} "
                f"({where}), this config has {value!r}; {hint}"
            )
    old_flat, new_flat = _flat(saved_cfg), _flat(cfg.to_dict())
    for name in RESUME_FIELDS:
        old = old_flat.get(name, _flat(OPTIONAL_DEFAULTS).get(name))
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


def _format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def _make_sampler(cfg, tokens: np.ndarray):
    t = cfg.train
    if cfg.data.get("sampler", "windows") == "stream":
        return data_lib.StreamSampler(tokens, t.batch_size, t.seq_len, seed=cfg.seed)
    return data_lib.WindowSampler(tokens, t.batch_size, t.seq_len, seed=cfg.seed)


def _log(message: str) -> None:
    print(message, flush=True)


def _silent(message: str) -> None:
    del message


# ----------------------------------------------------------------------------- the loop


@dataclasses.dataclass
class _State:
    """Everything the loop carries between steps (device arrays and host bookkeeping)."""

    params: Any
    opt_state: Any
    carry: Any
    step: int = 0
    retry: int = 0
    best_bpc: float | None = None
    best_step: int | None = None
    evals_since_best: int = 0
    pending_loss: list = dataclasses.field(default_factory=list)
    pending_gnorm: list = dataclasses.field(default_factory=list)
    train_seconds: float = 0.0
    valid_step: int | None = None  # the step of the last validation (None: none yet)


def train_and_evaluate(
    config: Any,
    workdir: str | os.PathLike,
    *,
    log: Callable[[str], None] = _log,
    signals: signals.SignalCatcher | None = None,
) -> dict:
    """Train (or resume) a model in ``workdir`` and evaluate its best checkpoint.

    Returns a dict with ``status`` ("finished" | "interrupted"), ``exit_code`` (0, or
    128 + signum after SIGTERM/SIGINT), ``step``, ``epoch``, ``stop_reason``, ``best_step``,
    ``best_valid_bpc``, ``num_params`` and ``final`` ({split: {protocol: metrics}}, absent
    when interrupted). Raises a ``UserError`` for bad input, before writing anything.

    ``signals``: an entered ``signals.SignalCatcher`` (``train.py`` starts one before importing
    jax); None = catch SIGTERM / SIGINT here for the duration of the call.
    """
    if signals is not None:
        return _train_and_evaluate(config, Path(workdir), log, signals)
    with signals.SignalCatcher(log) as own:
        return _train_and_evaluate(config, Path(workdir), log, own)


def _agreed_flag(value: bool) -> bool:
    """Process 0's ``value`` on every process (a broadcast; the value itself with one)."""
    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils

    return bool(multihost_utils.broadcast_one_to_all(np.int32(value)))


def _train_and_evaluate(
    config: Any, workdir: Path, log: Callable[[str], None], signals: signals.SignalCatcher
) -> dict:
    signals.phase = "startup"
    cfg = prepare_config(config)
    # data parallelism (rhhjax.parallel): every device of every process, batch split over them
    parallel.maybe_initialize_distributed(bool(cfg.train.distributed))
    primary = parallel.is_primary()
    if not primary:  # only process 0 logs and writes metrics / results / config.json
        log = _silent
        signals.log = _silent
    parallel.assert_same_across_processes(config_to_json(cfg), "config")
    mesh = parallel.make_mesh()
    parallel.check_batch_divisible("train.batch_size", cfg.train.batch_size, mesh)
    parallel.check_batch_divisible("eval.batch_size", cfg.eval.batch_size, mesh)
    fsdp = bool(cfg.train.fsdp)
    tensorboard = _tensorboard_writer_class() if cfg.train.tensorboard else None
    corpus = downloads.load_corpus(cfg.data)
    parallel.assert_same_across_processes(
        json.dumps([corpus.vocab.to_dict(), len(corpus.train), len(corpus.valid)]), "data"
    )
    mc = models.ModelConfig.from_config(cfg.model, vocab_size=corpus.vocab.size)
    cfg.model.vocab_size = corpus.vocab.size
    sampler = _make_sampler(cfg, corpus.train)
    valid_tokens = corpus.valid
    if cfg.eval.max_valid_chars:
        valid_tokens = valid_tokens[: cfg.eval.max_valid_chars]
    _check_eval_data(cfg, corpus, valid_tokens)
    _check_workdir_writable(workdir)
    _check_compatible(workdir, cfg, mc, corpus.vocab, sampler.state())
    parallel.sync("rhhjax-validated")  # every process has read the workdir before it changes
    if _agreed_flag(signals.signum is not None):
        name = signal.Signals(signals.signum or signal.SIGTERM).name
        log(f"stopped by {name} before training started; nothing was written")
        return {"status": "interrupted", "exit_code": 128 + (signals.signum or 15), "step": None}
    signals.phase = "training"  # from here on the loop acts on a signal (saving a checkpoint)

    # ---- validation passed: from here on the workdir is written.
    workdir.mkdir(parents=True, exist_ok=True)
    lock = _WorkdirLock(workdir) if primary else None
    try:
        if lock is not None:
            lock.acquire()
        return _run_in_workdir(
            cfg,
            workdir,
            log,
            signals,
            primary,
            mesh,
            fsdp,
            corpus,
            mc,
            sampler,
            valid_tokens,
            tensorboard,
        )
    finally:
        if lock is not None:
            lock.release()


def _run_in_workdir(
    cfg,
    workdir,
    log,
    signals,
    primary,
    mesh,
    fsdp,
    corpus,
    mc,
    sampler,
    valid_tokens,
    tensorboard,
) -> dict:
    """The part of ``train_and_evaluate`` that writes ``workdir`` (its lock held)."""
    if primary:
        _atomic_write(workdir / CONFIG_FILE, config_to_json(cfg))
    metrics = MetricsLog(workdir / METRICS_FILE, enabled=primary)
    t = cfg.train
    bpe = sampler.batches_per_epoch
    oc = OptimizerConfig.from_config(t, bpe)
    # one device: no layout to constrain (and the plain 3-argument call, as tests patch it)
    layout = (mesh, fsdp) if mesh.size > 1 else ()
    train_step = make_train_step(mc, oc, int(cfg.seed), *layout)
    tx = make_optimizer(oc)

    def initial_state(retry: int = 0) -> _State:
        params = make_init(mc)(init_key(int(cfg.seed)))  # eagerly, on every process
        opt_state = tx.init(params)
        carry = parallel.shard_batch(eval_lib.zero_carry(mc, params, t.batch_size), mesh)
        carry = jax.tree.map(jnp.copy, carry)  # distinct buffers (the LSTM's alias): donated
        params = parallel.put_state(params, mesh, fsdp)
        opt_state = parallel.put_state(opt_state, mesh, fsdp)
        return _State(params=params, opt_state=opt_state, carry=carry, retry=retry)

    ckpts = ckpt_lib.Checkpoints(workdir, keep=t.keep_checkpoints)
    events = None
    try:
        state = initial_state()
        num_params = models.count_params(state.params)
        templates = ckpt_lib.abstract((state.params, state.opt_state, state.carry))
        base_meta = {
            "version": ckpt_lib.META_VERSION,
            "vocab": corpus.vocab.to_dict(),
            "model": dataclasses.asdict(mc),
            "config": cfg.to_dict(),
            "num_params": num_params,
        }

        def restore(step: int) -> _State:
            params, opt_state, carry, m = ckpts.restore_latest(step, *templates)
            sampler.restore(m["sampler"])
            return _State(
                params=params,
                opt_state=opt_state,
                carry=carry,
                step=int(m["step"]),
                retry=int(m["rng"]["retry"]),
                best_bpc=m["best"]["bpc"],
                best_step=m["best"]["step"],
                evals_since_best=int(m["evals_since_best"]),
                pending_loss=list(m["pending"]["loss"]),
                pending_gnorm=list(m["pending"]["grad_norm"]),
                train_seconds=float(m["train_seconds"]),
                valid_step=m.get("valid_step"),
            )

        latest = ckpts.latest_step()
        resumed_meta = None
        if latest is not None:
            state = restore(latest)
            resumed_meta = ckpts.read_meta("latest", latest)
            log(f"resuming {workdir} from step {state.step} (epoch {state.step / bpe:.2f})")
        else:
            log(f"training {mc.type} ({num_params:,} parameters) in {workdir}")
        start_step = state.step
        metrics.truncate_after(start_step)
        ckpts.prune_after(start_step)
        _reconcile_best(ckpts, state, log)
        metrics.append(
            {
                "kind": "event",
                "event": "resume" if latest is not None else "start",
                "step": start_step,
                "time": time.time(),
            }
        )
        log(
            f"data {corpus.name} from {corpus.source or '?'}: vocab {corpus.vocab.size}, "
            f"train {len(corpus.train):,} / valid {len(corpus.valid):,} / "
            f"test {len(corpus.test):,} symbols; {bpe:,} steps per epoch of "
            f"{t.batch_size} x {t.seq_len}"
        )

        def save_meta(s: _State) -> dict:
            return {
                **base_meta,
                "step": s.step,
                "epoch": s.step / bpe,
                "sampler": sampler.state(),
                "rng": {"seed": int(cfg.seed), "retry": s.retry},
                "best": {"bpc": s.best_bpc, "step": s.best_step},
                "evals_since_best": s.evals_since_best,
                "pending": {"loss": list(s.pending_loss), "grad_norm": list(s.pending_gnorm)},
                "train_seconds": s.train_seconds,
                "valid_step": s.valid_step,
            }

        loop = _Loop(
            cfg=cfg,
            mc=mc,
            oc=oc,
            bpe=bpe,
            sampler=sampler,
            train_step=train_step,
            ckpts=ckpts,
            metrics=metrics,
            save_meta=save_meta,
            restore=restore,
            initial_state=initial_state,
            valid_tokens=valid_tokens,
            log=log,
            workdir=workdir,
            mesh=mesh,
            signals=signals,
            loss_limit=_loss_limit(t.divergence_factor, corpus.vocab.size),
        )
        at_start = loop.stop_reason(state)  # on every process (it may broadcast)
        finished = _finished_results(workdir, cfg, resumed_meta, state)
        if finished is not None and at_start not in (None, "signal"):
            log(
                f"{workdir} already finished at step {state.step}: nothing to do (results in "
                f"{workdir / RESULTS_FILE}); raise train.max_steps / max_epochs / max_minutes "
                f"to train further, or run python -m rhhjax.tools.evaluate for other protocols"
            )
            return finished
        if tensorboard is not None and primary:
            events = loop.events = _EventWriter(tensorboard, workdir, start_step)
        state, stop_reason = loop.run(state)
        summary = {
            "step": state.step,
            "epoch": state.step / bpe,
            "stop_reason": stop_reason,
            "num_params": num_params,
            "best_step": state.best_step,
            "best_valid_bpc": state.best_bpc,
        }
        final = None
        if stop_reason != "signal":
            signals.phase = "evaluation"
            final, used = loop.final_evaluation(state, corpus)
        if final is None:  # SIGTERM / SIGINT during training or the final evaluation
            name = signal.Signals(signals.signum).name
            log(
                f"stopped by {name} at step {state.step}; checkpoint saved; run the same "
                f"command again to resume"
            )
            summary["stop_reason"] = "signal"
            return {"status": "interrupted", "exit_code": 128 + signals.signum, **summary}
        results = {
            "status": "finished",
            "exit_code": 0,
            **summary,
            "evaluated_checkpoint": used,
            "valid_protocol": cfg.eval.valid_protocol,
            "final": final,
        }
        if primary and (final or not (workdir / RESULTS_FILE).exists()):
            _atomic_write(workdir / RESULTS_FILE, json_dumps(results, indent=2) + "\n")
            log(f"results ({used}) written to {workdir / RESULTS_FILE}:")
            log(eval_lib.format_table(final))
        elif primary:
            log(f"eval.final_protocols is empty: {workdir / RESULTS_FILE} is left as it was")
        return results
    finally:
        if events is not None:
            events.close()
        try:
            ckpts.close()
        except Exception:  # noqa: BLE001 -- a failed save already raised the error to report
            pass


def _check_eval_data(cfg, corpus: data_lib.Corpus, valid_tokens: np.ndarray) -> None:
    e = cfg.eval
    checks = [(valid_tokens, e.valid_protocol, "valid")]
    for protocol in eval_lib.parse_protocols(e.final_protocols):
        checks += [(corpus.valid, protocol, "valid"), (corpus.test, protocol, "test")]
    for tokens, protocol, split in checks:
        try:
            data_lib.scored_count(
                len(tokens), protocol, seq_len=e.seq_len, min_context=e.min_context
            )
        except data_lib.DataError as err:
            raise TrainError(f"{split} split, {protocol} protocol: {err}") from None
        need = data_lib.PAPER_SEQ_LEN + 1 if protocol == "paper" else 2
        if len(tokens) < need:
            raise TrainError(
                f"the {split} split ({len(tokens)} symbols) is too short for the {protocol} "
                f"protocol (needs {need})"
            )


@dataclasses.dataclass
class _Loop:
    cfg: Any
    mc: models.ModelConfig
    oc: OptimizerConfig
    bpe: int
    sampler: Any
    train_step: Callable
    ckpts: ckpt_lib.Checkpoints
    metrics: MetricsLog
    save_meta: Callable
    restore: Callable
    initial_state: Callable
    valid_tokens: np.ndarray
    log: Callable
    workdir: Path
    mesh: Any = None  # the data-parallel mesh (rhhjax.parallel)
    signals: Any = None
    events: Any = None  # the TensorBoard writer (_EventWriter) or None
    loss_limit: float = math.inf  # a training loss above it counts as diverged
    _agreed: tuple | None = None  # (step, host stop reason, checkpoint due) agreed by all
    _last_save_time: float = dataclasses.field(default_factory=time.time)

    # -- bounds -----------------------------------------------------------------------------

    _HOST_STOPS = (None, "signal", "max_minutes")

    def _host_state(self, s: _State) -> tuple[str | None, bool]:
        """(stop reason, wall-time checkpoint due) as this process sees them (signals, its
        clock)."""
        t = self.cfg.train
        reason = None
        if self.signals is not None and self.signals.signum is not None:
            reason = "signal"
        elif t.max_minutes and s.train_seconds >= 60.0 * t.max_minutes:
            reason = "max_minutes"
        minutes = t.checkpoint_every_minutes
        due = bool(minutes) and time.time() - self._last_save_time >= 60.0 * minutes
        return reason, due

    def _agreed_host_state(self, s: _State) -> tuple[str | None, bool]:
        """``_host_state``; with several processes process 0's, taken only every
        ``log_every_steps`` steps (a broadcast), so that all stop / save at the same step."""
        if jax.process_count() == 1:
            return self._host_state(s)
        if self._agreed is not None and self._agreed[0] == s.step:
            return self._agreed[1], self._agreed[2]
        reason, due = None, False
        if s.step % self.cfg.train.log_every_steps == 0:
            from jax.experimental import multihost_utils

            mine_reason, mine_due = self._host_state(s)
            mine = np.int32(2 * self._HOST_STOPS.index(mine_reason) + int(mine_due))
            code = int(multihost_utils.broadcast_one_to_all(mine))
            reason, due = self._HOST_STOPS[code // 2], bool(code % 2)
        self._agreed = (s.step, reason, due)
        return reason, due

    def stop_reason(self, s: _State) -> str | None:
        """Why training stops at ``s.step`` (None: it goes on)."""
        t = self.cfg.train
        host, _ = self._agreed_host_state(s)
        if host == "signal":
            return "signal"
        if t.max_steps and s.step >= t.max_steps:
            return "max_steps"
        if t.max_epochs and s.step >= t.max_epochs * self.bpe:
            return "max_epochs"
        if host == "max_minutes":
            return "max_minutes"
        if t.patience and s.evals_since_best >= t.patience:
            return "early_stopping"
        return None

    def _eta(self, s: _State, sec_per_step: float) -> float:
        t = self.cfg.train
        remaining = []
        if t.max_steps:
            remaining.append((t.max_steps - s.step) * sec_per_step)
        if t.max_epochs:
            remaining.append((t.max_epochs * self.bpe - s.step) * sec_per_step)
        if t.max_minutes:
            remaining.append(60.0 * t.max_minutes - s.train_seconds)
        return max(0.0, min(remaining)) if remaining else math.inf

    # -- the loop ---------------------------------------------------------------------------

    def run(self, s: _State) -> tuple[_State, str]:
        """Train from ``s`` until a stop reason; returns (final state, reason).

        The host keeps at most one step queued behind the step in flight: after dispatching
        step k it waits for step k-1 to finish, so a stop (signal, time budget) takes effect
        after the step in flight rather than after every step asynchronous dispatch queued.
        """
        t = self.cfg.train
        eval_every = t.eval_every_steps or self.bpe
        device_pending: list = []  # [(step, loss, grad_norm)] device scalars not yet fetched
        last_saved = s.step if self.ckpts.latest_step() == s.step else None
        self._last_save_time = time.time()
        timer = time.time()
        interval_start, interval_steps = time.time(), 0
        sec_per_step = math.nan
        first = True
        previous_loss = None  # the loss of the step before the one just dispatched

        def fetch() -> _State | None:
            """Move device losses to the host; handle a non-finite or diverged one. Returns a
            replacement state after a rollback, else None."""
            nonlocal device_pending
            if not device_pending:
                return None
            values = jax.device_get([(loss, g) for _, loss, g in device_pending])
            steps = [st for st, _, _ in device_pending]
            device_pending = []
            for st, (loss, g) in zip(steps, values, strict=True):
                loss, g = float(loss), float(g)
                if not (math.isfinite(loss) and math.isfinite(g)) or loss > self.loss_limit:
                    return self._nonfinite(s, st, loss)
                s.pending_loss.append(loss)
                s.pending_gnorm.append(g)
            return None

        while True:
            reason = self.stop_reason(s)
            if reason is not None:
                break
            batch = next(self.sampler)  # the global batch; each process places its rows
            inputs, targets = parallel.shard_batch((batch.inputs, batch.targets), self.mesh)
            out = self.train_step(
                s.params,
                s.opt_state,
                s.carry,
                inputs,
                targets,
                *parallel.put_scalars(
                    (np.bool_(batch.reset), np.int32(s.step), np.int32(s.retry)), self.mesh
                ),
            )
            s.params, s.opt_state, s.carry, loss, gnorm = out
            device_pending.append((s.step + 1, loss, gnorm))
            s.step += 1
            interval_steps += 1
            if previous_loss is not None:
                jax.block_until_ready(previous_loss)  # do not run ahead of the device
            previous_loss = loss
            if first:  # exclude compilation from the throughput
                jax.block_until_ready(loss)
                now = time.time()
                self.log(
                    f"first step done in {now - timer:.1f}s (compilation included); a progress "
                    f"line every {t.log_every_steps} steps"
                )
                s.train_seconds += now - timer
                timer = interval_start = now
                interval_steps = 0
                first = False
            else:  # training time on every step, so max_minutes is checked on every step
                now = time.time()
                s.train_seconds += now - timer
                timer = now
            log_due = s.step % t.log_every_steps == 0
            eval_due = s.step % eval_every == 0
            host_reason, time_due = self._agreed_host_state(s)
            ckpt_due = (
                eval_due
                or time_due
                or bool(t.checkpoint_every_steps and s.step % t.checkpoint_every_steps == 0)
            )
            stopping = host_reason == "signal"
            if not (log_due or eval_due or ckpt_due or stopping):
                continue
            replacement = fetch()
            now = time.time()
            s.train_seconds += now - timer
            timer = now
            if replacement is not None:
                s = replacement
                last_saved = s.step if self.ckpts.latest_step() == s.step else None
                interval_start, interval_steps = time.time(), 0
                previous_loss = None
                continue
            if log_due and s.pending_loss:
                elapsed = now - interval_start
                if interval_steps:
                    sec_per_step = elapsed / interval_steps
                self._log_train(s, sec_per_step)
                interval_start, interval_steps = now, 0
            if eval_due:
                self._validate(s)
            if ckpt_due or stopping:
                self._save(s)
                last_saved = s.step
            timer = time.time()
            interval_start += timer - now  # evaluation and saving are not training time
        # the end: make sure the final state is saved (pending losses stay pending)
        replacement = fetch()
        if replacement is not None:  # a non-finite loss in the last steps: rolled back
            return self.run(replacement)
        s.train_seconds += time.time() - timer
        if reason == "max_minutes" and s.valid_step != s.step:
            # the time budget stops at any step: validate it so the best can be this one
            self.log(f"time budget reached at step {s.step}: validating it before stopping")
            self._validate(s)
            last_saved = None  # the checkpoint must record this validation
        if last_saved != s.step:
            self._save(s)
        if reason != "signal":
            self.log(f"training stopped at step {s.step} (epoch {s.step / self.bpe:.2f}): {reason}")
        self.metrics.append(
            {
                "kind": "event",
                "event": "stop",
                "reason": reason,
                "step": s.step,
                "time": time.time(),
            }
        )
        return s, reason

    # -- pieces -----------------------------------------------------------------------------

    def _log_train(self, s: _State, sec_per_step: float) -> None:
        t = self.cfg.train
        loss = float(np.mean(np.asarray(s.pending_loss, dtype=np.float64)))
        gnorm = float(np.mean(np.asarray(s.pending_gnorm, dtype=np.float64)))
        n = len(s.pending_loss)
        s.pending_loss.clear()
        s.pending_gnorm.clear()
        chars_per_sec = t.batch_size * t.seq_len / sec_per_step if sec_per_step > 0 else math.nan
        lr = float(self.oc.learning_rate_at(s.step - 1))
        record = {
            "kind": "train",
            "step": s.step,
            "epoch": s.step / self.bpe,
            "loss": loss,
            "bpc": loss / LN2,
            "grad_norm": gnorm,
            "lr": lr,
            "steps": n,
            "chars_per_sec": chars_per_sec if math.isfinite(chars_per_sec) else None,
            "time": time.time(),
        }
        self.metrics.append(record)
        if self.events is not None:
            self.events.train(record)
        eta = _format_duration(self._eta(s, sec_per_step))
        speed = f"{chars_per_sec:,.0f} char/s" if math.isfinite(chars_per_sec) else "- char/s"
        total = self._total_steps()
        self.log(
            f"step {s.step}{'/' + format(total, ',') if total else ''} "
            f"epoch {s.step / self.bpe:.2f}  loss {loss:.4f}  bpc {loss / LN2:.4f}  "
            f"|g| {gnorm:.3g}  {speed}  ETA {eta} + final evaluation"
        )

    def _total_steps(self) -> int:
        """The step training ends at, when a step bound decides it (0: unknown, e.g. when
        ``max_minutes`` may stop it first)."""
        t = self.cfg.train
        if t.max_minutes:
            return 0
        bounds = [b for b in (t.max_steps, t.max_epochs * self.bpe) if b]
        return min(bounds) if bounds else 0

    def _validate(self, s: _State) -> None:
        e = self.cfg.eval
        start = time.time()
        m = eval_lib.evaluate_tokens(
            self.mc,
            s.params,
            self.valid_tokens,
            e.valid_protocol,
            batch_size=e.batch_size,
            seq_len=e.seq_len,
            min_context=e.min_context,
            mesh=self.mesh,
        )
        s.valid_step = s.step
        sane = math.isfinite(m["bpc"]) and m["nats"] <= self.loss_limit
        improved = sane and (s.best_bpc is None or m["bpc"] < s.best_bpc)
        if improved:
            s.best_bpc, s.best_step, s.evals_since_best = m["bpc"], s.step, 0
        else:
            s.evals_since_best += 1
        record = {
            "kind": "valid",
            "step": s.step,
            "epoch": s.step / self.bpe,
            "protocol": e.valid_protocol,
            "loss": m["nats"],
            "bpc": m["bpc"],
            "ppl": m["ppl"],
            "acc": m["acc"],
            "chars": m["chars"],
            "best": improved,
            "seconds": time.time() - start,
        }
        self.metrics.append(record)
        if self.events is not None:
            self.events.valid(record)
        if improved:
            self.ckpts.save_best(s.step, s.params, self.save_meta(s))
        best = f"{s.best_bpc:.4f} @ {s.best_step}" if s.best_bpc is not None else "-"
        new_best = "  *new best*" if improved else ""
        self.log(
            f"validation step {s.step}: bpc {m['bpc']:.4f}  acc {100 * m['acc']:.2f}%  "
            f"({m['chars']:,} chars, {time.time() - start:.1f}s){new_best}  best {best}"
        )

    def _save(self, s: _State) -> None:
        """Save the latest checkpoint, then drop any best checkpoint it does not point to
        (the best is written first, so a kill between the two leaves the old pair)."""
        self.ckpts.save_latest(s.step, s.params, s.opt_state, s.carry, self.save_meta(s))
        self.ckpts.keep_only_best(s.best_step)
        self._last_save_time = time.time()

    def _nonfinite(self, s: _State, step: int, loss: float) -> _State:
        t = self.cfg.train
        last = self.ckpts.latest_step()
        self.metrics.append({"kind": "event", "event": "nonfinite", "step": step, "loss": loss})
        if math.isfinite(loss) and loss > self.loss_limit:
            what = (
                f"diverged training loss ({loss:.4g} nats, above {t.divergence_factor:g} x "
                f"ln(vocab) = {self.loss_limit:.4g})"
            )
        else:
            what = f"non-finite training loss ({loss})"
        kept = (
            f"the last good checkpoint (step {last}) is left intact in {self.workdir}"
            if last is not None
            else "no checkpoint was written yet"
        )
        if t.on_nonfinite == "stop":
            raise NonFiniteLossError(
                f"{what} at step {step}; {kept}; lower train.learning_rate or clip_norm, or set "
                f"train.on_nonfinite=rollback"
            )
        if last is None:
            raise NonFiniteLossError(
                f"{what} at step {step} and no checkpoint to roll back to (none is written "
                f"before the first validation or checkpoint); lower train.learning_rate or "
                f"clip_norm"
            )
        retry = s.retry + 1
        if retry > MAX_ROLLBACKS:
            raise NonFiniteLossError(
                f"{what} at step {step} after {MAX_ROLLBACKS} rollbacks; giving up ({kept})"
            )
        new = self.restore(last)
        new.retry = retry
        self.metrics.truncate_after(new.step)
        self.ckpts.prune_after(new.step)
        _reconcile_best(self.ckpts, new, self.log)
        self.metrics.append(
            {
                "kind": "event",
                "event": "rollback",
                "step": new.step,
                "from_step": step,
                "retry": retry,
            }
        )
        self.log(
            f"{what} at step {step}: rolled back to step {new.step}, "
            f"retry {retry} with other dropout keys"
        )
        return new

    # -- the end ----------------------------------------------------------------------------

    def final_evaluation(self, s: _State, corpus: data_lib.Corpus):
        """({split: {protocol: metrics}}, "best step N" | "final step N") or (None, ...)
        when interrupted by a signal."""
        protocols = eval_lib.parse_protocols(self.cfg.eval.final_protocols)
        params, used = s.params, f"final step {s.step}"
        if s.best_step is not None and s.best_step in self.ckpts.steps("best"):
            params, _ = self.ckpts.restore_params("best", s.best_step, template=s.params)
            used = f"best step {s.best_step}"
        if not protocols:
            return {}, used
        self.log(f"final evaluation of the {used} checkpoint:")
        try:
            final = eval_lib.evaluate_splits(
                self.mc,
                params,
                corpus,
                self.cfg.eval,
                ("valid", "test"),
                protocols,
                log=self.log,
                should_stop=lambda: self.signals is not None and self.signals.signum is not None,
                mesh=self.mesh,
            )
        except KeyboardInterrupt:
            if self.signals is not None and self.signals.signum is not None:
                return None, used
            raise
        return final, used
