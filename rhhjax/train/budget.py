"""A run's time budget, ``train.budget_minutes``: the probe that times the steps after the
first, the budget fixed in steps from its step time (or ``budget_step_seconds``), the schedule
given the nearest step bound, and the refusal of a budget that buys no decay after the
warm-up (recorded in the workdir, so that a rerun is refused before it trains)."""

from __future__ import annotations

import dataclasses

import jax
import ml_collections
import numpy as np

from rhhjax.train import config as train_config
from rhhjax.train import optim
from rhhjax.train import workdir as workdir_lib
from rhhjax.train.config import TrainError
from rhhjax.train.optim import OptimizerConfig
from rhhjax.train.setup import Run, device_kind
from rhhjax.train.state import LoopState


def unfixed(train: ml_collections.ConfigDict, s: LoopState) -> bool:
    """Whether a budget is set but not yet fixed in steps (its probe is timing steps)."""
    return bool(train.budget_minutes) and not s.budget_steps


def step_bound(train: ml_collections.ConfigDict, s: LoopState, steps_per_epoch: int) -> int:
    """The nearest step bound: the budget's (once fixed), max_steps, max_epochs' (0: none)."""
    bounds = (s.budget_steps, train.max_steps, train.max_epochs * steps_per_epoch)
    return min((b for b in bounds if b), default=0)


def schedule_length(train: ml_collections.ConfigDict, s: LoopState, steps_per_epoch: int) -> int:
    """The steps the schedule decays over: the nearest step bound (0: budget not fixed)."""
    return 0 if unfixed(train, s) else step_bound(train, s, steps_per_epoch)


def start(run: Run, oc: OptimizerConfig, s: LoopState) -> None:
    """Fix the budget and schedule length known before the first step (a resumed state keeps
    its own)."""
    t = run.cfg.train
    if t.budget_minutes and t.budget_step_seconds and not s.budget_steps:
        fix(run, oc, s, 0.0, float(t.budget_step_seconds))
    length = schedule_length(t, s, run.steps_per_epoch)
    if oc.scheduled and length and not optim.total_steps_of(s.opt_state):
        s.opt_state = optim.set_total_steps(s.opt_state, length)


def fix(run: Run, oc: OptimizerConfig, s: LoopState, elapsed: float, step_seconds: float) -> None:
    """Turn ``train.budget_minutes`` into ``s.budget_steps`` (process 0's figure on every
    process) and give the schedule that length; a refused budget raises (`checked`)."""
    t = run.cfg.train
    steps = train_config.budget_steps_for(t, elapsed, s.step, step_seconds)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        steps = int(multihost_utils.broadcast_one_to_all(np.int32(steps)))
    checked(run, steps, step_seconds, elapsed)
    s.budget_steps = steps
    (run.workdir / workdir_lib.BUDGET_REFUSED_FILE).unlink(missing_ok=True)
    if oc.scheduled:
        s.opt_state = optim.set_total_steps(s.opt_state, schedule_length(t, s, run.steps_per_epoch))
    run.log(
        f"budget: {t.budget_minutes:g} minutes = {steps:,} steps "
        f"({step_seconds:.4g} s a step{', given' if t.budget_step_seconds else ''}; "
        f"epoch {steps / run.steps_per_epoch:.2f} at the end)"
    )


def check_early(run: Run, oc: OptimizerConfig, s: LoopState, step_seconds: float) -> None:
    """Refuse at step 2 a measured budget that buys under half its warm-up."""
    t = run.cfg.train
    if not (oc.scheduled and t.budget_minutes) or s.budget_steps:
        return
    steps = train_config.budget_steps_for(t, s.train_seconds, s.step, step_seconds)
    if 2 * steps <= t.warmup_steps + 1:
        checked(run, steps, step_seconds, s.train_seconds)


def checked(run: Run, steps: int, step_seconds: float, elapsed: float) -> None:
    """`train_config.check_budget_steps`, its refusal kept in the workdir for a rerun."""
    t = run.cfg.train
    try:
        train_config.check_budget_steps(t, steps, step_seconds, elapsed, refusal_fix())
    except TrainError as refused:
        if run.primary:
            workdir_lib.record_budget_refusal(
                run.workdir, t, device_kind(), str(refused), step_seconds
            )
        raise


def refusal_fix() -> str:
    """What to do about a budget too short for the warm-up (on a CPU: the CPU recipe)."""
    advice = "raise budget_minutes or lower warmup_steps"
    if jax.default_backend() == "cpu":
        advice += ", or train a model sized for a CPU: --config=configs/ptb.py:cpu"
    return advice


@dataclasses.dataclass
class Probe:
    """Times the steps after the first (compilation excluded) to fix a budget not yet fixed:
    ``end``, the count of steps run at which it fixes the budget (0: no probe)."""

    end: int
    start_seconds: float = 0.0  # the training seconds when the first step was done

    @classmethod
    def for_run(cls, train: ml_collections.ConfigDict, s: LoopState) -> Probe:
        """The probe of a run starting at ``s``: ``budget_probe_steps`` after the first."""
        return cls(1 + train.budget_probe_steps if unfixed(train, s) else 0)

    def ends_at(self, steps_run: int) -> bool:
        """Whether step ``steps_run`` ends the probe (its loss is waited for, to time it)."""
        return steps_run == self.end

    def timed(self, run: Run, oc: OptimizerConfig, s: LoopState, steps_run: int) -> None:
        """After step ``steps_run`` (``s.train_seconds`` counted): note the first step's end,
        fix the budget at the probe's end."""
        if steps_run == 1:
            self.start_seconds = s.train_seconds
        elif self.ends_at(steps_run):
            step_seconds = (s.train_seconds - self.start_seconds) / (self.end - 1)
            fix(run, oc, s, s.train_seconds, step_seconds)
