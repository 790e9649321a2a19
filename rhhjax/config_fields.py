"""Dotted config fields ("model.depth"): the one lookup behind every "did you mean" hint.

``lookup(config, "model.depth")`` is the field's value; a missing field raises
``UnknownField``, naming where the walk left the config and the closest sibling, which
callers (``configs.override``, ``--config.<field>=``, ``ablate --sweep``) word into one line:
``unknown config field model.dept (did you mean model.depth?)``. Standard library only.
"""

from __future__ import annotations

import difflib
from typing import Any


class UnknownField(LookupError):
    """A dotted field that is not in the config. ``missing``: the field up to its first
    missing part ("model.dept" of "model.dept.x"); ``parent``: the part before that ("model",
    "" at the top); ``under_value``: ``parent`` holds a value, not a section; ``hint``:
    ``" (did you mean model.depth?)"`` naming the closest sibling of the missing part, or ""
    when none is close."""

    def __init__(self, missing: str, under_value: bool, suggestion: str = "") -> None:
        super().__init__(f"no config field {missing}")
        self.missing, self.under_value = missing, under_value
        self.parent = missing.rpartition(".")[0]
        self.hint = f" (did you mean {suggestion}?)" if suggestion else ""


def lookup(config: Any, field: str) -> Any:
    """The value of the dotted ``field`` of ``config`` (a ConfigDict or nested mappings), or
    ``UnknownField`` at its first part that is not there."""
    node, known = config, ""  # known: the parts walked so far, each with its dot
    for part in field.split("."):
        if not hasattr(node, "keys"):
            raise UnknownField(known + part, under_value=True)
        if part not in node.keys():
            close = difflib.get_close_matches(part, list(node.keys()), n=1)
            raise UnknownField(known + part, False, known + close[0] if close else "")
        node, known = node[part], f"{known}{part}."
    return node
