"""Helpers shared by the tests (not collected: no ``test_`` prefix): the data files the tests
read, the tiny training config, and comparisons of parameter trees.

    from helpers import assert_trees_close, read_only_folder, tiny_run_config, write_text

Data: ``$RHHJAX_SHAKESPEARE`` (default ``../shared/data/tinyshakespeare/input.txt`` beside the
repository) and ``$RHHJAX_PTB_DIR`` (default ``../shared/data/ptb``); ``write_text`` puts a
deterministic stand-in in place of Tiny Shakespeare when it is absent, so nothing is skipped.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
SHAKESPEARE = Path(
    os.environ.get("RHHJAX_SHAKESPEARE", SHARED_DATA / "tinyshakespeare" / "input.txt")
)
PTB_DIR = Path(os.environ.get("RHHJAX_PTB_DIR", SHARED_DATA / "ptb"))
PTB_CONFIG = ROOT / "configs" / "ptb.py"


# ----------------------------------------------------------------------------- data and configs


def write_text(path: Path, n: int = 30_000) -> Path:
    """The first ``n`` characters of Tiny Shakespeare (or a deterministic stand-in with a small
    alphabet) written to ``path``; returns ``path``."""
    if SHAKESPEARE.is_file():
        text = SHAKESPEARE.read_text(encoding="utf-8")[:n]
    else:
        rng = np.random.default_rng(0)
        words = ["the", "king", "and", "queen", "of", "a", "castle", "speak", "now", "Thou"]
        text = " ".join(rng.choice(words, size=n // 3))[:n]
    path.write_text(text, encoding="utf-8")
    return path


def tiny_run_config(text_file: Path | str | None = None, **overrides: Any):
    """``configs/ptb.py:tiny``, on ``text_file`` (format=text, 3,000-character valid and test
    splits) when given, with ``section__field=value`` overrides (``train__max_steps=8``) or
    top-level ``field=value`` ones (``seed=3``)."""
    from rhhjax import configs

    cfg = configs.load("ptb:tiny")
    if text_file is not None:
        cfg.data.format = "text"
        cfg.data.text_files = str(text_file)
        cfg.data.hutter_holdout = 3000
    for key, value in overrides.items():
        section, _, name = key.rpartition("__")
        if section:
            cfg[section][name] = value
        else:
            cfg[name] = value
    return cfg


def read_only_folder(tmp_path: Path) -> Path:
    """A folder in which no file can be created: ``tmp_path/ro`` with mode 0o555, or, for
    root (whom file modes do not stop), ``/sys`` (sysfs refuses new files even to root)."""
    if os.geteuid() == 0:
        return Path("/sys")
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    return folder


# ----------------------------------------------------------------------------- parameter trees


def assert_trees_equal(a: Any, b: Any) -> None:
    """Same tree structure and bitwise-equal leaves."""
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for (path, x), y in zip(
        jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b), strict=True
    ):
        np.testing.assert_array_equal(
            np.asarray(x), np.asarray(y), err_msg=jax.tree_util.keystr(path)
        )


def assert_trees_close(actual: Any, expected: Any, atol: float, rtol: float | None = None) -> float:
    """Same tree structure and leaves within ``atol`` + ``rtol`` * |expected| (``rtol``
    defaults to ``atol``), compared in float64 whatever the dtypes (bfloat16 included); the
    message names the failing leaf. Returns the largest absolute difference."""
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    rtol = atol if rtol is None else rtol
    worst = 0.0
    leaves = zip(
        jax.tree_util.tree_leaves_with_path(actual), jax.tree.leaves(expected), strict=True
    )
    for (path, a), e in leaves:
        a, e = np.asarray(a, np.float64), np.asarray(e, np.float64)
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=jax.tree_util.keystr(path))
        worst = max(worst, float(np.max(np.abs(a - e))) if a.size else 0.0)
    return worst
