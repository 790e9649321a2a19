"""The state a run carries between steps (``LoopState``) and how it meets the checkpoints
(``StateStore``: fresh, saved, restored and resumed states)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from rhhjax import evaluation as eval_lib
from rhhjax import models, parallel
from rhhjax.train import checkpoint as ckpt_lib
from rhhjax.train.setup import Run
from rhhjax.train.step import init_key, make_init


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
    budget_steps: int = 0  # the steps train.budget_minutes bought (0: none, or not yet fixed)


class StateStore:
    """Fresh, saved and restored ``LoopState`` of one run; ``fresh`` gives restore templates."""

    def __init__(self, run: Run, tx, ckpts: ckpt_lib.Checkpoints, fresh: LoopState):
        self.run = run
        self.tx = tx
        self.ckpts = ckpts
        self.fresh = fresh
        self.num_params = models.count_params(fresh.params)
        self._templates = ckpt_lib.abstract((fresh.params, fresh.opt_state, fresh.carry))

    @staticmethod
    def initialise(run: Run, tx) -> LoopState:
        fsdp = bool(run.cfg.train.fsdp)
        params = make_init(run.model)(init_key(int(run.cfg.seed)))
        opt_state = tx.init(params)
        carry = eval_lib.zero_carry(run.model, params, run.cfg.train.batch_size)
        carry = parallel.shard_batch(carry, run.mesh)
        carry = jax.tree.map(jnp.copy, carry)  # distinct buffers (the LSTM's alias): donated
        params = parallel.put_state(params, run.mesh, fsdp)
        opt_state = parallel.put_state(opt_state, run.mesh, fsdp)
        return LoopState(params=params, opt_state=opt_state, carry=carry)

    def meta(self, s: LoopState) -> dict:
        run = self.run
        return {
            "version": ckpt_lib.META_VERSION,
            "vocab": run.corpus.vocab.to_dict(),
            "model": dataclasses.asdict(run.model),
            "config": run.cfg.to_dict(),
            "num_params": self.num_params,
            "step": s.step,
            "epoch": s.step / run.steps_per_epoch,
            "sampler": run.sampler.state(),
            "rng": {"seed": int(run.cfg.seed), "retry": s.retry},
            "best": {"bpc": s.best_bpc, "step": s.best_step},
            "evals_since_best": s.evals_since_best,
            "pending": {"loss": list(s.pending_loss), "grad_norm": list(s.pending_gnorm)},
            "train_seconds": s.train_seconds,
            "valid_step": s.valid_step,
            "budget_steps": s.budget_steps,
        }

    def save(self, s: LoopState) -> None:
        self.ckpts.save_latest(s.step, s.params, s.opt_state, s.carry, self.meta(s))
        self.ckpts.keep_only_best(s.best_step)

    def restore(self, step: int) -> LoopState:
        params, opt_state, carry, m = self.ckpts.restore_latest(step, *self._templates)
        self.run.sampler.restore(m["sampler"])
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
            budget_steps=int(m.get("budget_steps", 0)),
        )

    def resume(self) -> LoopState | None:
        """The newest undamaged checkpoint's state, or None; DamagedCheckpointError if all are."""
        steps = sorted(self.ckpts.steps("latest"), reverse=True)
        for i, step in enumerate(steps):
            try:
                return self.restore(step)
            except ckpt_lib.DamagedCheckpointError as e:
                if i + 1 == len(steps):
                    raise ckpt_lib.DamagedCheckpointError(
                        f"{e}; no undamaged checkpoint to resume from: delete "
                        f"{self.run.workdir} (or move it away) to start over",
                        e.which,
                        e.step,
                    ) from None
                self.run.log(f"{e}: resuming from step {steps[i + 1]} instead")
        return None

    def check_best(self, s: LoopState) -> None:
        """Make ``best/`` hold exactly the best checkpoint ``s`` records (else forget it)."""
        if s.best_step is not None:
            problem = None
            if s.best_step not in self.ckpts.steps("best"):
                problem = (
                    f"the best checkpoint of step {s.best_step} is missing from "
                    f"{self.ckpts.workdir / ckpt_lib.BEST_DIR}"
                )
            else:
                try:
                    self.ckpts.restore_params("best", s.best_step, template=s.params)
                except ckpt_lib.DamagedCheckpointError as e:
                    problem = str(e)
            if problem:
                self.run.log(f"{problem}: the next validation makes a new one")
                s.best_step, s.best_bpc = None, None
        self.ckpts.keep_only_best(s.best_step)
