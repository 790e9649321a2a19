"""Character-level corpora, vocabularies, training samplers and evaluation batches.

Pure numpy + standard library (no jax): everything here runs on the host.

Corpora (``load_corpus``)
    * ``chars``: the raw characters of Mikolov's word-level PTB files ``ptb.{train,valid,test}.txt``
      (the Recurrent Highway Hypernetworks paper's choice): 50 symbols including ``'\\n'`` and
      ``' '``; every line starts and ends with a space, as in the files.
    * ``mikolov_char``: the tokens of ``ptb.char.{train,valid,test}.txt``: the same text as
      whitespace-separated characters with ``'_'`` between words. Every token must be a single
      character. The end of a line is the symbol ``'\\n'`` (``MIKOLOV_EOL``), so the vocabulary is
      49 characters + ``'\\n'`` = 50 and ``Vocab.decode`` gives readable text with one sentence per
      line. Unlike ``chars`` there is no leading/trailing word separator on a line.
    * ``text``: the user's own UTF-8 file(s) (enwik8, text8, tinyshakespeare, ...), with a
      ``char`` (Unicode code points) or ``byte`` vocabulary, split by three explicit files or by
      the Hutter convention (last N symbols test, previous N valid, the rest train).

    Vocabularies are built from the training split only (sorted symbols, deterministic) and are
    JSON-serialisable (``Vocab.to_dict`` / ``Vocab.from_dict``) so they can be stored with every
    checkpoint. A symbol of valid/test that is not in the vocabulary is a ``DataError`` naming the
    symbol, the split and the position, unless ``unk=True``, which reserves one extra id (the
    last, ``vocab.unk_id``) for unknown symbols.

PTB files
    ``resolve_ptb_dir`` looks in an explicit folder, then in the cache
    (``$RHHJAX_CACHE/ptb``, default ``~/.cache/rhhjax/ptb``), then downloads Mikolov's
    ``simple-examples.tgz`` into the cache. Every file is checked against the SHA256 hashes in
    ``PTB_SHA256`` (wherever it was found) before any of it is used; downloads are written to
    temporary files and renamed atomically.

Training samplers
    ``WindowSampler`` (the paper's: random windows of ``seq_len + 1`` symbols) and
    ``StreamSampler`` (contiguous truncated-BPTT streams with the state carried across
    batches). Both are deterministic functions of ``(seed, step)`` and resumable through
    ``state()`` / ``restore()``.

Evaluation
    ``eval_batches`` with three protocols: ``windows`` and ``stream`` (honest: every symbol but
    the first scored exactly once) and ``paper`` (the paper's own protocol, which is not).
    ``scored_count`` gives the number of scored symbols of each.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import shutil
import tarfile
import tempfile
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import ml_collections
import numpy as np

from rhhjax.errors import UserError

__all__ = [
    "DEFAULT_HUTTER_HOLDOUT",
    "EVAL_PROTOCOLS",
    "FORMATS",
    "MIKOLOV_EOL",
    "PAPER_CHUNK",
    "PAPER_SEQ_LEN",
    "PTB_FILES",
    "PTB_SHA256",
    "PTB_URL",
    "Corpus",
    "DataError",
    "EvalBatch",
    "StreamSampler",
    "TrainBatch",
    "Vocab",
    "WindowSampler",
    "default_data_config",
    "eval_batches",
    "load_corpus",
    "load_ptb",
    "load_text_corpus",
    "num_eval_batches",
    "ptb_cache_dir",
    "resolve_ptb_dir",
    "scored_count",
]


class DataError(UserError):
    """Every user-facing data problem; the message is a single line."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).splitlines()))


# --------------------------------------------------------------------------------------------
# Constants
# --------------------------------------------------------------------------------------------

PTB_URL = "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz"
PTB_ARCHIVE_DIR = "simple-examples/data"  # members are ./simple-examples/data/<file>

# SHA256 of Mikolov's simple-examples/data files (identical in every public copy checked).
PTB_SHA256: dict[str, str] = {
    "ptb.train.txt": "fcea919f6cf83f35d4d00c6cbf08040d13d4155226340912e2fef9c9c4102cbf",
    "ptb.valid.txt": "c9fe6985fe0d4ccb578183407d7668fc6066c20700cb4cf87d8ff1cc34df1bf2",
    "ptb.test.txt": "dd65dff31e70846b2a6030a87482edcd5d199130cdcfa1f3dccbb033728deee0",
    "ptb.char.train.txt": "e313d91425e06c4f0a8fb6e881dcce0c291f2a0e9f4dda54833069b122f91da9",
    "ptb.char.valid.txt": "21661f63ec355085879458b6524644d4add5573541b4be14fb52ab2e2e995eb8",
    "ptb.char.test.txt": "1ef5607ac3c463b16e38bfe7900dd3bfc91de5a96e0f21e7eab5188b465b8ebe",
}

PTB_FILES: dict[str, dict[str, str]] = {
    "chars": {"train": "ptb.train.txt", "valid": "ptb.valid.txt", "test": "ptb.test.txt"},
    "mikolov_char": {
        "train": "ptb.char.train.txt",
        "valid": "ptb.char.valid.txt",
        "test": "ptb.char.test.txt",
    },
}

