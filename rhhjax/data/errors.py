"""``DataError`` and the argument checks every module of ``rhhjax.data`` raises it from."""

from __future__ import annotations

from typing import Any

import numpy as np

from rhhjax.errors import UserError


class DataError(UserError):
    """Every user-facing data problem; the message is a single line."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).splitlines()))


def check_int(name: str, value: Any, minimum: int) -> int:
    """``value`` as an int when it is an integer (not a bool) ``>= minimum``, else DataError."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise DataError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_tokens(tokens: Any) -> np.ndarray:
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
        raise DataError(
            f"tokens must be a 1-D integer array, got shape {tokens.shape} {tokens.dtype}"
        )
    return tokens
