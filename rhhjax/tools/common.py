"""Command-line plumbing shared by the programs that take ``--config`` (no jax import here).

``parse_flags(argv)`` is an ``absl.app.run`` flags parser: before absl parses anything it loads
the ``--config`` file itself and checks every ``--config.<field>=`` override against the
config that file returns, so a typo, an unknown variant or a missing file is one line::

    error: unknown config field model.dept (did you mean model.depth?)

and exit status 1, instead of a traceback. The known fields come from the config itself, so
fields added to a config file later need no change here. ``--help`` prints the program's
docstring, the config file's variants and every config field with its default, and exits 0.

``SignalCatcher`` turns SIGTERM / SIGINT into a flag the training loop polls (see
``rhhjax.trainer``); with ``thread=True`` a watcher thread receives them, so the first one is
acknowledged and a second one aborts at once even while the main thread is inside a
minutes-long compilation.
"""

from __future__ import annotations

import difflib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rhhjax.errors import UserError, exit_with_error, one_line

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "ptb.py"


class ConfigArgumentError(UserError):
    """A bad ``--config`` argument or override; the message is one line."""


# ----------------------------------------------------------------------------- config files


def load_config_file(argument: str) -> tuple[Any, Any]:
    """(module, config) for a ``--config`` value ``path[:variant]``.

    Raises ConfigArgumentError (one line) for a missing file, a file without ``get_config``
    or a variant the file rejects.
    """
    path, _, variant = argument.partition(":")
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigArgumentError(f"config file {path} not found")
    spec = importlib.util.spec_from_file_location(f"rhhjax_config_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # a broken config file: its own error, in one line
        raise ConfigArgumentError(f"cannot load config file {path}: {one_line(e)}") from None
    if not hasattr(module, "get_config"):
        raise ConfigArgumentError(f"config file {path} defines no get_config()")
    try:
        config = module.get_config(variant) if variant else module.get_config()
    except (ValueError, TypeError, KeyError) as e:
        raise ConfigArgumentError(one_line(e)) from None
    return module, config


def check_override(config: Any, name: str) -> None:
    """Raise ConfigArgumentError unless ``name`` (e.g. "model.depth") is a field of ``config``.

    An unknown field names its closest known sibling: ``unknown config field model.dept
    (did you mean model.depth?)``.
    """
    node = config
    parts = name.split(".")
    for i, part in enumerate(parts):
        here = ".".join(parts[: i + 1])
        if not hasattr(node, "keys"):
            raise ConfigArgumentError(
                f"config field {'.'.join(parts[:i])} is a value, not a section: cannot set {name}"
            )
        keys = list(node.keys())
        if part not in keys:
            prefix = ".".join(parts[:i])
            close = difflib.get_close_matches(part, keys, n=1, cutoff=0.6)
            hint = f" (did you mean {prefix + '.' if prefix else ''}{close[0]}?)" if close else ""
            raise ConfigArgumentError(f"unknown config field {here}{hint}")
        node = node[part]


def config_overrides(argv: Sequence[str], flag: str = "config") -> list[str]:
    """The field names of the ``--<flag>.<field>`` overrides in ``argv``."""
    names = []
    for arg in argv[1:]:
        if arg == "--":
            break
        for prefix in (f"--{flag}.", f"--no{flag}."):
            if arg.startswith(prefix):
                names.append(arg[len(prefix) :].split("=", 1)[0])
    return names


def config_argument(argv: Sequence[str], flag: str = "config") -> str | None:
    """The value of ``--<flag>=X`` / ``--<flag> X`` in ``argv`` (the last one), or None."""
    value = None
    args = list(argv[1:])
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg.startswith(f"--{flag}="):
            value = arg.split("=", 1)[1]
        elif arg == f"--{flag}" and i + 1 < len(args):
            value = args[i + 1]
    return value


def check_config_arguments(argv: Sequence[str], flag: str = "config") -> Any:
    """Load ``--config`` and check its overrides; returns the config (None without --config)."""
    argument = config_argument(argv, flag)
    if argument is None:
        return None
    _, config = load_config_file(argument)
    for name in config_overrides(argv, flag):
        check_override(config, name)
    return config


# ----------------------------------------------------------------------------- flags / help


def describe_config(config: Any, prefix: str = "") -> list[str]:
    """``name = value`` lines for every leaf field of a ConfigDict (sorted as defined)."""
    lines = []
    for key, value in config.items():
        name = f"{prefix}{key}"
        if hasattr(value, "items"):
            lines += describe_config(value, f"{name}.")
        else:
            lines.append(f"  {name} = {value!r}")
    return lines


def help_text(doc: str, argv: Sequence[str], flag: str = "config") -> str:
    """The program's docstring, then the variants and fields of ``--config`` (default
    configs/ptb.py)."""
    argument = config_argument(argv, flag) or str(DEFAULT_CONFIG)
    parts = [doc.strip(), ""]
    try:
        module, config = load_config_file(argument)
    except ConfigArgumentError as e:
        parts.append(f"(cannot list the config fields: {e})")
        return "\n".join(parts) + "\n"
    path = argument.partition(":")[0]
    variants = getattr(module, "VARIANTS", None)
    if variants:
        names = ", ".join(f"{path}:{v}" if v else path for v in variants)
        parts.append(f"Variants of {path}: {names}")
    parts.append(
        f"Config fields of {argument} (override any with --{flag}.<field>=<value>; "
        f"`--{flag}=FILE:VARIANT --help` lists another):"
    )
    parts += describe_config(config)
    return "\n".join(parts) + "\n"


def parse_flags(
    argv: Sequence[str], doc: str = "", flag: str | None = "config", exit: Callable = sys.exit
) -> list[str]:
    """An ``absl.app.run`` flags parser: --help (exit 0), the config checks, then absl's own
    parsing, every failure one ``error:`` line and exit status 1. ``flag=None``: a program
    without a config file (its help lists its flags)."""
    from absl import flags

    if any(a in ("-h", "--help", "-help", "--helpshort", "--helpfull") for a in argv[1:]):
        if flag is None:
            sys.stdout.write((doc or "").strip() + "\n\nFlags:\n")
            sys.stdout.write(flags.FLAGS.main_module_help() + "\n")
        else:
            sys.stdout.write(help_text(doc or "", argv, flag))
        if "--helpfull" in argv[1:]:
            sys.stdout.write("\nAll flags:\n" + flags.FLAGS.get_help() + "\n")
        exit(0)
        return []
    if flag is None:
        try:
            return flags.FLAGS(list(argv))
        except flags.Error as e:
            exit(f"error: {_flag_error(e)}")
        return []
    try:
        check_config_arguments(argv, flag)
        return flags.FLAGS(list(argv))
    except ConfigArgumentError as e:
        exit(f"error: {e}")
    except flags.Error as e:
        exit(f"error: {_flag_error(e)}")
    except (KeyError, AttributeError, ValueError, TypeError) as e:  # config_flags' own errors
        exit(f"error: {_flag_error(e)}")
    return []


def _flag_error(e: BaseException) -> str:
    """The informative line of an absl / config_flags error (drops embedded tracebacks)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if any(line.startswith("Traceback") for line in lines):
        lines = lines[-1:]  # "ValueError: ..." of the embedded traceback
    return " ".join(" ".join(lines).split()) or type(e).__name__


def run_program(
    main: Callable[[list[str]], int | None],
    define_flags: Callable[[], None],
    doc: str,
    flag: str | None = "config",
    positional: bool = False,
) -> None:
    """The ``__main__`` of every program: define its flags, parse them with ``parse_flags``
    (``flag``: its config-file flag, None for programs without one), refuse positional
    arguments unless the program takes them, quiet absl logging to warnings (unless
    ``--verbosity`` is given), run ``main``, and turn a ``UserError`` into one ``error:`` line
    and exit status 1."""
    from absl import app, flags, logging

    def run(argv: list[str]) -> None:
        if len(argv) > 1 and not positional:
            exit_with_error(f"unexpected arguments: {' '.join(argv[1:])} (flags are --name=value)")
        if not flags.FLAGS["verbosity"].present:
            logging.set_verbosity(logging.WARNING)  # orbax and jax are chatty at INFO
        try:
            code = main(argv)
        except UserError as e:
            exit_with_error(e)
        sys.exit(code or 0)

    define_flags()
    app.run(run, flags_parser=lambda argv: parse_flags(argv, doc, flag=flag))