SPLITS = ("train", "valid", "test")
FORMATS = ("chars", "mikolov_char", "text")
TEXT_SPLITS = ("files", "hutter")
TEXT_VOCABS = ("char", "byte")
EVAL_PROTOCOLS = ("windows", "stream", "paper")

MIKOLOV_EOL = "\n"  # end-of-line symbol of the mikolov_char format
DEFAULT_HUTTER_HOLDOUT = 5_000_000
PAPER_CHUNK = 51  # the paper's evaluation: rows start every 51 symbols ...
PAPER_SEQ_LEN = 100  # ... and hold 100 inputs / 100 targets (101 symbols)
UNK_TEXT = "\ufffd"  # how Vocab.decode renders the reserved unknown id


# --------------------------------------------------------------------------------------------
# Vocabulary
# --------------------------------------------------------------------------------------------


def _codepoints(text: str) -> np.ndarray:
    """Unicode code points of ``text`` as a uint32 array (vectorised, no Python loop)."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")


_CHUNK = 1 << 24  # symbols per vectorised step when counting / encoding long texts


def _check_codes(codes: Any) -> np.ndarray:
    """1-D array of non-negative integer codes (code points or byte values)."""
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
    """Sorted symbol table; ids are positions in ``symbols`` (+ one reserved unknown id).

    ``kind="char"``: symbols are single characters (``str``), sorted by code point.
    ``kind="byte"``: symbols are byte values (``int`` 0..255), sorted.
    ``unk=True`` reserves id ``len(symbols)`` (the last) for symbols outside the table; it is
    never produced by the training split (the table is built from it).
    """

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

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def from_codes(cls, codes: np.ndarray, kind: str, unk: bool = False) -> Vocab:
        """Vocabulary of the distinct code points / byte values in ``codes``."""
        codes = _check_codes(codes)
        if codes.size == 0:
            raise DataError("cannot build a vocabulary: the training split is empty")
        counts = np.zeros(1, dtype=np.int64)
        for start in range(0, codes.size, _CHUNK):  # chunks bound the temporaries (enwik8)
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
        """``char`` vocabulary of a string, or ``byte`` vocabulary of bytes."""
        if isinstance(data, str):
            return cls.from_codes(_codepoints(data), "char", unk)
        return cls.from_codes(np.frombuffer(bytes(data), dtype=np.uint8), "byte", unk)

    # -- properties --------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Number of ids (symbols + the reserved unknown id when ``unk``)."""
        return len(self.symbols) + int(self.unk)

    def __len__(self) -> int:
        return self.size

    @property
    def unk_id(self) -> int | None:
        return len(self.symbols) if self.unk else None

    @property
    def dtype(self) -> np.dtype:
        """Storage dtype of encoded tokens: uint8, or uint16 / uint32 for larger vocabularies."""
        if self.size <= 256:
            return np.dtype(np.uint8)
        if self.size <= 65536:
            return np.dtype(np.uint16)
        return np.dtype(np.uint32)

    # -- encode / decode ---------------------------------------------------------------------

    def encode_codes(self, codes: np.ndarray, *, split: str = "data") -> np.ndarray:
        """Map code points (char) or byte values (byte) to ids, as ``self.dtype``.

        Unknown symbols raise ``DataError`` naming the symbol, ``split`` and the position
        (index in the sequence), or map to ``unk_id`` when ``unk`` is set.
        """
        codes = _check_codes(codes)
        out = np.empty(codes.shape, dtype=self.dtype)
        table = self._table
        for start in range(0, codes.size, _CHUNK):  # chunks bound the temporaries (enwik8)
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
        """Encode a string (``char`` vocab) or bytes (``byte`` vocab)."""
        if self.kind == "char":
            if not isinstance(data, str):
                raise DataError("a char vocabulary encodes str, not bytes")
            return self.encode_codes(_codepoints(data), split=split)
        if isinstance(data, str):
            raise DataError("a byte vocabulary encodes bytes, not str")
        return self.encode_codes(np.frombuffer(bytes(data), dtype=np.uint8), split=split)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str | bytes:
        """Inverse of ``encode``: str for ``char``, bytes for ``byte``.

        The unknown id renders as U+FFFD (its UTF-8 bytes for a byte vocabulary).
        """
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

    # -- serialisation -----------------------------------------------------------------------

    def to_dict(self) -> dict:
        """JSON-able description (store it with every checkpoint)."""
        return {"version": 1, "kind": self.kind, "symbols": list(self.symbols), "unk": self.unk}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Vocab:
        if not isinstance(d, Mapping) or "kind" not in d or "symbols" not in d:
            raise DataError("vocab dict must have 'kind' and 'symbols' (from Vocab.to_dict)")
        if d.get("version", 1) != 1:
            raise DataError(f"unsupported vocab dict version {d.get('version')!r}")
        return cls(kind=d["kind"], symbols=tuple(d["symbols"]), unk=bool(d.get("unk", False)))


