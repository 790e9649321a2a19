"""Experiment configs: one file per dataset, its variants chosen after a colon.

    configs/ptb.py     Penn Treebank (Suarez 2017): the paper's HyperRHN, RHN and LSTM, and
                       small CPU and smoke variants (``configs/ptb.py:cpu``).
    configs/enwik8.py  the RHN paper's enwik8 recipe (Zilly et al. 2017).
    configs/text8.py   the RHN paper's text8 recipe.
    configs/hutter.py  the recipe enwik8 and text8 share (not a config file itself).

Programs take ``--config=configs/ptb.py[:variant]`` plus ``--config.<block>.<field>=value``
overrides. Library code and tests load configs through this package (installed as
``rhhjax.configs``), never with ``importlib``:

    from rhhjax import configs
    config = configs.load("ptb:cpu", ["model.depth=5", "train.max_steps=10"])
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import ml_collections

from rhhjax import config_fields
from rhhjax.errors import UserError

NAMES = ("ptb", "enwik8", "text8")


def check_variant(file: str, variant: str, variants: Iterable[str]) -> None:
    """The one error of every config file for a variant it does not define."""
    variants = tuple(variants)
    if variant not in variants:
        shown = ", ".join(repr(v) for v in variants)
        raise UserError(f"unknown variant {variant!r} of configs/{file}.py; one of {shown}")


def split_spec(spec: str) -> tuple[str, str]:
    """``"ptb:cpu"`` -> ``("ptb", "cpu")``; ``"my/exp.py:cpu"`` -> ``("my/exp.py", "cpu")``."""
    name, _, variant = str(spec).partition(":")
    return name, variant


def _config_module(name: str):
    """The module of a known config (``ptb``) or of a config file (``path/to/file.py``: that
    file, e.g. a modified copy, not the installed config of the same name)."""
    if name.endswith(".py"):
        path = Path(name).expanduser()
        if not path.is_file():
            raise UserError(f"config file {name} not found")
        spec = importlib.util.spec_from_file_location(f"rhhjax_config_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    if name not in NAMES:
        raise UserError(f"unknown config {name!r}: one of {', '.join(NAMES)}, or a .py file")
    return importlib.import_module(f"{__name__}.{name}")


def load(spec: str, overrides: Iterable[str] | Mapping[str, Any] = ()) -> ml_collections.ConfigDict:
    """The config ``spec`` (``ptb``, ``ptb:cpu``, ``configs/ptb.py:cpu``, any config file with an
    optional variant) with ``overrides`` applied: ``"block.field=value"`` strings (typed like the
    default) or a mapping from dotted field names to values."""
    name, variant = split_spec(spec)
    module = _config_module(name)
    config = module.get_config(variant) if variant else module.get_config()
    items = overrides.items() if isinstance(overrides, Mapping) else map(_split_override, overrides)
    for field, value in items:
        override(config, field, value)
    return config


def _split_override(text: str) -> tuple[str, str]:
    field, sep, value = text.partition("=")
    if not sep:
        raise UserError(f"override {text!r} is not block.field=value")
    return field.strip(), value


def field_value(config: ml_collections.ConfigDict, field: str) -> Any:
    """The value of the dotted ``field`` of ``config``; a one-line error names a near miss."""
    try:
        return config_fields.lookup(config, field)
    except config_fields.UnknownField as e:
        raise UserError(f"unknown config field {field}{e.hint}") from None


def convert(text: Any, like: Any, field: str) -> Any:
    """``text`` as the type of the default ``like``: bools from true/false/1/0, numbers as
    numbers, strings as they are. Values that are not strings are checked, not parsed."""
    if not isinstance(text, str):
        if isinstance(like, bool) != isinstance(text, bool) or (
            isinstance(like, (int, float)) and not isinstance(text, (int, float))
        ):
            raise UserError(f"{field}: {text!r} is not a {type(like).__name__}")
        return float(text) if isinstance(like, float) else text
    if isinstance(like, bool):
        lowered = text.strip().lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        raise UserError(f"{field}: {text!r} is not a boolean (true / false)")
    if isinstance(like, (int, float)):
        try:
            value = ast.literal_eval(text.strip())
        except (ValueError, SyntaxError):
            value = None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"{field}: {text!r} is not a number")
        if isinstance(like, int) and not float(value).is_integer():
            raise UserError(f"{field}: {text!r} is not an integer")
        return type(like)(value)
    return text


def override(config: ml_collections.ConfigDict, field: str, value: Any) -> None:
    """Set the dotted ``field`` of ``config`` to ``value`` (a string is typed like the default)."""
    old = field_value(config, field)
    if isinstance(old, ml_collections.ConfigDict):
        raise UserError(f"{field} is a block of fields, not a field")
    parent, _, leaf = field.rpartition(".")
    node = field_value(config, parent) if parent else config
    node[leaf] = convert(value, old, field)
