"""The training loop: ``train_and_evaluate(config, workdir) -> results``.

Validates the config, data and workdir before writing anything (``rhhjax.train.setup``),
initialises or resumes from the newest undamaged checkpoint, trains until a bound, early
stopping or a signal (checkpointing on the way), then evaluates the best checkpoint on valid
and test and writes ``results.json``. What a run prints, writes and does on a signal, a
non-finite loss or an out-of-memory: docs/operations.md ("What a run does").
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

    Returns ``status``, ``exit_code`` (0 or 128 + signum), ``step``, ``epoch``,
    ``stop_reason``, ``best_step``, ``best_valid_bpc``, ``num_params`` and ``final``
    ({split: {protocol: metrics}}, absent when interrupted). ``signals``: an entered
    ``SignalCatcher``; None catches SIGTERM / SIGINT here.
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
        # one device: no layout (the plain 3-argument call that tests patch)
        layout = (run.mesh, bool(run.cfg.train.fsdp)) if run.mesh.size > 1 else ()
        train_step = make_train_step(run.model, oc, int(run.cfg.seed), *layout)
        limit = loss_limit(run.cfg.train.divergence_factor, run.corpus.vocab.size)
        loop = Loop(run, store, oc, train_step, metrics, loss_limit=limit)
        with _out_of_memory_in_one_line(loop):
            state, reason = loop.train(state)
            return loop.finish(state, reason)


@contextlib.contextmanager
def _out_of_memory_in_one_line(loop: Loop):
    """Turn an out-of-memory into a one-line ``OutOfMemoryError``."""
    try:
        yield
    except Exception as e:
        if not memory.is_out_of_memory(e):
            raise
        raise memory.OutOfMemoryError(loop.out_of_memory(e)) from None


def _start_or_resume(run: Run, store: StateStore, metrics: workdir_lib.MetricsLog) -> LoopState:
    """The newest good checkpoint's state, else the fresh one; writes ``config.json`` and
    cuts back what a resumed run left after its checkpoint."""
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