# --------------------------------------------------------------------------------------------
# Corpus
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class Corpus:
    """Three encoded splits (1-D arrays of ``vocab.dtype``) and their vocabulary."""

    name: str
    vocab: Vocab
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    source: str = ""  # where it was read: the PTB folder or the text file(s)

    def split(self, name: str) -> np.ndarray:
        if name not in SPLITS:
            raise DataError(f"unknown split {name!r}: expected one of {SPLITS}")
        return getattr(self, name)


def _corpus_from_codes(
    name: str, kind: str, codes: Mapping[str, np.ndarray], unk: bool, source: str = ""
) -> Corpus:
    vocab = Vocab.from_codes(codes["train"], kind, unk)
    enc = {s: vocab.encode_codes(codes[s], split=s) for s in SPLITS}
    return Corpus(name=name, vocab=vocab, **enc, source=source)


# --------------------------------------------------------------------------------------------
# PTB files: location, verification, download
# --------------------------------------------------------------------------------------------


def ptb_cache_dir() -> pathlib.Path:
    """``$RHHJAX_CACHE/ptb`` (default ``~/.cache/rhhjax/ptb``)."""
    root = os.environ.get("RHHJAX_CACHE") or os.path.join("~", ".cache", "rhhjax")
    return pathlib.Path(root).expanduser() / "ptb"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _verify(name: str, data: bytes, where: str) -> None:
    got = _sha256(data)
    if got != PTB_SHA256[name]:
        raise DataError(
            f"SHA256 mismatch for {name} in {where}: expected {PTB_SHA256[name]}, got {got}; "
            f"the file is corrupt or not Mikolov's PTB (delete it and download again)"
        )


def _read_verified(folder: pathlib.Path, names: Sequence[str]) -> dict[str, bytes]:
    """Read each file once and check its SHA256 on the very bytes that will be used."""
    out = {}
    for name in names:
        path = folder / name
        try:
            data = path.read_bytes()
        except OSError as e:
            raise DataError(f"cannot read {path}: {e}") from e
        _verify(name, data, str(folder))
        out[name] = data
    return out


def _fetch(url: str, dest: pathlib.Path) -> None:
    """Download ``url`` to ``dest``. The only function that touches the network (tests patch it)."""
    with urllib.request.urlopen(url, timeout=60) as response, open(dest, "wb") as f:
        shutil.copyfileobj(response, f)


