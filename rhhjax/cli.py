"""Command-line plumbing of every program (no jax import): ``parse_flags`` checks ``--config``
and its overrides before absl parses, so a typo is one ``error:`` line; ``run_program`` is every
program's ``__main__`` (flags, logging, ``JAX_PLATFORMS``, ``UserError`` -> exit status 1)."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from rhhjax import config_fields
from rhhjax.config_files import ConfigArgumentError, load_config_file, resolve_config_argument
from rhhjax.errors import UserError, exit_with_error, one_line

# the config --help lists without --config: the installed package's ptb
DEFAULT_CONFIG = "ptb"


def check_override(config: Any, name: str) -> None:
    try:
        config_fields.lookup(config, name)
    except config_fields.UnknownField as e:
        if e.under_value:
            message = f"config field {e.parent} is a value, not a section: cannot set {name}"
        else:
            message = f"unknown config field {e.missing}{e.hint}"
        raise ConfigArgumentError(message) from None


def config_overrides(argv: Sequence[str], flag: str = "config") -> list[str]:
    names = []
    for arg in argv[1:]:
        if arg == "--":
            break
        for prefix in (f"--{flag}.", f"--no{flag}."):
            if arg.startswith(prefix):
                names.append(arg[len(prefix) :].split("=", 1)[0])
    return names


def config_argument(argv: Sequence[str], flag: str = "config") -> str | None:
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


def check_override_order(argv: Sequence[str], flag: str = "config") -> None:
    args = list(argv[1:])
    args = args[: args.index("--")] if "--" in args else args
    overrides = [i for i, a in enumerate(args) if a.startswith((f"--{flag}.", f"--no{flag}."))]
    if not overrides:
        return
    first = args[overrides[0]]
    given = [i for i, a in enumerate(args) if a.startswith(f"--{flag}=") or a == f"--{flag}"]
    if not given:
        raise ConfigArgumentError(
            f"{first} needs --{flag} first, e.g. --{flag}=ptb:cpu {first} (--{flag}=NAME[:VARIANT] "
            f"of an installed config, or a file)"
        )
    if given[0] > overrides[0]:
        raise ConfigArgumentError(f"{first} comes before --{flag}: give --{flag} first")


def check_config_arguments(argv: Sequence[str], flag: str = "config") -> Any:
    """Load ``--config`` and check its overrides; returns the config (None without --config)."""
    check_override_order(argv, flag)
    argument = config_argument(argv, flag)
    if argument is None:
        return None
    _, config = load_config_file(argument)
    for name in config_overrides(argv, flag):
        check_override(config, name)
    return config


def describe_config(config: Any, prefix: str = "") -> list[str]:
    lines = []
    for key, value in config.items():
        name = f"{prefix}{key}"
        if hasattr(value, "items"):
            lines += describe_config(value, f"{name}.")
        else:
            lines.append(f"  {name} = {value!r}")
    return lines


def load_default_config() -> tuple[Any, Any]:
    return load_config_file(DEFAULT_CONFIG)


def help_text(doc: str, argv: Sequence[str], flag: str = "config") -> str:
    """The program's docstring, then the variants and fields of ``--config``."""
    argument = config_argument(argv, flag)
    parts = [doc.strip(), ""]
    try:
        if argument is None:
            argument = DEFAULT_CONFIG
            module, config = load_default_config()
        else:
            module, config = load_config_file(argument)
    except (ConfigArgumentError, ImportError) as e:  # ImportError: a broken install
        parts.append(f"(cannot list the config fields: {one_line(e)})")
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


def flags_help(names: Sequence[str]) -> str:
    from absl import flags

    wanted, lines = set(names), []
    for module, defined in flags.FLAGS.flags_by_module_dict().items():
        if any(f.name in wanted for f in defined):
            lines += flags.FLAGS.module_help(module).strip("\n").splitlines()[1:]
    return "\n".join(lines)


def parse_flags(
    argv: Sequence[str],
    doc: str = "",
    flag: str | None = "config",
    exit: Callable = sys.exit,
    own: Sequence[str] = (),
) -> list[str]:
    """An ``absl.app.run`` flags parser; ``flag=None``: no config; ``own``: flags --help lists."""
    from absl import flags

    if any(a in ("-h", "--help", "-help", "--helpshort", "--helpfull") for a in argv[1:]):
        listed = flags_help(own) if own else flags.FLAGS.main_module_help()
        doc = (doc or "").strip() + "\n\nFlags:\n" + listed + "\n"
        if flag is None:
            sys.stdout.write(doc)
        else:
            sys.stdout.write(help_text(doc, argv, flag))
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
        return flags.FLAGS(with_config_files(argv, flag))
    except ConfigArgumentError as e:
        exit(f"error: {e}")
    except flags.Error as e:
        exit(f"error: {_flag_error(e)}")
    except (KeyError, AttributeError, ValueError, TypeError) as e:
        exit(f"error: {_flag_error(e)}")
    return []


