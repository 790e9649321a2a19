"""``Corpus``: the three encoded splits of a text and the vocabulary of its training split."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from rhhjax.data.errors import DataError
from rhhjax.data.vocab import Vocab

SPLITS = ("train", "valid", "test")


@dataclasses.dataclass(eq=False)
class Corpus:
    """Three encoded splits (1-D arrays ``[n_tokens]`` of ``vocab.dtype``) and their vocabulary."""

    name: str
    vocab: Vocab
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    source: str = ""

    def split(self, name: str) -> np.ndarray:
        if name not in SPLITS:
            raise DataError(f"unknown split {name!r}: expected one of {SPLITS}")
        return getattr(self, name)


def corpus_from_codes(
    name: str,
    kind: str,
    codes: Mapping[str, np.ndarray],
    unk: bool,
    source: str = "",
    vocab_splits: tuple[str, ...] = ("train",),
) -> Corpus:
    """Corpus of the symbol codes of each split, the vocabulary from ``vocab_splits``."""
    parts = [Vocab.from_codes(codes[s], kind) for s in vocab_splits]
    symbols = tuple(sorted(set().union(*(v.symbols for v in parts))))
    vocab = Vocab(kind=kind, symbols=symbols, unk=unk)
    enc = {s: vocab.encode_codes(codes[s], split=s) for s in SPLITS}
    return Corpus(name=name, vocab=vocab, **enc, source=source)