def _atomic_write(path: pathlib.Path, data: bytes) -> None:
    """Write to a temporary file beside ``path``, fsync, then rename: never half-written."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise


def _offline_error(
    names: Sequence[str], cache: pathlib.Path, reason: str, explicit: pathlib.Path | None
) -> DataError:
    extra = f"; {explicit} does not hold them all" if explicit is not None else ""
    return DataError(
        f"PTB files not found and not downloaded ({reason}): download {PTB_URL}, take "
        f"{', '.join(names)} from {PTB_ARCHIVE_DIR}/ in the archive and put them in {cache} "
        f"(or set the data config's dir to a folder that holds them){extra}"
    )


def _extract_ptb(archive: pathlib.Path, names: Sequence[str]) -> dict[str, bytes]:
    """Read (never extract to disk) the wanted members and verify every one of them."""
    wanted = set(names)
    found: dict[str, bytes] = {}
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                path = pathlib.PurePosixPath(member.name)
                parts = [p for p in path.parts if p not in (".", "/")]
                if "/".join(parts[:-1]) != PTB_ARCHIVE_DIR or parts[-1] not in wanted:
                    continue
                f = tar.extractfile(member)
                if f is None:
                    continue
                found[parts[-1]] = f.read()
    except (tarfile.TarError, OSError, EOFError) as e:
        raise DataError(f"the downloaded {PTB_URL} is not a readable tgz archive: {e}") from e
    missing = [n for n in names if n not in found]
    if missing:
        raise DataError(
            f"the downloaded archive {PTB_URL} lacks {', '.join(missing)} under {PTB_ARCHIVE_DIR}/"
        )
    for name in names:
        _verify(name, found[name], f"the downloaded archive {PTB_URL}")
    return found


def _download_ptb(
    cache: pathlib.Path, explicit: pathlib.Path | None, needed: Sequence[str]
) -> None:
    """Download simple-examples.tgz, verify all PTB files, write them atomically into ``cache``."""
    names = tuple(PTB_SHA256)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=".simple-examples.", suffix=".tgz.part", dir=cache)
        os.close(fd)
    except OSError as e:
        raise DataError(f"cannot write to the PTB cache folder {cache}: {e}") from e
    tmp = pathlib.Path(tmp_name)
    try:
        try:
            _fetch(PTB_URL, tmp)
        except Exception as e:  # any failure to fetch means "offline"
            raise _offline_error(needed, cache, f"{type(e).__name__}: {e}", explicit) from e
        files = _extract_ptb(tmp, names)  # every file verified before anything is written
        for name in names:
            try:
                _atomic_write(cache / name, files[name])
            except OSError as e:
                raise DataError(f"cannot write {cache / name}: {e}") from e
    finally:
        tmp.unlink(missing_ok=True)


def _locate_ptb(
    dir: str | os.PathLike | None, download: bool, names: Sequence[str]
) -> tuple[pathlib.Path, dict[str, bytes]]:
    names = tuple(names)
    unknown = [n for n in names if n not in PTB_SHA256]
    if unknown:
        raise DataError(f"unknown PTB file(s) {unknown}: expected some of {list(PTB_SHA256)}")
    explicit = pathlib.Path(dir).expanduser() if dir not in (None, "") else None
    cache = ptb_cache_dir()
    if explicit is not None:  # an explicit folder is used or refused, never silently replaced
        if not explicit.is_dir():
            raise DataError(
                f"data dir {explicit} is not a folder (set it to the folder holding "
                f"{', '.join(names)}, or leave it empty to use the cache {cache})"
            )
        missing = [n for n in names if not (explicit / n).is_file()]
        if missing:
            raise DataError(
                f"data dir {explicit} lacks {', '.join(missing)} (take them from {PTB_URL}, "
                f"{PTB_ARCHIVE_DIR}/, or leave dir empty to use the cache {cache})"
            )
        return explicit, _read_verified(explicit, names)
    if all((cache / n).is_file() for n in names):
        return cache, _read_verified(cache, names)
    if not download:
        raise _offline_error(names, cache, "download=False", explicit)
    _download_ptb(cache, explicit, names)
    return cache, _read_verified(cache, names)


def resolve_ptb_dir(
    dir: str | os.PathLike | None, download: bool = True, files: Sequence[str] | None = None
) -> pathlib.Path:
    """Folder holding verified PTB files (``files``: default all six of ``PTB_SHA256``).

    Order: ``dir`` if it holds all the files (verified; a mismatch is an error), else the cache
    ``ptb_cache_dir()`` (verified), else download ``PTB_URL`` into the cache when ``download``,
    else ``DataError`` naming the URL, the files and the folder to put them in.
    """
    folder, _ = _locate_ptb(dir, download, files if files is not None else tuple(PTB_SHA256))
    return folder


def _decode_utf8(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(
            f"{where} is not valid UTF-8 at byte {e.start} ({e.reason}); "
            f"use text_vocab='byte' for arbitrary bytes"
        ) from e


def _parse_mikolov(text: str, where: str) -> str:
    """Tokens of a Mikolov char file joined into a string; end of line -> ``MIKOLOV_EOL``."""
    lines = []
    for lineno, line in enumerate(text.split("\n"), start=1):
        tokens = line.split()
        joined = "".join(tokens)
        if len(joined) != len(tokens):
            bad = next(t for t in tokens if len(t) != 1)
            raise DataError(
                f"{where} line {lineno}: token {bad!r} is not a single character "
                f"(mikolov_char files hold space-separated characters)"
            )
        lines.append(joined)
    return MIKOLOV_EOL.join(lines)


def load_ptb(
    format: str = "chars",
    dir: str | os.PathLike | None = None,
    download: bool = True,
    unk: bool = False,
) -> Corpus:
    """PTB as ``chars`` (raw characters of ptb.*.txt) or ``mikolov_char`` (ptb.char.*.txt)."""
    if format not in PTB_FILES:
        raise DataError(f"PTB format must be one of {tuple(PTB_FILES)}, got {format!r}")
    names = PTB_FILES[format]
    folder, raw = _locate_ptb(dir, download, [names[s] for s in SPLITS])
    codes = {}
    for s in SPLITS:
        text = _decode_utf8(raw[names[s]], str(folder / names[s]))
        if format == "mikolov_char":
            text = _parse_mikolov(text, str(folder / names[s]))
        codes[s] = _codepoints(text)
    return _corpus_from_codes(f"ptb_{format}", "char", codes, unk, source=str(folder))


# --------------------------------------------------------------------------------------------
# Generic text corpus
# --------------------------------------------------------------------------------------------


def _read_codes(path: pathlib.Path, vocab: str) -> np.ndarray:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DataError(f"cannot read text file {path}: {e}") from e
    if vocab == "byte":
        return np.frombuffer(data, dtype=np.uint8)
    return _codepoints(_decode_utf8(data, str(path)))


def _split_paths(files: str | os.PathLike | Sequence[str | os.PathLike]) -> list[pathlib.Path]:
    if isinstance(files, (str, os.PathLike)):
        items = [p.strip() for p in os.fspath(files).split(",")]
    else:
        items = [os.fspath(p).strip() for p in files]
    return [pathlib.Path(p).expanduser() for p in items if p]


def load_text_corpus(
    files: str | os.PathLike | Sequence[str | os.PathLike],
    split: str = "hutter",
    vocab: str = "char",
    unk: bool = False,
    holdout: int = DEFAULT_HUTTER_HOLDOUT,
) -> Corpus:
    """The user's own text: one file (``split="hutter"``) or train,valid,test (``"files"``).

    ``vocab="char"``: UTF-8 decoded, one symbol per code point; ``"byte"``: one per byte.
    Hutter split (RHN paper, enwik8/text8): the last ``holdout`` symbols are test, the
    ``holdout`` before them valid, everything before train; a file of at most ``2 * holdout``
    symbols is an error.
    """
    if split not in TEXT_SPLITS:
        raise DataError(f"text_split must be one of {TEXT_SPLITS}, got {split!r}")
    if vocab not in TEXT_VOCABS:
        raise DataError(f"text_vocab must be one of {TEXT_VOCABS}, got {vocab!r}")
    paths = _split_paths(files)
    unit = "character" if vocab == "char" else "byte"
    if split == "hutter":
        if len(paths) != 1:
            raise DataError(
                f"text_split='hutter' needs exactly one file in text_files, got {len(paths)}"
            )
        if isinstance(holdout, bool) or not isinstance(holdout, (int, np.integer)) or holdout < 1:
            raise DataError(f"hutter_holdout must be a positive integer, got {holdout!r}")
        holdout = int(holdout)
        codes = _read_codes(paths[0], vocab)
        n = len(codes)
        if n <= 2 * holdout:
            raise DataError(
                f"{paths[0]} has {n} {unit}s, too short for a Hutter split with "
                f"hutter_holdout={holdout} (needs more than {2 * holdout}: the last {holdout} "
                f"test, the {holdout} before valid, the rest train); lower hutter_holdout or use "
                f"text_split='files'"
            )
        parts = {
            "train": codes[: n - 2 * holdout],
            "valid": codes[n - 2 * holdout : n - holdout],
            "test": codes[n - holdout :],
        }
    else:
        if len(paths) != 3:
            raise DataError(
                f"text_split='files' needs text_files='train,valid,test' (3 comma-separated "
                f"paths), got {len(paths)}"
            )
        parts = {s: _read_codes(p, vocab) for s, p in zip(SPLITS, paths, strict=True)}
    for s in SPLITS:
        if len(parts[s]) < 2:
            raise DataError(f"text corpus: the {s} split has fewer than 2 {unit}s")
    source = ",".join(str(p) for p in paths)
    return _corpus_from_codes(f"text_{vocab}:{paths[0].name}", vocab, parts, unk, source=source)


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------


def default_data_config() -> ml_collections.ConfigDict:
    """Defaults of the ``data`` config section (the field comments are the documentation)."""
    c = ml_collections.ConfigDict()
    # Corpus: "chars" (raw characters of PTB ptb.*.txt, the paper's), "mikolov_char"
    # (tokens of PTB ptb.char.*.txt, '\n' = end of line) or "text" (your own files, below).
    c.format = "chars"
    # PTB folder holding ptb.*.txt; None/"" -> the cache $RHHJAX_CACHE/ptb (~/.cache/rhhjax/ptb).
    c.dir = None
    # Download simple-examples.tgz into the cache when the PTB files are not found.
    c.download = True
    # True: symbols of valid/test missing from the training vocabulary map to a reserved id;
    # False: they are an error.
    c.unk = False
    # format="text": one path (text_split="hutter") or "train,valid,test" paths ("files").
    c.text_files = ""
    # format="text": "hutter" (last N symbols test, previous N valid) or "files".
    c.text_split = "hutter"
    # format="text": "char" (UTF-8 code points) or "byte" vocabulary.
    c.text_vocab = "char"
    # format="text", text_split="hutter": N, symbols in each of valid and test.
    c.hutter_holdout = DEFAULT_HUTTER_HOLDOUT
    return c


def _cfg_get(cfg: Any, key: str, default: Any) -> Any:
    if isinstance(cfg, Mapping):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


def _cfg_bool(cfg: Any, key: str, default: bool) -> bool:
    value = _cfg_get(cfg, key, default)
    if not isinstance(value, (bool, np.bool_)):
        raise DataError(f"data config {key} must be a bool, got {value!r}")
    return bool(value)


def load_corpus(cfg: Any) -> Corpus:
    """Corpus described by a data config (``default_data_config()``, any attribute object or
    mapping; missing fields take the defaults)."""
    fmt = _cfg_get(cfg, "format", "chars")
    if fmt not in FORMATS:
        raise DataError(f"data config format must be one of {FORMATS}, got {fmt!r}")
    unk = _cfg_bool(cfg, "unk", False)
    if fmt in PTB_FILES:
        folder = _cfg_get(cfg, "dir", None)
        if folder is not None and not isinstance(folder, (str, os.PathLike)):
            raise DataError(f"data config dir must be a path or None, got {folder!r}")
        return load_ptb(fmt, folder, _cfg_bool(cfg, "download", True), unk)
    files = _cfg_get(cfg, "text_files", "")
    if not files or not _split_paths(files):
        raise DataError("data config format='text' needs text_files (one path or train,valid,test)")
    return load_text_corpus(
        files,
        split=_cfg_get(cfg, "text_split", "hutter"),
        vocab=_cfg_get(cfg, "text_vocab", "char"),
        unk=unk,
        holdout=_cfg_get(cfg, "hutter_holdout", DEFAULT_HUTTER_HOLDOUT),
    )


# --------------------------------------------------------------------------------------------
# Training samplers
# --------------------------------------------------------------------------------------------


class TrainBatch(NamedTuple):
    inputs: np.ndarray  # int32 [B, T]
    targets: np.ndarray  # int32 [B, T]: inputs shifted by one
    reset: bool  # True -> zero the recurrent state before this batch
    step: int  # index of this batch since the start of training
    epoch: int  # step // batches_per_epoch


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise DataError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_tokens(tokens: Any) -> np.ndarray:
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
        raise DataError(
            f"tokens must be a 1-D integer array, got shape {tokens.shape} {tokens.dtype}"
        )
    return tokens


def _rng(seed: int, index: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence((seed, index))))


class _Sampler:
    _kind = ""

    tokens: np.ndarray
    batch_size: int
    seq_len: int
    seed: int
    step: int
    batches_per_epoch: int

    def batch_at(self, step: int) -> TrainBatch:
        raise NotImplementedError

    @property
    def epoch(self) -> int:
        """Epoch of the next batch."""
        return self.step // self.batches_per_epoch

    def __iter__(self) -> Iterator[TrainBatch]:
        return self

    def __next__(self) -> TrainBatch:
        batch = self.batch_at(self.step)
        self.step += 1
        return batch

    def _state_extra(self) -> dict:
        return {}

    def state(self) -> dict:
        """JSON-able state; ``restore`` of it continues exactly where this sampler is."""
        return {
            "sampler": self._kind,
            "seed": self.seed,
            "step": self.step,
            "n_tokens": int(len(self.tokens)),
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            **self._state_extra(),
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state()`` of a sampler over the same tokens and shapes."""
        mine = self.state()
        for key in mine:
            if key not in state:
                raise DataError(f"sampler state lacks {key!r}: not from {type(self).__name__}")
        for key in mine:
            if key not in ("seed", "step") and state[key] != mine[key]:
                raise DataError(
                    f"sampler state does not match this sampler: {key}={state[key]!r} in the "
                    f"state, {mine[key]!r} here"
                )
        self.seed = _check_int("seed", state["seed"], 0)
        self.step = _check_int("step", state["step"], 0)


