"""Tests of rhhjax.data.vocab: unknown symbols, the reserved unknown id, JSON round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rhhjax.data import DataError
from rhhjax.data.vocab import Vocab


def test_byte_vocab_round_trips_through_json():
    byte_vocab = Vocab.from_data(b"\x00hello\xff", unk=True)
    assert Vocab.from_dict(json.loads(json.dumps(byte_vocab.to_dict()))) == byte_vocab


def test_unknown_symbol_is_an_error_naming_symbol_split_and_position():
    vocab = Vocab.from_data("abc\n")
    with pytest.raises(DataError) as err:
        vocab.encode("ab\nbaZc", split="valid")
    msg = str(err.value)
    assert "'Z'" in msg and "valid" in msg and "position 5" in msg and "line 2" in msg
    assert "\n" not in msg


def test_unk_maps_unknown_symbols_to_the_reserved_last_id():
    vocab = Vocab.from_data("abc", unk=True)
    assert vocab.size == 4 and vocab.unk_id == 3
    np.testing.assert_array_equal(vocab.encode("aZc\u00e9", split="test"), [0, 3, 2, 3])
    assert vocab.decode([0, 3]) == "a\ufffd"


def test_encode_decode_round_trip_and_dtype():
    text = "héllo wörld\n" * 3
    vocab = Vocab.from_data(text)
    ids = vocab.encode(text)
    assert ids.dtype == np.uint8 and vocab.decode(ids) == text
    with pytest.raises(DataError, match="char vocabulary encodes str"):
        vocab.encode(text.encode())
