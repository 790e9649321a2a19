"""The one loader of configs: ``NAME[:VARIANT]`` of an installed config or ``FILE[:VARIANT]``,
for ``--config`` and ``rhhjax.configs.load``; failures are one line. The only library module
importing ``rhhjax.configs`` (inside functions: the configs import the library)."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rhhjax.errors import UserError, one_line

PACKAGE = "rhhjax.configs"


class ConfigArgumentError(UserError):
    """A bad config name, file, variant or override; the message is one line."""


def _configs():
    from rhhjax import configs

    return configs


def installed_config_names() -> tuple[str, ...]:
    return tuple(_configs().NAMES)


def _installed(name: str) -> bool:
    if "/" in name or name.endswith(".py") or Path(name).is_file():
        return False
    return name in installed_config_names()


def resolve_config_argument(argument: str) -> str:
    name, sep, variant = argument.partition(":")
    if not _installed(name):
        return argument
    origin = importlib.util.find_spec(f"{PACKAGE}.{name}").origin
    return f"{origin}{sep}{variant}"


def _not_found_hint() -> str:
    names = installed_config_names()
    return f"an installed config by name: --config={names[0]}:cpu, one of {', '.join(names)}"


def config_module(name: str):
    if _installed(name):
        return importlib.import_module(f"{PACKAGE}.{name}")
    file = Path(name).expanduser()
    if not file.is_file():
        if "/" not in name and not name.endswith(".py"):
            names = ", ".join(installed_config_names())
            raise ConfigArgumentError(f"unknown config {name!r}: one of {names}, or a .py file")
        raise ConfigArgumentError(f"config file {name} not found (or {_not_found_hint()})")
    spec = importlib.util.spec_from_file_location(f"rhhjax_config_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise ConfigArgumentError(f"cannot load config file {name}: {one_line(e)}") from None
    if not hasattr(module, "get_config"):
        raise ConfigArgumentError(f"config file {name} defines no get_config()")
    return module


def load_config_file(argument: str) -> tuple[Any, Any]:
    """(module, config) for ``NAME[:VARIANT]`` or ``FILE[:VARIANT]``."""
    name, _, variant = argument.partition(":")
    module = config_module(name)
    try:
        config = module.get_config(variant) if variant else module.get_config()
    except (ValueError, TypeError, KeyError) as e:
        raise ConfigArgumentError(one_line(e)) from None
    return module, config


def load(spec: str, overrides: Iterable[str] | Mapping[str, Any] = ()) -> Any:
    """The config ``spec`` with ``overrides`` ("block.field=value" strings or a mapping)."""
    _, config = load_config_file(str(spec))
    configs = _configs()
    items = overrides.items() if isinstance(overrides, Mapping) else map(_split, overrides)
    for field, value in items:
        configs.override(config, field, value)
    return config


def _split(text: str) -> tuple[str, str]:
    field, sep, value = text.partition("=")
    if not sep:
        raise ConfigArgumentError(f"override {text!r} is not block.field=value")
    return field.strip(), value
