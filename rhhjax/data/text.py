"""Text-file corpora: the user's own UTF-8 / byte files (``load_text_corpus``) and enwik8 / text8
(``ensure_corpus``: from the cache, or downloaded and SHA256-checked); docs/operations.md#data."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import tempfile
import zipfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from rhhjax.data import cache as cache_lib
from rhhjax.data.corpus import SPLITS, Corpus, corpus_from_codes
from rhhjax.data.errors import DataError
from rhhjax.data.vocab import TEXT_VOCABS, codepoints, decode_utf8

TEXT_SPLITS = ("files", "hutter")
HUTTER_HOLDOUT = 5_000_000  # the Hutter Prize convention: 90M / 5M / 5M of enwik8 and text8
DEFAULT_HUTTER_HOLDOUT = 0
AUTO_HOLDOUT_FRACTION = (
    0.05  # auto: valid and test each hold 5% of the file, at least AUTO_HOLDOUT_FLOOR symbols
)
AUTO_HOLDOUT_FLOOR = 1_000


def check_text_split(split: Any) -> str:
    if split not in TEXT_SPLITS:
        raise DataError(f"text_split must be one of {TEXT_SPLITS}, got {split!r}")
    return split


def check_text_vocab(vocab: Any) -> str:
    if vocab not in TEXT_VOCABS:
        raise DataError(f"text_vocab must be one of {TEXT_VOCABS}, got {vocab!r}")
    return vocab


def check_holdout(holdout: Any) -> int:
    """``holdout`` as an int >= 0 (0 = automatic), else DataError."""
    if isinstance(holdout, bool) or not isinstance(holdout, (int, np.integer)) or holdout < 0:
        raise DataError(
            f"hutter_holdout must be an integer >= 0 (0: sized to the file), got {holdout!r}"
        )
    return int(holdout)


def auto_holdout(n_symbols: int) -> int:
    """Symbols of valid and of test each for a file of ``n_symbols``: 5%, at least 1,000."""
    floor = min(AUTO_HOLDOUT_FLOOR, n_symbols // 4)
    return max(round(AUTO_HOLDOUT_FRACTION * n_symbols), floor)


def split_paths(files: str | os.PathLike | Sequence[str | os.PathLike]) -> list[pathlib.Path]:
    if isinstance(files, (str, os.PathLike)):
        items = [p.strip() for p in os.fspath(files).split(",")]
    else:
        items = [os.fspath(p).strip() for p in files]
    return [pathlib.Path(p).expanduser() for p in items if p]


def _read_codes(path: pathlib.Path, vocab: str) -> np.ndarray:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DataError(f"cannot read text file {path}: {e}") from e
    if not data:
        raise DataError(f"text file {path} is empty: data.text_files needs a file of text")
    if vocab == "byte":
        return np.frombuffer(data, dtype=np.uint8)
    return codepoints(decode_utf8(data, str(path)))


def load_text_corpus(
    files: str | os.PathLike | Sequence[str | os.PathLike],
    split: str = "hutter",
    vocab: str = "char",
    unk: bool = False,
    holdout: int = DEFAULT_HUTTER_HOLDOUT,
) -> Corpus:
    """The user's own text: one file (``split="hutter"``: the last ``holdout`` symbols test,
    the ``holdout`` before valid) or train,valid,test (``"files"``); ``unk``: train's symbols."""
    check_text_split(split)
    check_text_vocab(vocab)
    paths = split_paths(files)
    unit = "character" if vocab == "char" else "byte"
    if split == "hutter":
        if len(paths) != 1:
            raise DataError(
                f"text_split='hutter' needs exactly one file in text_files, got {len(paths)}"
            )
        holdout = check_holdout(holdout)
        codes = _read_codes(paths[0], vocab)
        n = len(codes)
        holdout = holdout or auto_holdout(n)
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
    # without unk every symbol gets an id; with unk, train's only, the others -> <unk>
    vocab_splits = ("train",) if unk else SPLITS
    name = f"text_{vocab}:{paths[0].name}"
    return corpus_from_codes(name, vocab, parts, unk, source=source, vocab_splits=vocab_splits)


@dataclasses.dataclass(frozen=True)
class CorpusSource:
    url: str
    sha256: str
    member: str
    size: int


CORPORA: dict[str, CorpusSource] = {
    "enwik8": CorpusSource(
        url="http://mattmahoney.net/dc/enwik8.zip",
        sha256="547994d9980ebed1288380d652999f38a14fe291a6247c157c3d33d4932534bc",
        member="enwik8",
        size=100_000_000,
    ),
    "text8": CorpusSource(
        url="http://mattmahoney.net/dc/text8.zip",
        sha256="a6640522afe85d1963ad56c05b0ede0a0c000dddc9671758a6cc09b7a38e5232",
        member="text8",
        size=100_000_000,
    ),
}


def corpus_path(name: str, cache: str | os.PathLike | None = None) -> pathlib.Path:
    source = _source(name)
    folder = pathlib.Path(cache).expanduser() if cache else cache_lib.cache_root() / name
    return folder / source.member


def _source(name: str) -> CorpusSource:
    if name not in CORPORA:
        raise DataError(f"unknown corpus {name!r}: expected one of {', '.join(CORPORA)}")
    return CORPORA[name]


def ensure_corpus(
    name: str,
    *,
    download: bool = True,
    url: str = "",
    sha256: str = "",
    cache: str | os.PathLike | None = None,
) -> pathlib.Path:
    """Path of the unzipped corpus ``name`` ("enwik8" | "text8"), downloaded when missing
    and allowed (``url`` / ``sha256``: a mirror); DataError (one line) otherwise."""
    source = _source(name)
    path = corpus_path(name, cache)
    url = url or source.url
    expected = (sha256 or source.sha256).lower()
    if path.is_file():
        size = path.stat().st_size
        if size != source.size:
            raise DataError(
                f"{path} has {size:,} bytes, expected {source.size:,} for {name}; delete it and "
                f"run again to download {url}"
            )
        return path
    hint = (
        f"download {url}, unzip it and put {source.member} in {path.parent} "
        f"(or set --config.data.text_files=PATH)"
    )
    if not download:
        raise DataError(f"{name} not found at {path} and data.download=False: {hint}")

    def offline(e: Exception):
        reason = " ".join(f"{type(e).__name__}: {e}".split())
        raise DataError(
            f"{name} not found at {path} and the download failed ({reason}): {hint}"
        ) from None

    folder = path.parent
    with cache_lib.download(url, folder, name, ".zip.part", offline, "cache folder") as tmp_zip:
        got = cache_lib.sha256_file(tmp_zip)
        if got != expected:
            raise DataError(
                f"SHA256 mismatch for {url}: expected {expected}, got {got}; the download is "
                f"corrupt or not the expected archive (pass --config.data.sha256=... only if you "
                f"trust this file)"
            )
        _extract(tmp_zip, source, path, url)
    return path


def _extract(archive: pathlib.Path, source: CorpusSource, path: pathlib.Path, url: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{source.member}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                with zipfile.ZipFile(archive) as z, z.open(source.member) as member:
                    shutil.copyfileobj(member, out, length=1 << 20)
            except (zipfile.BadZipFile, KeyError, OSError) as e:
                raise DataError(f"{url} is not a zip archive holding {source.member!r}: {e}") from e
            out.flush()
            os.fsync(out.fileno())
        size = os.path.getsize(tmp)
        if size != source.size:
            raise DataError(
                f"{source.member} in {url} has {size:,} bytes, expected {source.size:,}"
            )
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        pathlib.Path(tmp).unlink(missing_ok=True)
