"""The training loop: ``train_and_evaluate(config, workdir) -> results``.

What a run does, in order:

1. Validates the whole config, loads the data (downloading it if configured), checks the
   workdir (writable; if it holds a run, that run's model config, vocabulary and sampler shape
   match) -- all before anything is written or compiled (``rhhjax.train.config``,
   ``rhhjax.train.workdir``). Problems raise a ``rhhjax.errors.UserError`` (``TrainError``,
   ``ConfigError``, ``DataError``, ...) with a one-line message.
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

Interruptions: SIGTERM / SIGINT (``rhhjax.train.signals.SignalCatcher``) stop after the step in
flight, save a checkpoint and return with ``results["exit_code"] = 128 + signum`` (``train.py``
exits with it); before training starts, nothing is written; a second signal aborts at once.
Rerunning the same command resumes; the continued run's records in ``metrics.jsonl`` (``train``
and ``valid``; timing fields aside) and parameters are bitwise identical to an uninterrupted
run's, also after ``kill -9`` (the restart goes back to the last checkpoint, and ``best/`` to
the best checkpoint that one records).

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
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rhhjax import data as data_lib
from rhhjax import evaluation as eval_lib
from rhhjax import models, parallel
from rhhjax.train import checkpoint as ckpt_lib
from rhhjax.train import config as train_config
from rhhjax.train import workdir as workdir_lib
from rhhjax.train.config import TrainError
from rhhjax.train.loop import (
    Loop,
    LoopState,
    NonFiniteLossError,  # noqa: F401 (raised by the loop; part of this module's API)
    loss_limit,
    reconcile_best,
)
from rhhjax.train.optim import OptimizerConfig, make_optimizer
from rhhjax.train.signals import SignalCatcher
from rhhjax.train.step import init_key, make_init, make_train_step


def _make_sampler(cfg, tokens: np.ndarray):
    t = cfg.train
    if cfg.data.get("sampler", "windows") == "stream":
        return data_lib.StreamSampler(tokens, t.batch_size, t.seq_len, seed=cfg.seed)
    return data_lib.WindowSampler(tokens, t.batch_size, t.seq_len, seed=cfg.seed)


def _log(message: str) -> None:
    print(message, flush=True)


def _silent(message: str) -> None:
    del message


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


def _agreed_flag(value: bool) -> bool:
    """Process 0's ``value`` on every process (a broadcast; the value itself with one)."""
    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils

    return bool(multihost_utils.broadcast_one_to_all(np.int32(value)))


