"""Vocabularies: the sorted symbol table of a training split (characters or byte values,
``unk=True`` reserving the last id), encode / decode and JSON form."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rhhjax.data.errors import DataError

TEXT_VOCABS = ("char", "byte")
UNK_TEXT = "\ufffd"
_CHUNK = 1 << 24


def codepoints(text: str) -> np.ndarray:
    """Unicode code points of ``text`` as a uint32 array ``[len(text)]`` (vectorised)."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")


def decode_utf8(data: bytes, where: str) -> str:
    """``data`` decoded as UTF-8; a DataError naming ``where`` and the byte otherwise."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(
            f"{where} is not valid UTF-8 at byte {e.start} ({e.reason}); "
            f"use text_vocab='byte' for arbitrary bytes"
        ) from e


def _check_codes(codes: Any) -> np.ndarray:
    codes = np.asarray(codes).reshape(-1)
    if codes.size and not np.issubdtype(codes.dtype, np.integer):
        raise DataError(f"symbol codes must be integers, got {codes.dtype}")
    if codes.size and np.issubdtype(codes.dtype, np.signedinteger) and codes.min() < 0:
        raise DataError("symbol codes must be non-negative")
    return codes


def _symbol_repr(kind: str, code: int) -> str:
    if kind == "byte":
        return f"byte 0x{code:02x}"
    return f"{chr(code)!r} (U+{code:04X})"


@dataclasses.dataclass(frozen=True)
class Vocab:
    """Sorted symbol table of characters (``kind="char"``) or byte values (``"byte"``); ids
    are positions in ``symbols``, ``unk=True`` reserves the last id for unseen symbols."""

    kind: str
    symbols: tuple
    unk: bool = False
    _codes: np.ndarray = dataclasses.field(init=False, repr=False, compare=False)
    _table: np.ndarray = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.kind not in TEXT_VOCABS:
            raise DataError(f"vocab kind must be one of {TEXT_VOCABS}, got {self.kind!r}")
        symbols = tuple(self.symbols)
        if not symbols:
            raise DataError("vocabulary is empty (the training split has no symbols)")
        if self.kind == "char":
            if not all(isinstance(s, str) and len(s) == 1 for s in symbols):
                raise DataError("char vocabulary symbols must be single characters")
            codes = np.array([ord(s) for s in symbols], dtype=np.int64)
        else:
            if not all(isinstance(s, (int, np.integer)) and 0 <= s < 256 for s in symbols):
                raise DataError("byte vocabulary symbols must be integers 0..255")
            symbols = tuple(int(s) for s in symbols)
            codes = np.array(symbols, dtype=np.int64)
        if np.any(np.diff(codes) <= 0):
            raise DataError("vocabulary symbols must be sorted and unique")
        table = np.full(int(codes[-1]) + 1, -1, dtype=np.int64)
        table[codes] = np.arange(len(codes))
        object.__setattr__(self, "symbols", symbols)
        object.__setattr__(self, "unk", bool(self.unk))
        object.__setattr__(self, "_codes", codes)
        object.__setattr__(self, "_table", table)

    @classmethod
    def from_codes(cls, codes: np.ndarray, kind: str, unk: bool = False) -> Vocab:
        codes = _check_codes(codes)
        if codes.size == 0:
            raise DataError("cannot build a vocabulary: the training split is empty")
        counts = np.zeros(1, dtype=np.int64)
        for start in range(0, codes.size, _CHUNK):
            part = np.bincount(codes[start : start + _CHUNK])
            if len(part) > len(counts):
                part[: len(counts)] += counts
                counts = part
            else:
                counts[: len(part)] += part
        present = np.flatnonzero(counts)
        if kind == "char":
            symbols = tuple(chr(int(c)) for c in present)
        else:
            symbols = tuple(int(c) for c in present)
        return cls(kind=kind, symbols=symbols, unk=unk)

    @classmethod
    def from_data(cls, data: str | bytes, unk: bool = False) -> Vocab:
        if isinstance(data, str):
            return cls.from_codes(codepoints(data), "char", unk)
        return cls.from_codes(np.frombuffer(bytes(data), dtype=np.uint8), "byte", unk)

    @property
    def size(self) -> int:
        return len(self.symbols) + int(self.unk)

    def __len__(self) -> int:
        return self.size

    @property
    def unk_id(self) -> int | None:
        return len(self.symbols) if self.unk else None

    @property
    def dtype(self) -> np.dtype:
        """Storage dtype of encoded tokens: uint8, uint16 or uint32."""
        if self.size <= 256:
            return np.dtype(np.uint8)
        if self.size <= 65536:
            return np.dtype(np.uint16)
        return np.dtype(np.uint32)

    def encode_codes(self, codes: np.ndarray, *, split: str = "data") -> np.ndarray:
        """Map code points or byte values to ids (unknown: ``unk_id`` or a DataError)."""
        codes = _check_codes(codes)
        out = np.empty(codes.shape, dtype=self.dtype)
        table = self._table
        for start in range(0, codes.size, _CHUNK):
            part = codes[start : start + _CHUNK]
            inside = part < len(table)
            ids = np.where(inside, table[np.where(inside, part, 0)], -1)
            unknown = ids < 0
            if unknown.any():
                if not self.unk:
                    self._unknown_error(codes, start + int(np.argmax(unknown)), split)
                ids[unknown] = self.unk_id
            out[start : start + _CHUNK] = ids
        return out

    def _unknown_error(self, codes: np.ndarray, pos: int, split: str) -> None:
        where = f"position {pos}"
        if self.kind == "char":
            where += f" (line {int(np.count_nonzero(codes[:pos] == 10)) + 1})"
        raise DataError(
            f"{split} split: symbol {_symbol_repr(self.kind, int(codes[pos]))} at {where} is not "
            f"in the vocabulary built from the training split ({len(self.symbols)} symbols); "
            f"set unk=True to map unknown symbols to a reserved id"
        )

    def encode(self, data: str | bytes, *, split: str = "data") -> np.ndarray:
        if self.kind == "char":
            if not isinstance(data, str):
                raise DataError("a char vocabulary encodes str, not bytes")
            return self.encode_codes(codepoints(data), split=split)
        if isinstance(data, str):
            raise DataError("a byte vocabulary encodes bytes, not str")
        return self.encode_codes(np.frombuffer(bytes(data), dtype=np.uint8), split=split)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str | bytes:
        """Inverse of ``encode`` (str or bytes; the unknown id as U+FFFD)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.size):
            raise DataError(f"ids must be in [0, {self.size}), got {ids.min()}..{ids.max()}")
        known = ids < len(self.symbols)
        codes = self._codes[np.where(known, ids, 0)]
        if self.kind == "char":
            codes = np.where(known, codes, ord(UNK_TEXT)).astype("<u4")
            return codes.tobytes().decode("utf-32-le", "surrogatepass")
        if known.all():
            return codes.astype(np.uint8).tobytes()
        unk_bytes = UNK_TEXT.encode("utf-8")
        parts = [bytes([int(c)]) if k else unk_bytes for c, k in zip(codes, known, strict=True)]
        return b"".join(parts)

    def to_dict(self) -> dict:
        return {"version": 1, "kind": self.kind, "symbols": list(self.symbols), "unk": self.unk}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Vocab:
        if not isinstance(d, Mapping) or "kind" not in d or "symbols" not in d:
            raise DataError("vocab dict must have 'kind' and 'symbols' (from Vocab.to_dict)")
        if d.get("version", 1) != 1:
            raise DataError(f"unsupported vocab dict version {d.get('version')!r}")
        return cls(kind=d["kind"], symbols=tuple(d["symbols"]), unk=bool(d.get("unk", False)))
