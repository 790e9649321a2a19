"""Experiment configs, one file per dataset, a variant after a colon: configs/ptb.py,
configs/enwik8.py and configs/text8.py (configs/hutter.py: the recipe those two share).

    config = configs.load("ptb:cpu", ["model.depth=5", "train.max_steps=10"])
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
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


def load(spec: str, overrides: Iterable[str] | Mapping[str, Any] = ()) -> ml_collections.ConfigDict:
    """The config ``spec`` (``ptb:cpu``, ``configs/ptb.py:cpu``) with ``overrides`` applied
    (``rhhjax.config_files.load``)."""
    from rhhjax import config_files

    return config_files.load(spec, overrides)


def field_value(config: ml_collections.ConfigDict, field: str) -> Any:
    """The value of the dotted ``field`` of ``config``; a one-line error names a near miss."""
    try:
        return config_fields.lookup(config, field)
    except config_fields.UnknownField as e:
        raise UserError(f"unknown config field {field}{e.hint}") from None


def convert(text: Any, like: Any, field: str) -> Any:
    """``text`` as the type of the default ``like`` (non-strings are checked, not parsed)."""
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