def _train_and_evaluate(
    config: Any, workdir: Path, log: Callable[[str], None], signals: SignalCatcher
) -> dict:
    signals.phase = "startup"
    cfg = train_config.prepare_config(config)
    # data parallelism (rhhjax.parallel): every device of every process, batch split over them
    parallel.maybe_initialize_distributed(bool(cfg.train.distributed))
    primary = parallel.is_primary()
    if not primary:  # only process 0 logs and writes metrics / results / config.json
        log = _silent
        signals.log = _silent
    parallel.assert_same_across_processes(train_config.config_to_json(cfg), "config")
    mesh = parallel.make_mesh()
    parallel.check_batch_divisible("train.batch_size", cfg.train.batch_size, mesh)
    parallel.check_batch_divisible("eval.batch_size", cfg.eval.batch_size, mesh)
    fsdp = bool(cfg.train.fsdp)
    tensorboard = workdir_lib.tensorboard_writer_class() if cfg.train.tensorboard else None
    corpus = data_lib.load_corpus(cfg.data)
    parallel.assert_same_across_processes(
        json.dumps([corpus.vocab.to_dict(), len(corpus.train), len(corpus.valid)]), "data"
    )
    mc = models.ModelConfig.from_config(cfg.model, vocab_size=corpus.vocab.size)
    models.sequence_spec(mc)  # Refuses an impl that cannot run here (mosaic off a GPU).
    cfg.model.vocab_size = corpus.vocab.size
    sampler = _make_sampler(cfg, corpus.train)
    valid_tokens = corpus.valid
    if cfg.eval.max_valid_chars:
        valid_tokens = valid_tokens[: cfg.eval.max_valid_chars]
    _check_eval_data(cfg, corpus, valid_tokens)
    workdir_lib.check_workdir_writable(workdir)
    workdir_lib.check_compatible(workdir, cfg, mc, corpus.vocab, sampler.state())
    parallel.sync("rhhjax-validated")  # every process has read the workdir before it changes
    if _agreed_flag(signals.signum is not None):
        name = signal.Signals(signals.signum or signal.SIGTERM).name
        log(f"stopped by {name} before training started; nothing was written")
        return {"status": "interrupted", "exit_code": 128 + (signals.signum or 15), "step": None}
    signals.phase = "training"  # from here on the loop acts on a signal (saving a checkpoint)

    # ---- validation passed: from here on the workdir is written.
    workdir.mkdir(parents=True, exist_ok=True)
    lock = workdir_lib.WorkdirLock(workdir) if primary else None
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
        workdir_lib.atomic_write(
            workdir / workdir_lib.CONFIG_FILE, train_config.config_to_json(cfg)
        )
    metrics = workdir_lib.MetricsLog(workdir / workdir_lib.METRICS_FILE, enabled=primary)
    t = cfg.train
    bpe = sampler.batches_per_epoch
    oc = OptimizerConfig.from_config(t, bpe)
    # one device: no layout to constrain (and the plain 3-argument call, as tests patch it)
    layout = (mesh, fsdp) if mesh.size > 1 else ()
    train_step = make_train_step(mc, oc, int(cfg.seed), *layout)
    tx = make_optimizer(oc)

    def initial_state(retry: int = 0) -> LoopState:
        params = make_init(mc)(init_key(int(cfg.seed)))  # eagerly, on every process
        opt_state = tx.init(params)
        carry = parallel.shard_batch(eval_lib.zero_carry(mc, params, t.batch_size), mesh)
        carry = jax.tree.map(jnp.copy, carry)  # distinct buffers (the LSTM's alias): donated
        params = parallel.put_state(params, mesh, fsdp)
        opt_state = parallel.put_state(opt_state, mesh, fsdp)
        return LoopState(params=params, opt_state=opt_state, carry=carry, retry=retry)

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

        def restore(step: int) -> LoopState:
            params, opt_state, carry, m = ckpts.restore_latest(step, *templates)
            sampler.restore(m["sampler"])
            return LoopState(
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
        reconcile_best(ckpts, state, log)
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

        def save_meta(s: LoopState) -> dict:
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

        loop = Loop(
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
            loss_limit=loss_limit(t.divergence_factor, corpus.vocab.size),
        )
        at_start = loop.stop_reason(state)  # on every process (it may broadcast)
        finished = workdir_lib.finished_results(workdir, cfg, resumed_meta, state.step)
        if finished is not None and at_start not in (None, "signal"):
            log(
                f"{workdir} already finished at step {state.step}: nothing to do (results in "
                f"{workdir / workdir_lib.RESULTS_FILE}); raise train.max_steps / max_epochs / "
                f"max_minutes to train further, or run python -m rhhjax.tools.evaluate for other "
                "protocols"
            )
            return finished
        if tensorboard is not None and primary:
            events = loop.events = workdir_lib.EventWriter(tensorboard, workdir, start_step)
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
        if primary and (final or not (workdir / workdir_lib.RESULTS_FILE).exists()):
            workdir_lib.atomic_write(
                workdir / workdir_lib.RESULTS_FILE, workdir_lib.json_dumps(results, indent=2) + "\n"
            )
            log(f"results ({used}) written to {workdir / workdir_lib.RESULTS_FILE}:")
            log(eval_lib.format_table(final))
        elif primary:
            log(
                f"eval.final_protocols is empty: {workdir / workdir_lib.RESULTS_FILE} is left "
                "as it was"
            )
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
