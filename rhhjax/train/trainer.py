"""Train a character-level language model (RHN / HyperRHN / LSTM) and evaluate it.

    rhhjax-train --config=ptb:cpu                 # or python -m rhhjax.train, python train.py
    python train.py --config=configs/ptb.py:rhn --workdir=workdirs/rhn --config.train.max_steps=1000

--config: a config file or installed config with an optional variant, then --config.<field>
overrides; --workdir defaults to workdirs/<config name>[_<variant>]; the same command resumes
(SIGTERM / SIGINT stop after the step in flight, saving a checkpoint). docs/operations.md.

Exit status: 0 finished; 1 bad input, a failed write, out of memory or a non-finite loss (one
"error:" line); 128 + signum: stopped by SIGTERM (143) / SIGINT (130), rerun to resume.
"""

# The docstring above is the program's --help. The program checks the install and the workdir
# before jax is imported, so what imports jax is imported inside the functions.

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rhhjax import cli, memory, outputs
from rhhjax.errors import UserError, exit_with_error
from rhhjax.train.signals import SignalCatcher

if TYPE_CHECKING:
    from rhhjax.train import workdir as workdir_lib
    from rhhjax.train.loop import Loop
    from rhhjax.train.setup import Run
    from rhhjax.train.state import LoopState, StateStore


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

    Validates the config, data and workdir before writing anything (``rhhjax.train.setup``),
    initialises or resumes from the newest undamaged checkpoint, trains until a bound, early
    stopping or a signal (checkpointing on the way), then evaluates the best checkpoint on
    valid and test and writes ``results.json``. What a run prints, writes and does on a
    signal, a non-finite loss or an out-of-memory: docs/operations.md ("What a run does").

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
    from rhhjax.train import checkpoint as ckpt_lib
    from rhhjax.train import step as step_lib
    from rhhjax.train import workdir as workdir_lib
    from rhhjax.train.loop import Loop, loss_limit
    from rhhjax.train.optim import OptimizerConfig, make_optimizer
    from rhhjax.train.setup import prepare_run
    from rhhjax.train.state import StateStore

    signals.phase = "startup"
    run = prepare_run(config, workdir, log, signals)
    if run.finished is not None:
        run.log(finished_line(workdir, run.finished, run.cfg.train))
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
        # one device: no layout (the plain 3-argument call that tests patch in step_lib)
        layout = (run.mesh, bool(run.cfg.train.fsdp)) if run.mesh.size > 1 else ()
        train_model = _autotuned(run, oc)
        train_step = step_lib.make_train_step(train_model, oc, int(run.cfg.seed), *layout)
        limit = loss_limit(run.cfg.train.divergence_factor, run.corpus.vocab.size)
        hint = nonfinite_hint(train_model, run.cfg.train.batch_size)
        loop = Loop(run, store, oc, train_step, metrics, loss_limit=limit, nonfinite_hint=hint)
        with _out_of_memory_in_one_line(loop):
            state, reason = loop.train(state)
            return loop.finish(state, reason)


def finished_line(workdir: Path, results: dict, train: Any) -> str:
    """The line of a rerun of a finished run: how to train further."""
    from rhhjax.train import workdir as workdir_lib

    head = (
        f"{workdir} already finished at step {results['step']}: nothing to do (results in "
        f"{workdir / workdir_lib.RESULTS_FILE}); "
    )
    evaluate = "run python -m rhhjax.tools.evaluate for other protocols"
    if results.get("stop_reason") == "budget":
        return (
            f"{head}its budget (train.budget_minutes={train.budget_minutes:g}) fixed its "
            f"length at {results['step']:,} steps, which a higher max_steps / max_epochs / "
            f"max_minutes does not extend: to train longer, start another --workdir with a "
            f"larger budget_minutes, or {evaluate}"
        )
    return f"{head}raise train.max_steps / max_epochs / max_minutes to train further, or {evaluate}"


def _autotuned(run: Run, oc) -> Any:
    """The model config the training step runs: with ``model.impl=auto`` on one GPU, the
    fastest of `fused` and the `persistent` variants (``rhhjax.train.autotune``); evaluation
    keeps ``run.model``."""
    import dataclasses

    import jax

    from rhhjax.ops import persistent
    from rhhjax.train import autotune

    seconds = run.cfg.train.autotune_seconds
    if autotune.off_reason(run.model, seconds, run.mesh.size, jax.default_backend()):
        return run.model
    t = run.cfg.train
    choice = autotune.choose(run.model, oc, t.batch_size, t.seq_len, seconds)
    run.log(choice.line)
    variant = persistent.parse_variant(choice.variant)
    return dataclasses.replace(run.model, impl=choice.impl, persistent=variant)


