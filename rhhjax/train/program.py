"""Train a character-level language model (RHN / HyperRHN / LSTM) and evaluate it.

    rhhjax-train --config=ptb:cpu                 # or python -m rhhjax.train, python train.py
    python train.py --config=configs/ptb.py:rhn --workdir=workdirs/rhn --config.train.max_steps=1000

--config: a config file or installed config with an optional variant, then --config.<field>
overrides; --workdir defaults to workdirs/<config name>[_<variant>]; the same command resumes
(SIGTERM / SIGINT stop after the step in flight, saving a checkpoint). docs/operations.md.

Exit status: 0 finished; 1 bad input, a failed write, out of memory or a non-finite loss (one
"error:" line); 128 + signum: stopped by SIGTERM (143) / SIGINT (130), rerun to resume.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rhhjax import cli, outputs
from rhhjax.errors import UserError, exit_with_error
from rhhjax.train.signals import SignalCatcher


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
    file imports jax, is in use (checked on process 0 only)."""
    import os

    if any(os.environ.get(name, "0").strip() not in ("", "0") for name in RANK_VARIABLES):
        return
    config = cli.config_argument(argv)
    workdir = cli.config_argument(argv, "workdir") or (config and default_workdir(config))
    if workdir:
        outputs.check_workdir_free(workdir)


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
