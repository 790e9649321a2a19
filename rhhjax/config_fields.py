"""Dotted config fields ("model.depth"): the one lookup behind every "did you mean" hint.
Standard library only."""

from __future__ import annotations

import difflib
from typing import Any


class UnknownField(LookupError):
    """A dotted field not in the config: ``missing`` (up to its first missing part), ``parent``,
    ``under_value`` (``parent`` is a value) and ``hint`` (" (did you mean model.depth?)" or "")."""

    def __init__(self, missing: str, under_value: bool, suggestion: str = "") -> None:
        super().__init__(f"no config field {missing}")
        self.missing, self.under_value = missing, under_value
        self.parent = missing.rpartition(".")[0]
        self.hint = f" (did you mean {suggestion}?)" if suggestion else ""


def lookup(config: Any, field: str) -> Any:
    """The value of the dotted ``field`` of ``config``, or ``UnknownField``."""
    node, known = config, ""
    for part in field.split("."):
        if not hasattr(node, "keys"):
            raise UnknownField(known + part, under_value=True)
        if part not in node.keys():
            close = difflib.get_close_matches(part, list(node.keys()), n=1)
            raise UnknownField(known + part, False, known + close[0] if close else "")
        node, known = node[part], f"{known}{part}."
    return node