def nonfinite_hint(mc, batch: int) -> str:
    """What a non-finite loss may also mean under the step's implementation ``mc`` at
    ``batch``: a `persistent` grid barrier that gave up, which a training step reports as NaN
    ("" where no grid barrier runs: the row-group layout's cluster barriers never give up)."""
    from rhhjax.ops import persistent

    if mc.impl != persistent.NAME:
        return ""
    hyper = mc.hyper_hidden if mc.type == "hyperrhn" else 0
    if not persistent.grid_barrier_runs(mc.persistent, batch, mc.hidden, hyper, mc.dtype):
        return ""
    return " (or a grid barrier of persistent's grid layout that gave up: it shows as this)"


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
    from rhhjax import models
    from rhhjax.train import config as train_config
    from rhhjax.train import workdir as workdir_lib

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


# The program: train.py, rhhjax-train and python -m rhhjax.train run ``console``.


def default_workdir(config_argument: str) -> str:
    """workdirs/<stem>[_<variant>] for a --config value like "configs/ptb.py:cpu"."""
    path, _, variant = config_argument.partition(":")
    stem = Path(path).stem
    return str(Path("workdirs") / (f"{stem}_{variant}" if variant else stem))


_SIGNALS: SignalCatcher | None = None  # entered before jax starts any thread


# the ranks of a multi-process launch (JAX, SLURM, Open MPI): only process 0 takes the lock
RANK_VARIABLES = ("JAX_PROCESS_ID", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")


def check_workdir_free(argv: list[str]) -> None:
    """WorkdirInUseError when the run's workdir, read from the command line before the config
    file imports jax, is in use; an existing one is locked at once (process 0 only)."""
    if any(os.environ.get(name, "0").strip() not in ("", "0") for name in RANK_VARIABLES):
        return
    config = cli.config_argument(argv)
    workdir = cli.config_argument(argv, "workdir") or (config and default_workdir(config))
    if workdir:
        outputs.hold_workdir(workdir)


def check_install(find_spec=None) -> None:
    """UserError when the ``rhhjax`` imported has no ``rhhjax.configs``: a checkout's
    ``rhhjax/`` shadowing a non-editable install."""
    import importlib.util

    find_spec = find_spec or importlib.util.find_spec
    if find_spec("rhhjax.configs") is not None:
        return
    import rhhjax

    package = Path(rhhjax.__file__).resolve().parent
    raise UserError(
        f"{package} has no rhhjax.configs: this checkout is not installed editable (a "
        f"non-editable install does not serve its train.py): run pip install -e . in "
        f"{package.parent}"
    )


def main(argv: list[str]) -> int:
    """Train the ``--config`` run in ``--workdir``; returns the exit status (see above)."""
    from absl import flags
    from ml_collections import config_flags

    try:
        config = flags.FLAGS.config
        if config is None:
            raise UserError("--config is required, e.g. --config=ptb:cpu or --config=FILE.py")
        config.to_dict()  # a missing config file raises here
    except OSError as e:
        raise UserError(f"cannot read the config file: {' '.join(str(e).split())}") from None
    workdir = flags.FLAGS.workdir or default_workdir(
        config_flags.get_config_filename(flags.FLAGS["config"])
    )
    results = train_and_evaluate(config, workdir, signals=_SIGNALS)
    return int(results.get("exit_code", 0))


def define_flags() -> None:
    """--config (a file or an installed config's name, with a variant) and --workdir."""
    from absl import flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file(
        "config", None, "Config file or installed config, with a variant: ptb:cpu, FILE.py[:V]."
    )
    flags.DEFINE_string(
        "workdir", None, "Run directory; default workdirs/<config stem>[_<variant>]."
    )


def console() -> None:
    """The program; the signal catcher starts before jax is imported (threads inherit it)."""
    global _SIGNALS
    try:
        check_install()
        if not any(a in ("-h", "--help", "-help", "--helpshort", "--helpfull") for a in sys.argv):
            check_workdir_free(sys.argv)
    except UserError as e:
        exit_with_error(e)
    _SIGNALS = SignalCatcher(hard_abort=True, thread=True).__enter__()
    cli.run_program(main, define_flags, __doc__)
