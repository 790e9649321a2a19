"""The training loop: ``train_and_evaluate(config, workdir) -> results``.

What a run does, in order:

1. Validates the whole config, loads the data (downloading it if configured), checks the
   workdir (writable; if it holds a run, that run's model config, vocabulary and sampler shape
   match) -- all before anything is written or compiled (``rhhjax.train.setup``). Problems
   raise a ``rhhjax.errors.UserError`` (``TrainError``, ``ConfigError``, ``DataError``, ...)
   with a one-line message. A workdir whose run already finished under this config's bounds
   and ``eval`` settings is left untouched (its results are returned).
2. Initialises the model from ``config.seed``, then resumes from the newest checkpoint of the
   workdir that is not damaged if there is one (one line for each damaged one passed over;
   ``metrics.jsonl`` is cut back to that step, later checkpoints are deleted).
3. Trains with a jitted step: Adam (AdamW when ``train.weight_decay > 0``) or SGD with the RHN
   paper's per-epoch decay (``train.optimizer="sgd"``), gradient clipping by the total L1 norm
   (the paper code's) or the global L2 norm. Dropout keys are ``fold_in(key(seed), step)``.
   A progress line every ``train.log_every_steps`` (also a ``train`` record in
   ``metrics.jsonl``); validation BPC every ``train.eval_every_steps`` (0 = once per epoch) on
   ``eval.valid_protocol`` (a ``valid`` record); checkpoints (``rhhjax.train.checkpoint``).
4. Stops at ``max_steps`` / ``max_epochs`` / ``max_minutes``, or when ``patience`` validations
   in a row brought no new best (``patience=0`` disables early stopping). ``max_minutes``
   counts training time across restarts (first-step compilation included, validation and
   saving not). A stop by a bound validates and checkpoints the stop step first when it is
   not a validation step. After the second step a line estimates what an epoch takes here
   (``rhhjax.train.loop.epoch_estimate``).
5. Evaluates the best checkpoint (the best validation; the final parameters if no
   validation ran) on valid and test under every protocol in ``eval.final_protocols``, prints
   a table and writes ``results.json``. A rerun of a finished run with the same ``eval``
   settings does nothing (the stored results are returned).

The host keeps at most one step queued behind the one the device runs, so a stop takes effect
after the step in flight. Checkpoints: at every validation, every ``checkpoint_every_steps``,
every ``checkpoint_every_minutes`` of wall time, and at the stop.

Interruptions: SIGTERM / SIGINT (``rhhjax.train.signals.SignalCatcher``) stop after the step in
flight, save a checkpoint and return with ``results["exit_code"] = 128 + signum`` (``train.py``
exits with it); before training starts, nothing is written; a second signal aborts at once.
Rerunning the same command resumes; the continued run's records in ``metrics.jsonl`` (``train``
and ``valid``; timing fields aside) and parameters are bitwise identical to an uninterrupted
run's, also after ``kill -9`` (the restart goes back to the last checkpoint, and ``best/`` to
the best checkpoint that one records).

Memory: the training step and every evaluation protocol are estimated from the config's shapes
before anything is compiled (``rhhjax.memory``; ``train.check_memory``): a config that cannot
fit is a ``MemoryCheckError``. An out-of-memory that still happens (host or device) is an
``OutOfMemoryError``: one line naming the phase, what is kept and the field to lower.

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

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rhhjax import memory, models
from rhhjax.train import checkpoint as ckpt_lib
from rhhjax.train import config as train_config
from rhhjax.train import workdir as workdir_lib
from rhhjax.train.config import TrainError  # noqa: F401 (part of this module's API)
from rhhjax.train.loop import (
    Loop,
    NonFiniteLossError,  # noqa: F401 (raised by the loop; part of this module's API)
    epoch_estimate,  # noqa: F401 (the start-up estimate line; part of this module's API)
    loss_limit,
)
from rhhjax.train.optim import OptimizerConfig, make_optimizer
from rhhjax.train.setup import Run, prepare_run
from rhhjax.train.signals import SignalCatcher
from rhhjax.train.state import LoopState, StateStore
from rhhjax.train.step import make_train_step


def _log(message: str) -> None:
    print(message, flush=True)


def train_and_evaluate(
    config: Any,
    workdir: str | os.PathLike,
    *,
    log: Callable[[str], None] = _log,
    signals: SignalCatcher | None = None,
) -> dict:
    """Train (or resume) a model in ``workdir`` and evaluate its best checkpoint.

    Returns a dict with ``status`` ("finished" | "interrupted"), ``exit_code`` (0, or
    128 + signum after SIGTERM/SIGINT), ``step``, ``epoch``, ``stop_reason``, ``best_step``,
    ``best_valid_bpc``, ``num_params`` and ``final`` ({split: {protocol: metrics}}, absent
    when interrupted). Raises a ``UserError`` for bad input, before writing anything.

    ``signals``: an entered ``SignalCatcher`` (``train.py`` starts one before importing
    jax); None = catch SIGTERM / SIGINT here for the duration of the call.
    """
    if signals is not None:
        return _train_and_evaluate(config, Path(workdir), log, signals)
    with SignalCatcher(log) as own:
        return _train_and_evaluate(config, Path(workdir), log, own)


def _train_and_evaluate(
    config: Any, workdir: Path, log: Callable[[str], None], signals: SignalCatcher
) -> dict:
    """Set up and initialise (nothing written), then train in the locked workdir."""
    signals.phase = "startup"
    run = prepare_run(config, workdir, log, signals)
    if run.finished is not None:
        run.log(
            f"{workdir} already finished at step {run.finished['step']}: nothing to do "
            f"(results in {workdir / workdir_lib.RESULTS_FILE}); raise train.max_steps / "
            "max_epochs / max_minutes to train further, or run python -m rhhjax.tools.evaluate "
            "for other protocols"
        )
        return run.finished
    nothing = "stopped by {name} before training started; nothing was written"
    if signals.stop_agreed():
        return signals.interrupted(None, nothing)
    oc = OptimizerConfig.from_config(run.cfg.train, run.steps_per_epoch)
    tx = make_optimizer(oc)
    fresh = StateStore.initialise(run, tx)  # a minute for the paper model on a CPU
    if signals.stop_agreed():
        return signals.interrupted(None, nothing)
    signals.phase = "training"  # from here on the loop acts on a signal (saving a checkpoint)
    workdir.mkdir(parents=True, exist_ok=True)
    lock = workdir_lib.WorkdirLock(workdir) if run.primary else contextlib.nullcontext()
    with lock, ckpt_lib.Checkpoints(workdir, keep=run.cfg.train.keep_checkpoints) as ckpts:
        store = StateStore(run, tx, ckpts, fresh)
        metrics = workdir_lib.MetricsLog(workdir / workdir_lib.METRICS_FILE, enabled=run.primary)
        state = _start_or_resume(run, store, metrics)
        # one device: no layout to constrain (and the plain 3-argument call, as tests patch it)
        layout = (run.mesh, bool(run.cfg.train.fsdp)) if run.mesh.size > 1 else ()
        train_step = make_train_step(run.model, oc, int(run.cfg.seed), *layout)
        limit = loss_limit(run.cfg.train.divergence_factor, run.corpus.vocab.size)
        loop = Loop(run, store, oc, train_step, metrics, loss_limit=limit)
        with _out_of_memory_in_one_line(loop):
            state, reason = loop.train(state)
            return loop.finish(state, reason)


@contextlib.contextmanager
def _out_of_memory_in_one_line(loop: Loop):
    """An out-of-memory (host or device) while training or evaluating becomes an
    ``OutOfMemoryError``: one line saying what is kept and which field to lower."""
    try:
        yield
    except Exception as e:
        if not memory.is_out_of_memory(e):
            raise
        raise memory.OutOfMemoryError(loop.out_of_memory(e)) from None


def _start_or_resume(run: Run, store: StateStore, metrics: workdir_lib.MetricsLog) -> LoopState:
    """The state training starts from: the newest good checkpoint's, else the fresh one.
    Writes ``config.json`` and the start record; cuts back what a resumed run left after its
    checkpoint (``metrics.jsonl`` records, later checkpoints)."""
    state = store.resume()
    if state is None:
        state = store.fresh
        run.log(f"training {run.model.type} ({store.num_params:,} parameters) in {run.workdir}")
    else:
        epoch = state.step / run.steps_per_epoch
        run.log(f"resuming {run.workdir} from step {state.step} (epoch {epoch:.2f})")
    spec = models.sequence_spec(run.model)
    run.log(models.implementation_line(run.model.impl, spec.impl, spec.reason))
    if run.primary:
        config_json = train_config.config_to_json(run.cfg)
        workdir_lib.atomic_write(run.workdir / workdir_lib.CONFIG_FILE, config_json)
    metrics.truncate_after(state.step)
    store.ckpts.prune_after(state.step)
    store.check_best(state)
    event = "resume" if state is not store.fresh else "start"
    metrics.append({"kind": "event", "event": event, "step": state.step, "time": time.time()})
    c, t = run.corpus, run.cfg.train
    run.log(
        f"data {c.name} from {c.source or '?'}: vocab {c.vocab.size}, "
        f"train {len(c.train):,} / valid {len(c.valid):,} / test {len(c.test):,} symbols; "
        f"{run.steps_per_epoch:,} steps per epoch of {t.batch_size} x {t.seq_len}"
    )
    return state
