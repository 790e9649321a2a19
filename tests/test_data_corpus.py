"""``Corpus`` (rhhjax/data/corpus.py): three splits encoded with the training split's
vocabulary (or the union of the splits named), one line for an unknown split."""

import numpy as np
import pytest

from rhhjax.data import corpus as corpus_lib
from rhhjax.data.errors import DataError


def codes(text: str) -> np.ndarray:
    return np.frombuffer(text.encode(), np.uint8)


def test_splits_are_encoded_with_the_training_vocabulary():
    parts = {"train": codes("abcab"), "valid": codes("cab"), "test": codes("bca")}
    corpus = corpus_lib.corpus_from_codes("toy", "byte", parts, unk=False, source="here")
    assert corpus.vocab.symbols == tuple(codes("abc").tolist())
    for split in corpus_lib.SPLITS:
        assert corpus.vocab.decode(corpus.split(split)) == bytes(parts[split])
    assert corpus.source == "here" and corpus.name == "toy"
    with pytest.raises(DataError, match="unknown split 'dev'"):
        corpus.split("dev")


def test_the_vocabulary_can_hold_the_symbols_of_several_splits():
    parts = {"train": codes("ab"), "valid": codes("bc"), "test": codes("a")}
    corpus = corpus_lib.corpus_from_codes(
        "toy", "byte", parts, unk=False, vocab_splits=("train", "valid")
    )
    assert corpus.vocab.symbols == tuple(codes("abc").tolist())