class WindowSampler(_Sampler):
    """The paper's sampler: each batch holds ``batch_size`` windows of ``seq_len + 1`` symbols
    at uniformly random positions; inputs = window[:-1], targets = window[1:].

    Stateless (``reset`` is True on every batch). Batch ``step`` depends only on
    ``(seed, step)`` (PCG64 seeded with SeedSequence((seed, step))), so resuming is exact.
    ``batches_per_epoch = len(tokens) // (batch_size * seq_len)`` (at least 1).
    """

    _kind = "window"

    def __init__(self, tokens, batch_size: int, seq_len: int = 100, seed: int = 0, step: int = 0):
        self.tokens = _check_tokens(tokens)
        self.batch_size = _check_int("batch_size", batch_size, 1)
        self.seq_len = _check_int("seq_len", seq_len, 1)
        self.seed = _check_int("seed", seed, 0)
        self.step = _check_int("step", step, 0)
        n = len(self.tokens)
        if n < self.seq_len + 1:
            raise DataError(f"{n} tokens are fewer than one window of seq_len + 1 = {seq_len + 1}")
        self.batches_per_epoch = max(1, n // (self.batch_size * self.seq_len))
        self._offsets = np.arange(self.seq_len + 1)

    def batch_at(self, step: int) -> TrainBatch:
        step = _check_int("step", step, 0)
        n = len(self.tokens)
        starts = _rng(self.seed, step).integers(0, n - self.seq_len, size=self.batch_size)
        windows = self.tokens[starts[:, None] + self._offsets].astype(np.int32)
        return TrainBatch(
            windows[:, :-1], windows[:, 1:], True, step, step // self.batches_per_epoch
        )


class StreamSampler(_Sampler):
    """Contiguous truncated-BPTT stream (Zilly et al.): the tokens are cut into ``batch_size``
    contiguous rows of ``row_len = batches_per_epoch * seq_len`` targets; batch ``c`` of an
    epoch holds symbols ``c*seq_len .. (c+1)*seq_len`` of every row, so batch ``c+1`` continues
    batch ``c`` row by row and the model carries its state across batches. ``reset`` is True on
    the first batch of every epoch (pass over the data).

    With ``random_offset`` (default) every epoch starts the rows at an offset in
    ``[0, seq_len)`` drawn from ``(seed, epoch)``, so truncation points differ between epochs;
    ``batches_per_epoch = (len(tokens) - 1 - (seq_len - 1)) // (batch_size * seq_len)``
    (without the ``seq_len - 1`` when ``random_offset`` is False). The tail that does not fill
    a whole batch is not used in that epoch.
    """

    _kind = "stream"

    def __init__(
        self,
        tokens,
        batch_size: int,
        seq_len: int,
        seed: int = 0,
        random_offset: bool = True,
        step: int = 0,
    ):
        self.tokens = _check_tokens(tokens)
        self.batch_size = _check_int("batch_size", batch_size, 1)
        self.seq_len = _check_int("seq_len", seq_len, 1)
        self.seed = _check_int("seed", seed, 0)
        self.step = _check_int("step", step, 0)
        self.random_offset = bool(random_offset)
        self.max_offset = self.seq_len - 1 if self.random_offset else 0
        n = len(self.tokens)
        self.batches_per_epoch = (n - 1 - self.max_offset) // (self.batch_size * self.seq_len)
        if self.batches_per_epoch < 1:
            raise DataError(
                f"{n} tokens are too few for one stream batch of {self.batch_size} rows x "
                f"{self.seq_len} steps"
            )
        self.row_len = self.batches_per_epoch * self.seq_len
        self._rows = np.arange(self.batch_size) * self.row_len
        self._offsets = np.arange(self.seq_len + 1)

    def _state_extra(self) -> dict:
        return {"random_offset": self.random_offset}

    def epoch_offset(self, epoch: int) -> int:
        """Start of row 0 in ``epoch``."""
        if not self.random_offset:
            return 0
        return int(_rng(self.seed, _check_int("epoch", epoch, 0)).integers(0, self.max_offset + 1))

    def batch_at(self, step: int) -> TrainBatch:
        step = _check_int("step", step, 0)
        epoch, chunk = divmod(step, self.batches_per_epoch)
        base = self.epoch_offset(epoch) + self._rows + chunk * self.seq_len
        window = self.tokens[base[:, None] + self._offsets].astype(np.int32)
        return TrainBatch(window[:, :-1], window[:, 1:], chunk == 0, step, epoch)


# --------------------------------------------------------------------------------------------
# Evaluation batches
# --------------------------------------------------------------------------------------------


class EvalBatch(NamedTuple):
    inputs: np.ndarray  # int32 [B, T]
    targets: np.ndarray  # int32 [B, T]
    mask: np.ndarray  # float32 [B, T], 1 = scored
    reset: bool  # True -> zero the recurrent state before this batch


def _check_protocol(
    n_tokens: int, protocol: str, seq_len: int, min_context: int, paper_mask: int
) -> None:
    if protocol not in EVAL_PROTOCOLS:
        raise DataError(f"eval protocol must be one of {EVAL_PROTOCOLS}, got {protocol!r}")
    _check_int("number of tokens", n_tokens, 0)
    if protocol == "paper":
        _check_int("paper_mask", paper_mask, 0)
        if paper_mask >= PAPER_SEQ_LEN:
            raise DataError(f"paper_mask must be < {PAPER_SEQ_LEN}, got {paper_mask}")
        return
    _check_int("seq_len", seq_len, 1)
    if protocol == "windows":
        _check_int("min_context", min_context, 0)
        if min_context >= seq_len:
            raise DataError(f"min_context ({min_context}) must be < seq_len ({seq_len})")


def _paper_rows(n_tokens: int) -> int:
    if n_tokens < PAPER_SEQ_LEN + 1:
        return 0
    return (n_tokens - PAPER_SEQ_LEN - 1) // PAPER_CHUNK + 1


def _n_windows(n_tokens: int, seq_len: int, min_context: int) -> int:
    if n_tokens - 1 <= seq_len:
        return 1
    return 1 + -(-(n_tokens - 1 - seq_len) // (seq_len - min_context))


def scored_count(
    n_tokens: int,
    protocol: str,
    *,
    seq_len: int = 100,
    min_context: int = 50,
    paper_mask: int = 50,
) -> int:
    """Number of symbols ``eval_batches`` scores (the sum of its masks).

    ``windows`` / ``stream``: ``n_tokens - 1`` (all but the first symbol).
    ``paper``: ``rows * (100 - paper_mask)`` with ``rows = (n_tokens - 101) // 51 + 1`` (0 when
    ``n_tokens < 101``).
    """
    _check_protocol(n_tokens, protocol, seq_len, min_context, paper_mask)
    if protocol == "paper":
        return _paper_rows(n_tokens) * (PAPER_SEQ_LEN - paper_mask)
    return max(n_tokens - 1, 0)


def num_eval_batches(
    n_tokens: int,
    protocol: str,
    batch_size: int,
    seq_len: int = 100,
    min_context: int = 50,
) -> int:
    """Number of batches ``eval_batches`` yields."""
    _check_protocol(n_tokens, protocol, seq_len, min_context, 50)
    batch_size = _check_int("batch_size", batch_size, 1)
    if protocol == "paper":
        return -(-_paper_rows(n_tokens) // batch_size)
    if n_tokens < 2:
        return 0
    if protocol == "windows":
        return -(-_n_windows(n_tokens, seq_len, min_context) // batch_size)
    row_len = -(-(n_tokens - 1) // batch_size)
    return -(-row_len // seq_len)


def _batch(
    tokens: np.ndarray, pos: np.ndarray, valid: np.ndarray, scored: np.ndarray, reset: bool
) -> EvalBatch:
    """Inputs at ``pos``, targets at ``pos + 1``; invalid entries are 0, mask = scored."""
    n = len(tokens)
    inputs = np.where(valid, tokens[np.clip(pos, 0, n - 1)], 0).astype(np.int32)
    targets = np.where(valid, tokens[np.clip(pos + 1, 0, n - 1)], 0).astype(np.int32)
    return EvalBatch(inputs, targets, (scored & valid).astype(np.float32), bool(reset))


def eval_batches(
    tokens,
    protocol: str,
    batch_size: int,
    seq_len: int,
    min_context: int = 50,
    paper_mask: int = 50,
) -> Iterator[EvalBatch]:
    """Evaluation batches of a split; every batch has shape ``[batch_size, T]``.

    Symbol ``j`` of the split is a *target* predicted from symbols ``0 .. j-1``; symbol 0 is
    never a target (nothing predicts it).

    ``windows`` (honest, stateless, ``reset`` True on every batch): windows of ``seq_len``
    inputs starting at ``k * (seq_len - min_context)``. Window 0 scores all its targets
    ``1 .. seq_len``; window ``k > 0`` scores only positions ``t >= min_context`` (targets with at
    least ``min_context + 1`` symbols of context inside the window), i.e. exactly the targets the
    previous window did not reach. Excluded: only symbol 0. Each of ``1 .. N-1`` is scored once.

    ``stream`` (honest, stateful): the split is cut into ``batch_size`` contiguous rows; row ``r``
    predicts targets ``r*L + 1 .. (r+1)*L`` (``L = ceil((N-1)/batch_size)``) from inputs
    ``r*L .. (r+1)*L - 1`` (rows overlap by one symbol), in chunks of ``seq_len`` with the state
    carried; ``reset`` only on the first batch. Excluded: only symbol 0; each of ``1 .. N-1`` is
    scored once. Row ``r > 0`` starts from a zero state, so its first targets see only the row's
    own history: ``batch_size=1`` gives every symbol its full history.

    ``paper`` (the RHHN paper's protocol, NOT every symbol once; ``reset`` on every batch):
    row ``i`` is ``text[51*i : 51*i + 101]`` (chunk ``i`` and the first 50 symbols of chunk
    ``i+1``), inputs ``row[:100]``, targets ``row[1:]``; only target positions
    ``>= paper_mask`` are scored. Rows exist only where all 101 symbols do. Excluded: with
    ``paper_mask=50`` (the paper's validation) symbols ``0 .. 50``, the last symbol of every
    51-symbol chunk and the tail after the last full row; with ``paper_mask=95`` (the paper's
    test, run on the same batches) all but 5 of every 51 symbols. ``seq_len`` and
    ``min_context`` are ignored (T is 100).

    Padding (the last batch of ``windows`` / ``paper``, the ends of ``stream`` rows) is zeros
    with mask 0. ``scored_count`` gives the sum of all masks.
    """
    tokens = _check_tokens(tokens)
    batch_size = _check_int("batch_size", batch_size, 1)
    n = len(tokens)
    _check_protocol(n, protocol, seq_len, min_context, paper_mask)
    if protocol == "paper":
        if _paper_rows(n) == 0:
            raise DataError(
                f"the paper protocol needs at least {PAPER_SEQ_LEN + 1} tokens, got {n}"
            )
        return _paper_batches(tokens, batch_size, paper_mask)
    if n < 2:
        raise DataError(f"evaluation needs at least 2 tokens (one target), got {n}")
    if protocol == "windows":
        return _window_batches(tokens, batch_size, seq_len, min_context)
    return _stream_batches(tokens, batch_size, seq_len)


def _window_batches(
    tokens: np.ndarray, batch_size: int, seq_len: int, min_context: int
) -> Iterator[EvalBatch]:
    n = len(tokens)
    n_windows = _n_windows(n, seq_len, min_context)
    stride = seq_len - min_context
    t = np.arange(seq_len)
    for first in range(0, n_windows, batch_size):
        k = np.arange(first, first + batch_size)
        pos = (k * stride)[:, None] + t
        valid = (k < n_windows)[:, None] & (pos + 1 <= n - 1)
        scored = (t >= min_context)[None, :] | (k == 0)[:, None]
        yield _batch(tokens, pos, valid, scored, True)


def _stream_batches(tokens: np.ndarray, batch_size: int, seq_len: int) -> Iterator[EvalBatch]:
    n = len(tokens)
    row_len = -(-(n - 1) // batch_size)
    rows = np.arange(batch_size)[:, None] * row_len
    for c in range(-(-row_len // seq_len)):
        offset = c * seq_len + np.arange(seq_len)[None, :]
        pos = rows + offset
        valid = (offset < row_len) & (pos + 1 <= n - 1)
        yield _batch(tokens, pos, valid, valid, c == 0)


def _paper_batches(tokens: np.ndarray, batch_size: int, paper_mask: int) -> Iterator[EvalBatch]:
    n_rows = _paper_rows(len(tokens))
    t = np.arange(PAPER_SEQ_LEN)
    for first in range(0, n_rows, batch_size):
        i = np.arange(first, first + batch_size)
        pos = (i * PAPER_CHUNK)[:, None] + t
        valid = np.broadcast_to((i < n_rows)[:, None], pos.shape)
        scored = np.broadcast_to((t >= paper_mask)[None, :], pos.shape)
        yield _batch(tokens, pos, valid, scored, True)
