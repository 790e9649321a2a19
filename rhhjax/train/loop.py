"""The loop of a run: ``Loop.run`` steps, logs, validates, checkpoints and stops; its
``final_evaluation`` scores the best checkpoint. ``rhhjax.train.trainer`` sets it up (config,
data, workdir, resume) and calls it; the stop rules and files are described there."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from rhhjax import data as data_lib
from rhhjax import evaluation as eval_lib
from rhhjax import models, parallel
from rhhjax.train import checkpoint as ckpt_lib
from rhhjax.train import workdir as workdir_lib
from rhhjax.train.config import TrainError
from rhhjax.train.optim import OptimizerConfig

LN2 = math.log(2.0)
MAX_ROLLBACKS = 10


class NonFiniteLossError(TrainError):
    """The training loss became NaN or inf (``train.on_nonfinite="stop"``)."""


def loss_limit(factor: float, vocab_size: int) -> float:
    """The training loss (nats) above which a run counts as diverged: ``factor`` x ln(V), the
    loss of a uniform guess; inf when ``factor`` is 0 (the guard is off)."""
    return factor * math.log(max(vocab_size, 2)) if factor else math.inf


def reconcile_best(ckpts: ckpt_lib.Checkpoints, s: LoopState, log: Callable[[str], None]) -> None:
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


def _format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


@dataclasses.dataclass
class LoopState:
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


@dataclasses.dataclass
class Loop:
    cfg: Any
    mc: models.ModelConfig
    oc: OptimizerConfig
    bpe: int
    sampler: Any
    train_step: Callable
    ckpts: ckpt_lib.Checkpoints
    metrics: workdir_lib.MetricsLog
    save_meta: Callable
    restore: Callable
    initial_state: Callable
    valid_tokens: np.ndarray
    log: Callable
    workdir: Path
    mesh: Any = None  # the data-parallel mesh (rhhjax.parallel)
    signals: Any = None
    events: Any = None  # the TensorBoard writer (workdir_lib.EventWriter) or None
    loss_limit: float = math.inf  # a training loss above it counts as diverged
    _agreed: tuple | None = None  # (step, host stop reason, checkpoint due) agreed by all
    _last_save_time: float = dataclasses.field(default_factory=time.time)

    # -- bounds -----------------------------------------------------------------------------

    _HOST_STOPS = (None, "signal", "max_minutes")

    def _host_state(self, s: LoopState) -> tuple[str | None, bool]:
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

    def _agreed_host_state(self, s: LoopState) -> tuple[str | None, bool]:
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

    def stop_reason(self, s: LoopState) -> str | None:
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

    def _eta(self, s: LoopState, sec_per_step: float) -> float:
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

    def run(self, s: LoopState) -> tuple[LoopState, str]:
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

        def fetch() -> LoopState | None:
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

    def _log_train(self, s: LoopState, sec_per_step: float) -> None:
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
            "train_seconds": s.train_seconds,  # the max_minutes clock (compilation included)
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

    def _validate(self, s: LoopState) -> None:
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
            "train_seconds": s.train_seconds,  # the max_minutes clock (compilation included)
            "time": time.time(),
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

    def _save(self, s: LoopState) -> None:
        """Save the latest checkpoint, then drop any best checkpoint it does not point to
        (the best is written first, so a kill between the two leaves the old pair)."""
        self.ckpts.save_latest(s.step, s.params, s.opt_state, s.carry, self.save_meta(s))
        self.ckpts.keep_only_best(s.best_step)
        self._last_save_time = time.time()

    def _nonfinite(self, s: LoopState, step: int, loss: float) -> LoopState:
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
        reconcile_best(self.ckpts, new, self.log)
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

    def final_evaluation(self, s: LoopState, corpus: data_lib.Corpus):
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
