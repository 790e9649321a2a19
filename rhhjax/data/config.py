"""The ``data`` block: ``default_data_config()`` (its defaults), ``validate_data_config``
(checks that need no file) and ``load_corpus`` (the corpus it describes)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import ml_collections
import numpy as np

from rhhjax.data import text
from rhhjax.data.corpus import Corpus
from rhhjax.data.errors import DataError
from rhhjax.data.ptb import PTB_FILES, load_ptb
from rhhjax.data.samplers import SAMPLERS

FORMATS = ("chars", "mikolov_char", "text")


def default_data_config() -> ml_collections.ConfigDict:
    """The ``data`` block with every field at its default: Penn Treebank's raw characters."""
    data = ml_collections.ConfigDict()
    data.format = "chars"  # chars (raw ptb.*.txt, 50 symbols) | mikolov_char | text.
    data.corpus = ""  # format=text: a known corpus (enwik8 | text8) to download; "" = none.
    data.url = ""  # data.corpus: a mirror of its download address; "" = the official one.
    data.sha256 = ""  # data.corpus: expected SHA256 of the download; "" = the embedded hash.
    data.dir = ""  # PTB folder; "" = $RHHJAX_CACHE/ptb (~/.cache/rhhjax/ptb), downloaded.
    data.download = True  # Download simple-examples.tgz when the files are missing.
    data.unk = False  # Map unseen valid/test symbols to <unk> instead of failing.
    data.text_files = ""  # format=text: one file (hutter split) or "train,valid,test".
    data.text_split = "hutter"  # format=text: hutter (last N test, previous N valid) | files.
    data.text_vocab = "char"  # format=text: char (Unicode characters) | byte.
    # format=text, hutter split: symbols of valid and of test; 0 = 5% of the file each.
    data.hutter_holdout = text.DEFAULT_HUTTER_HOLDOUT
    data.sampler = "windows"  # windows (paper: random 101-char windows) | stream (TBPTT).
    return data


def _as_dict(cfg: Any) -> dict[str, Any]:
    if hasattr(cfg, "to_dict"):
        return cfg.to_dict()
    if isinstance(cfg, Mapping):
        return dict(cfg)
    try:
        return dict(vars(cfg))
    except TypeError:
        raise DataError(f"data config must be a mapping, got {type(cfg).__name__}") from None


def _with_defaults(cfg: Any) -> dict[str, Any]:
    return {**default_data_config().to_dict(), **_as_dict(cfg)}


def _check_choice(name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise DataError(f"{name}={value!r} is not one of {', '.join(map(str, choices))}")


def _check_bool(key: str, value: Any) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise DataError(f"data config {key} must be a bool, got {value!r}")


def validate_data_config(cfg_data: Any) -> None:
    """Every check of the data block that needs no file."""
    d = _with_defaults(cfg_data)
    _check_choice("data.format", d["format"], FORMATS)
    _check_choice("data.sampler", d["sampler"], SAMPLERS)
    if d["corpus"]:
        _check_choice("data.corpus", d["corpus"], tuple(text.CORPORA))
    _check_bool("unk", d["unk"])
    _check_bool("download", d["download"])
    folder = d["dir"]
    if folder is not None and not isinstance(folder, (str, os.PathLike)):
        raise DataError(f"data config dir must be a path or None, got {folder!r}")
    if d["format"] == "text":
        split = text.check_text_split(d["text_split"])
        text.check_text_vocab(d["text_vocab"])
        if split == "hutter":
            text.check_holdout(d["hutter_holdout"])


def resolve_data_config(cfg: Any) -> dict[str, Any]:
    items = _as_dict(cfg)
    corpus = items.get("corpus") or ""
    if items.get("format") == "text" and not items.get("text_files") and corpus:
        path = text.ensure_corpus(
            corpus,
            download=bool(items.get("download", True)),
            url=items.get("url") or "",
            sha256=items.get("sha256") or "",
        )
        items["text_files"] = str(path)
    return items


def load_corpus(cfg: Any) -> Corpus:
    d = _with_defaults(cfg)
    validate_data_config(d)
    d = resolve_data_config(d)
    if d["format"] in PTB_FILES:
        return load_ptb(d["format"], d["dir"], bool(d["download"]), bool(d["unk"]))
    files = d["text_files"]
    if not files or not text.split_paths(files):
        raise DataError("data config format='text' needs text_files (one path or train,valid,test)")
    return text.load_text_corpus(
        files,
        split=d["text_split"],
        vocab=d["text_vocab"],
        unk=bool(d["unk"]),
        holdout=d["hutter_holdout"],
    )
