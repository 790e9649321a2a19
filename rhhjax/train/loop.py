"""The loop of a run: ``Loop.train`` steps, logs, validates, checkpoints and stops; its
``final_evaluation`` scores the best checkpoint and ``finish`` writes ``results.json``.
``rhhjax.train.trainer`` sets it up (config, data, workdir, resume) and calls it; the stop
rules and files are described there, the time budget in ``rhhjax.train.budget``.
``epoch_estimate`` is the start-up line on what an epoch takes on this machine."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from rhhjax import authors as authors_lib
from rhhjax import evaluation as eval_lib
from rhhjax import memory, parallel
from rhhjax.train import budget, optim
from rhhjax.train import config as train_config
from rhhjax.train import workdir as workdir_lib
from rhhjax.train.config import TrainError
from rhhjax.train.optim import OptimizerConfig
from rhhjax.train.setup import Run
from rhhjax.train.state import LoopState, StateStore

LN2 = math.log(2.0)
MAX_ROLLBACKS = 10


class NonFiniteLossError(TrainError):
    """The training loss became NaN or inf (``train.on_nonfinite="stop"``)."""


def loss_limit(factor: float, vocab_size: int) -> float:
    """The training loss above which a run counts as diverged: ``factor`` x ln(V) (inf: off)."""
    return factor * math.log(max(vocab_size, 2)) if factor else math.inf


# on a CPU, slower steps and longer epochs get the hint to use the CPU recipe
CPU_HINT_STEP_SECONDS = 1.0
CPU_HINT_EPOCH_MINUTES = 10.0


def epoch_estimate(sec_per_step: float, steps_per_epoch: int, step: int, platform: str) -> str:
    """The start-up line on what one epoch takes here, from the time of ``step``; on a CPU, for
    a model too large for it, it names the CPU recipe."""
    minutes = sec_per_step * steps_per_epoch / 60.0
    line = (
        f"estimate: an epoch ({steps_per_epoch:,} steps) takes about "
        f"{_format_duration(60.0 * minutes)} on this {platform.upper()} ({sec_per_step:.3g} s "
        f"for step {step})"
    )
    if (
        platform == "cpu"
        and sec_per_step > CPU_HINT_STEP_SECONDS
        and minutes > CPU_HINT_EPOCH_MINUTES
    ):
        line += (
            "; a model sized for a CPU: --config=configs/ptb.py:cpu (12 minutes of "
            "training), or train this one on a GPU"
        )
    return line


def _format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


@dataclasses.dataclass
class Loop:
    """Steps, progress lines, validations, checkpoints and stops of one run."""

    run: Run
    store: StateStore  # fresh / saved / restored states; store.ckpts: the checkpoints
    oc: OptimizerConfig
    train_step: Callable  # rhhjax.train.step.make_train_step's jitted step
    metrics: workdir_lib.MetricsLog
    events: Any = None  # the TensorBoard writer (workdir_lib.EventWriter) or None
    loss_limit: float = math.inf  # a training loss above it counts as diverged
    nonfinite_hint: str = ""  # what a non-finite loss may also mean (trainer.nonfinite_hint)
    phase: str = "training"  # training | validation | the final evaluation (for errors)
    _agreed: tuple | None = None  # (step, host stop reason, checkpoint due) agreed by all
    _last_save_time: float = dataclasses.field(default_factory=time.time)
    _pending: list = dataclasses.field(default_factory=list)  # [(step, loss, |g|)] on device

    @property
    def bpe(self) -> int:
        return self.run.steps_per_epoch

    # -- bounds -----------------------------------------------------------------------------

    _HOST_STOPS = (None, "signal", "max_minutes")

    def _host_state(self, s: LoopState) -> tuple[str | None, bool]:
        """(stop reason, wall-time checkpoint due) as this process sees them."""
        t = self.run.cfg.train
        reason = None
        if self.run.signals.signum is not None:
            reason = "signal"
        elif t.max_minutes and s.train_seconds >= 60.0 * t.max_minutes:
            reason = "max_minutes"
        minutes = t.checkpoint_every_minutes
        due = bool(minutes) and time.time() - self._last_save_time >= 60.0 * minutes
        return reason, due

    def _agreed_host_state(self, s: LoopState) -> tuple[str | None, bool]:
        """``_host_state``; with several processes process 0's, broadcast every
        ``log_every_steps`` steps so that all stop and save at the same step."""
        if jax.process_count() == 1:
            return self._host_state(s)
        if self._agreed is not None and self._agreed[0] == s.step:
            return self._agreed[1], self._agreed[2]
        reason, due = None, False
        if s.step % self.run.cfg.train.log_every_steps == 0:
            from jax.experimental import multihost_utils

            mine_reason, mine_due = self._host_state(s)
            mine = np.int32(2 * self._HOST_STOPS.index(mine_reason) + int(mine_due))
            code = int(multihost_utils.broadcast_one_to_all(mine))
            reason, due = self._HOST_STOPS[code // 2], bool(code % 2)
        self._agreed = (s.step, reason, due)
        return reason, due

    def stop_reason(self, s: LoopState) -> str | None:
        """Why training stops at ``s.step`` (None: it goes on)."""
        host, _ = self._agreed_host_state(s)
        if host == "signal":
            return "signal"
        # max_minutes as this process's clock says, agreed with the others
        seconds = s.train_seconds if host == "max_minutes" else 0.0
        return train_config.bound_reached(
            self.run.cfg.train, self.bpe, s.step, s.evals_since_best, seconds, s.budget_steps
        )

    def _eta(self, s: LoopState, sec_per_step: float) -> float:
        """Seconds of training left (inf: unknown), by the nearest bound."""
        t = self.run.cfg.train
        remaining = []
        bound = budget.step_bound(t, s, self.bpe)
        if math.isfinite(sec_per_step) and bound:
            remaining.append((bound - s.step) * sec_per_step)
        if t.max_minutes:
            remaining.append(60.0 * t.max_minutes - s.train_seconds)
        if budget.unfixed(t, s):  # the probe: the budget's own clock
            remaining.append(60.0 * t.budget_minutes - s.train_seconds)
        return max(0.0, min(remaining)) if remaining else math.inf

    # -- the loop ---------------------------------------------------------------------------

    def train(self, s: LoopState) -> tuple[LoopState, str]:
        """Train from ``s`` until a stop reason; returns (final state, reason). After
        dispatching step k the host waits for step k-1, so a stop takes effect after the step
        in flight; the final state is saved unless a signal came before any step ran.
        """
        if self.run.tensorboard is not None and self.run.primary and self.events is None:
            self.events = workdir_lib.EventWriter(self.run.tensorboard, self.run.workdir, s.step)
        try:
            return self._train(s)
        finally:
            if self.events is not None:
                self.events.close()
                self.events = None

    def _train(self, s: LoopState) -> tuple[LoopState, str]:
        t = self.run.cfg.train
        eval_every = t.eval_every_steps or self.bpe
        self._pending = []
        last_saved = s.step if self.store.ckpts.latest_step() == s.step else None
        self._last_save_time = timer = time.time()
        interval_start, interval_steps = timer, 0
        sec_per_step = math.nan
        steps_run = 0
        budget.start(self.run, self.oc, s)
        probe = budget.Probe.for_run(t, s)
        previous_loss = None  # the loss of the step before the one just dispatched
        while (reason := self.stop_reason(s)) is None:
            loss = self._dispatch(s)
            steps_run += 1
            interval_steps += 1
            if previous_loss is not None:
                jax.block_until_ready(previous_loss)  # do not run ahead of the device
            previous_loss = loss
            if steps_run <= 2 or probe.ends_at(steps_run):
                jax.block_until_ready(loss)
            now = time.time()
            s.train_seconds += now - timer  # training time on every step, for max_minutes
            probe.timed(self.run, self.oc, s, steps_run)
            if steps_run == 1:  # exclude compilation from the throughput
                self.run.log(
                    f"first step done in {now - timer:.1f}s (compilation included); a progress "
                    f"line every {t.log_every_steps} steps"
                )
                interval_start, interval_steps = now, 0
            elif steps_run == 2:
                self.run.log(epoch_estimate(now - timer, self.bpe, s.step, jax.default_backend()))
                budget.check_early(self.run, self.oc, s, now - timer)
            timer = now
            log_due = s.step % t.log_every_steps == 0
            probing = budget.unfixed(t, s)
            eval_due = s.step % eval_every == 0 and not probing
            host_reason, time_due = self._agreed_host_state(s)
            every = t.checkpoint_every_steps
            ckpt_due = not probing and (eval_due or time_due or bool(every and s.step % every == 0))
            stopping = host_reason == "signal"
            if not (log_due or eval_due or ckpt_due or stopping):
                continue
            replacement = self._fetch(s)
            now = time.time()
            s.train_seconds += now - timer
            if replacement is not None:
                s = replacement
                last_saved = s.step if self.store.ckpts.latest_step() == s.step else None
                timer = interval_start = time.time()
                interval_steps, previous_loss = 0, None
                continue
            if log_due and s.pending_loss:
                if interval_steps:
                    sec_per_step = (now - interval_start) / interval_steps
                self._log_train(s, sec_per_step)
                interval_start, interval_steps = now, 0
            if eval_due:
                self._validate(s)
            if ckpt_due or stopping:
                self._save(s)
                last_saved = s.step
            timer = time.time()
            interval_start += timer - now  # evaluation and saving are not training time
        replacement = self._fetch(s)  # the end: losses of the last steps
        if replacement is not None:  # a non-finite loss in the last steps: rolled back
            return self._train(replacement)
        s.train_seconds += time.time() - timer
        if reason != "signal" and s.valid_step != s.step:
            # validate the stop step, so that the best can be this one
            self.run.log(f"{reason} reached at step {s.step}: validating it before stopping")
            self._validate(s)
            last_saved = None  # the checkpoint must record this validation
        if last_saved != s.step and (steps_run or reason != "signal"):
            self._save(s)
        if reason != "signal":
            self.run.log(
                f"training stopped at step {s.step} (epoch {s.step / self.bpe:.2f}): {reason}"
            )
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

    def _dispatch(self, s: LoopState):
        """Queue one training step (its loss and gradient norm wait in ``_pending``)."""
        batch = next(self.run.sampler)  # the global batch; each process places its rows
        inputs, targets = parallel.shard_batch((batch.inputs, batch.targets), self.run.mesh)
        scalars = (np.bool_(batch.reset), np.int32(s.step), np.int32(s.retry))
        out = self.train_step(
            s.params,
            s.opt_state,
            s.carry,
            inputs,
            targets,
            *parallel.put_scalars(scalars, self.run.mesh),
        )
        s.params, s.opt_state, s.carry, loss, gnorm = out
        s.step += 1
        self._pending.append((s.step, loss, gnorm))
        return loss

    def _fetch(self, s: LoopState) -> LoopState | None:
        """Move the waiting losses to the host; returns the state after a rollback, else None."""
        if not self._pending:
            return None
        values = jax.device_get([(loss, g) for _, loss, g in self._pending])
        steps = [step for step, _, _ in self._pending]
        self._pending = []
        for step, (loss, g) in zip(steps, values, strict=True):
            loss, g = float(loss), float(g)
            if not (math.isfinite(loss) and math.isfinite(g)) or loss > self.loss_limit:
                return self._nonfinite(s, step, loss)
            s.pending_loss.append(loss)
            s.pending_gnorm.append(g)
        return None

    # -- pieces -----------------------------------------------------------------------------

    def _log_train(self, s: LoopState, sec_per_step: float) -> None:
        t = self.run.cfg.train
        loss = float(np.mean(np.asarray(s.pending_loss, dtype=np.float64)))
        gnorm = float(np.mean(np.asarray(s.pending_gnorm, dtype=np.float64)))
        n = len(s.pending_loss)
        s.pending_loss.clear()
        s.pending_gnorm.clear()
        chars_per_sec = t.batch_size * t.seq_len / sec_per_step if sec_per_step > 0 else math.nan
        lr = float(self.oc.learning_rate_at(s.step - 1, optim.total_steps_of(s.opt_state)))
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
        eta = self._eta(s, sec_per_step)
        if math.isfinite(chars_per_sec) and math.isfinite(eta):
            speed = f"{chars_per_sec:,.0f} char/s  ETA {_format_duration(eta)} + final evaluation"
        elif math.isfinite(chars_per_sec):
            speed = f"{chars_per_sec:,.0f} char/s"
        else:  # only the compiled first step since the start: no speed yet
            speed = "speed and ETA from the next progress line on"
        total = self._total_steps(s)
        self.run.log(
            f"step {s.step}{'/' + format(total, ',') if total else ''} "
            f"epoch {s.step / self.bpe:.2f}  loss {loss:.4f}  bpc {loss / LN2:.4f}  "
            f"|g| {gnorm:.3g}  {speed}"
        )

    def _total_steps(self, s: LoopState) -> int:
        """The step training ends at when a step bound decides it (0: unknown)."""
        t = self.run.cfg.train
        if t.max_minutes or budget.unfixed(t, s):
            return 0
        return budget.step_bound(t, s, self.bpe)

    def _validate(self, s: LoopState) -> None:
        e = self.run.cfg.eval
        start = time.time()
        self.phase = "validation"
        m = eval_lib.evaluate_tokens(
            self.run.model,
            s.params,
            self.run.valid_tokens,
            e.valid_protocol,
            batch_size=e.batch_size,
            seq_len=e.seq_len,
            min_context=e.min_context,
            mesh=self.run.mesh,
        )
        self.phase = "training"
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
            self.store.ckpts.save_best(s.step, s.params, self.store.meta(s))
        best = f"{s.best_bpc:.4f} @ {s.best_step}" if s.best_bpc is not None else "-"
        new_best = "  *new best*" if improved else ""
        self.run.log(
            f"validation step {s.step}: bpc {m['bpc']:.4f}  acc {100 * m['acc']:.2f}%  "
            f"({m['chars']:,} chars, {time.time() - start:.1f}s){new_best}  best {best}"
        )

    def _save(self, s: LoopState) -> None:
        self.store.save(s)
        self._last_save_time = time.time()

    def _nonfinite(self, s: LoopState, step: int, loss: float) -> LoopState:
        t = self.run.cfg.train
        last = self.store.ckpts.latest_step()
        self.metrics.append({"kind": "event", "event": "nonfinite", "step": step, "loss": loss})
        if math.isfinite(loss) and loss > self.loss_limit:
            what = (
                f"diverged training loss ({loss:.4g} nats, above {t.divergence_factor:g} x "
                f"ln(vocab) = {self.loss_limit:.4g})"
            )
        else:
            what = f"non-finite training loss ({loss}){self.nonfinite_hint}"
        kept = (
            f"the last good checkpoint (step {last}) is left intact in {self.run.workdir}"
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
        new = self.store.restore(last)
        new.retry = retry
        self.metrics.truncate_after(new.step)
        self.store.ckpts.prune_after(new.step)
        self.store.check_best(new)
        if self.events is not None:
            self.events.rewind(new.step)
        self.metrics.append(
            {
                "kind": "event",
                "event": "rollback",
                "step": new.step,
                "from_step": step,
                "retry": retry,
            }
        )
        self.run.log(
            f"{what} at step {step}: rolled back to step {new.step}, "
            f"retry {retry} with other dropout keys"
        )
        return new

    def out_of_memory(self, error: BaseException) -> str:
        """The one line for an out-of-memory in the current phase."""
        last = self.store.ckpts.latest_step()
        kept = (
            f"the last checkpoint (step {last}) is intact in {self.run.workdir}"
            if last is not None
            else "no checkpoint was written yet"
        )
        fields = (
            ("train.batch_size", "train.seq_len")
            if self.phase == "training"
            else ("eval.batch_size",)
        )
        return memory.out_of_memory_line(error, self.phase, fields, kept)

    # -- the end ----------------------------------------------------------------------------

    def final_evaluation(self, s: LoopState) -> tuple[dict | None, str]:
        """({split: {protocol: metrics}}, "best step N" | "final step N"); None metrics when
        a signal stops it."""
        protocols = eval_lib.parse_protocols(self.run.cfg.eval.final_protocols)
        params, used = s.params, f"final step {s.step}"
        if s.best_step is not None and s.best_step in self.store.ckpts.steps("best"):
            params, _ = self.store.ckpts.restore_params("best", s.best_step, template=s.params)
            used = f"best step {s.best_step}"
        if not protocols:
            return {}, used
        self.run.log(f"final evaluation of the {used} checkpoint:")
        signals = self.run.signals
        try:
            final = eval_lib.evaluate_splits(
                self.run.model,
                params,
                self.run.corpus,
                self.run.cfg.eval,
                ("valid", "test"),
                protocols,
                log=self.run.log,
                should_stop=lambda: signals.signum is not None,
                mesh=self.run.mesh,
            )
        except KeyboardInterrupt:
            if signals.signum is not None:
                return None, used
            raise
        return final, used

    def finish(self, state: LoopState, reason: str) -> dict:
        """The final evaluation of the best checkpoint and ``results.json`` (or the results of
        a run a signal stopped)."""
        run = self.run
        summary = {
            "step": state.step,
            "epoch": state.step / run.steps_per_epoch,
            "stop_reason": reason,
            "num_params": self.store.num_params,
            "best_step": state.best_step,
            "best_valid_bpc": state.best_bpc,
        }
        final = None
        if reason != "signal":
            run.signals.phase = "evaluation"
            self.phase = "the final evaluation"
            final, used = self.final_evaluation(state)
        if final is None:  # SIGTERM / SIGINT during training or the final evaluation
            saved = self.store.ckpts.latest_step() == state.step
            what = "checkpoint saved" if saved else "no step had run: nothing saved"
            stopped = run.signals.interrupted(
                state.step,
                f"stopped by {{name}} at step {state.step}; {what}; run the same command again to "
                f"{'resume' if saved else 'start'}",
            )
            return {**stopped, **summary, "stop_reason": "signal"}
        results = {
            "status": "finished",
            "exit_code": 0,
            **summary,
            "evaluated_checkpoint": used,
            "valid_protocol": run.cfg.eval.valid_protocol,
            "final": final,
        }
        projection = authors_lib.project_workdir(run.workdir) if run.primary else None
        if projection is not None:  # a PTB run of the authors' model: its pace to their best
            results["projection"] = projection.as_dict()
        path = run.workdir / workdir_lib.RESULTS_FILE
        if run.primary and (final or not path.exists()):
            workdir_lib.atomic_write(path, workdir_lib.json_dumps(results, indent=2) + "\n")
            run.log(f"results ({used}) written to {path}:")
            run.log(eval_lib.format_table(final))
            if projection is not None:
                run.log(projection.line())
        elif run.primary:
            run.log(f"eval.final_protocols is empty: {path} is left as it was")
        return results