def with_config_files(argv: Sequence[str], flag: str = "config") -> list[str]:
    out, args = [argv[0]], list(argv[1:])
    for i, arg in enumerate(args):
        if arg.startswith(f"--{flag}="):
            arg = f"--{flag}={resolve_config_argument(arg.split('=', 1)[1])}"
        elif i > 0 and args[i - 1] == f"--{flag}":
            arg = resolve_config_argument(arg)
        out.append(arg)
    return out


def _flag_error(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if any(line.startswith("Traceback") for line in lines):
        lines = lines[-1:]
    return " ".join(" ".join(lines).split()) or type(e).__name__


GPU_INSTALL = 'pip install -e ".[cuda12]"'
_PLATFORM_PLUGINS = {"cuda": ("cuda",), "gpu": ("cuda", "rocm"), "rocm": ("rocm",)}


def jax_plugins() -> set[str]:
    from importlib.metadata import entry_points

    names = {entry.value for entry in entry_points(group="jax_plugins")}
    try:
        import jax_plugins as namespace
    except ImportError:
        return names
    import pkgutil

    names.update(f"jax_plugins.{m.name}" for m in pkgutil.iter_modules(namespace.__path__))
    return names


def check_platforms(value: str | None = None, plugins: set[str] | None = None) -> None:
    """UserError when ``JAX_PLATFORMS`` names only platforms with no installed backend."""
    value = os.environ.get("JAX_PLATFORMS", "") if value is None else value
    wanted = [p.strip().lower() for p in value.split(",") if p.strip()]
    if not wanted or "cpu" in wanted:
        return
    missing = []
    for platform in wanted:
        if platform == "tpu":
            if importlib.util.find_spec("libtpu") is None:
                missing.append(platform)
            continue
        kinds = _PLATFORM_PLUGINS.get(platform)
        if kinds is None:
            return
        plugins = jax_plugins() if plugins is None else plugins
        if not any(kind in name for name in plugins for kind in kinds):
            missing.append(platform)
    if len(missing) < len(wanted):
        return
    if "tpu" in missing and len(missing) == 1:
        how = 'install it with pip install "jax[tpu]"'
    else:
        how = f"install the CUDA one with {GPU_INSTALL} (NVIDIA GPUs)"
    raise UserError(
        f"JAX_PLATFORMS={value} but this JAX has no {'/'.join(missing)} backend installed "
        f"(CPU only): {how}, or unset JAX_PLATFORMS to run on the CPU"
    )


class _PluginErrors(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.causes: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if "plugin configuration error" not in record.getMessage():
            return True
        error = record.exc_info[1] if record.exc_info else None
        self.causes.append(one_line(error) if error is not None else record.getMessage())
        return False


_PLUGIN_ERRORS = _PluginErrors()


def _hold_plugin_errors() -> None:
    wanted = [p.strip().lower() for p in os.environ.get("JAX_PLATFORMS", "").split(",")]
    if any(wanted) and "cpu" not in wanted:
        logging.getLogger("jax._src.xla_bridge").addFilter(_PLUGIN_ERRORS)


def backend_failure(error: BaseException) -> str | None:
    """One line for JAX failing to start the backend ``JAX_PLATFORMS`` asks for, else None."""
    value = os.environ.get("JAX_PLATFORMS", "")
    if not value.strip() or value.strip().lower() == "cpu":
        return None
    if isinstance(error, RuntimeError) and "Unable to initialize backend" in str(error):
        return one_line(error)
    frames = traceback.extract_tb(error.__traceback__)
    if (
        isinstance(error, AssertionError)
        and frames
        and frames[-1].filename.endswith("xla_bridge.py")
    ):
        cause = f" ({_PLUGIN_ERRORS.causes[-1]})" if _PLUGIN_ERRORS.causes else ""
        return (
            f"JAX_PLATFORMS={value}: JAX could not start that backend{cause}; is a GPU "
            f"visible (nvidia-smi)? Unset JAX_PLATFORMS to run on the CPU"
        )
    return None


def run_program(
    main: Callable[[list[str]], int | None],
    define_flags: Callable[[], None],
    doc: str,
    flag: str | None = "config",
    positional: bool = False,
) -> None:
    """The ``__main__`` of every program; a ``UserError`` is one ``error:`` line, exit 1."""
    from absl import app, flags, logging

    def run(argv: list[str]) -> None:
        if len(argv) > 1 and not positional:
            exit_with_error(f"unexpected arguments: {' '.join(argv[1:])} (flags are --name=value)")
        if not flags.FLAGS["verbosity"].present:
            logging.set_verbosity(logging.WARNING)
        try:
            check_platforms()
            _hold_plugin_errors()
            code = main(argv)
        except UserError as e:
            exit_with_error(e)
        except (AssertionError, RuntimeError) as e:
            message = backend_failure(e)
            if message is None:
                raise
            exit_with_error(message)
        sys.exit(code or 0)

    before = set(flags.FLAGS)
    define_flags()
    own = [name for name in flags.FLAGS if name not in before]
    app.run(run, flags_parser=lambda argv: parse_flags(argv, doc, flag=flag, own=own))
