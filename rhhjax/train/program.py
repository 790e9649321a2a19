"""Train a character-level language model (RHN / HyperRHN / LSTM) and evaluate it.

    rhhjax-train --config=ptb                     # the paper's HyperRHN on PTB (installed)
    rhhjax-train --config=ptb:cpu                 # a small model for a laptop CPU
    python -m rhhjax.train --config=ptb:cpu       # the same, without the console command
    python train.py --config=configs/ptb.py:cpu   # the same, in a checkout
    python train.py --config=configs/ptb.py:rhn --workdir=workdirs/rhn --config.train.max_steps=1000
    rhhjax-train --config=enwik8                  # the RHN paper's enwik8 recipe

--config is a config file with an optional variant (configs/ptb.py:cpu), or the name of an
installed config (ptb, enwik8, text8, with a variant: ptb:cpu); --config.<field>=value
overrides follow it. --workdir defaults to workdirs/<config name>[_<variant>] (e.g.
workdirs/ptb_cpu). Rerunning the same command in the same workdir resumes from its latest
checkpoint. The loop is rhhjax.train.trainer.train_and_evaluate; see its docstring for what is
written where.

Set JAX_COMPILATION_CACHE_DIR=/some/folder to reuse compiled steps across restarts.

Devices: the batch is split over every local device (train.batch_size and eval.batch_size must
divide by their number). Several hosts: run the same command on each with
JAX_COORDINATOR_ADDRESS=host0:port JAX_NUM_PROCESSES=N JAX_PROCESS_ID=i (or
--config.train.distributed=True under SLURM / Open MPI) and a workdir on a shared filesystem;
see rhhjax.parallel.

Memory: before anything is compiled the peak memory of training and of every evaluation is
estimated from the config's shapes (rhhjax.memory); a config that cannot fit is one error line
naming the field to lower. An out-of-memory that still happens is one line too.

Stopping: SIGTERM or SIGINT (Ctrl-C) stops after the step in flight and saves a checkpoint
(a step, or compiling the first one, can take minutes on a CPU); a second signal aborts at
once, losing the work since the last checkpoint. Checkpoints are also written every
train.checkpoint_every_minutes of wall time, so a SIGKILL loses at most that much.

Exit status:
    0             training finished (results.json written), or it had finished before
    1             bad input (one line "error: ..." on stderr, nothing written), a failed
                  checkpoint write (e.g. a full disk; one "error:" line), an out-of-memory
                  (one "error:" line), or a non-finite / diverged loss with
                  train.on_nonfinite=stop
    128 + signum  stopped by SIGTERM (143) or SIGINT (130): after the step in flight with a
                  checkpoint saved (before training started: nothing written), or at once by a
                  second signal; run the same command again to resume

--help lists the variants and every field of --config (default: the installed ptb config).
JAX_PLATFORMS=cuda on a JAX without its CUDA backend is one line naming the install command.
"""

from __future__ import annotations

from pathlib import Path

from rhhjax.errors import UserError
from rhhjax.tools import common as cli
from rhhjax.train.signals import SignalCatcher


def default_workdir(config_argument: str) -> str:
    """workdirs/<stem>[_<variant>] for a --config value like "configs/ptb.py:cpu" or
    "ptb:cpu"."""
    path, _, variant = config_argument.partition(":")
    stem = Path(path).stem
    return str(Path("workdirs") / (f"{stem}_{variant}" if variant else stem))


_SIGNALS: SignalCatcher | None = None  # entered before jax starts any thread


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

    from rhhjax.train import trainer  # after flag parsing: importing jax takes a moment

    results = trainer.train_and_evaluate(config, workdir, signals=_SIGNALS)
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
    """The program: ``rhhjax-train``, ``python -m rhhjax.train`` and ``train.py``. The signal
    catcher starts before jax is imported (its threads must inherit the blocked signals)."""
    global _SIGNALS
    _SIGNALS = SignalCatcher(hard_abort=True, thread=True).__enter__()
    cli.run_program(main, define_flags, __doc__)
