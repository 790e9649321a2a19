"""enwik8 / text8: find them in the cache, or download, verify (SHA256) and unzip them there.

The RHN paper's character-level corpora are single 100,000,000-byte files inside a zip:

    enwik8  http://mattmahoney.net/dc/enwik8.zip  (Hutter Prize; 205 byte values)
    text8   http://mattmahoney.net/dc/text8.zip   (27 symbols: a-z and space)

``ensure_corpus(name)`` returns the path of the unzipped file in the cache
(``$RHHJAX_CACHE/<name>/<name>``, default ``~/.cache/rhhjax``). When it is missing, the zip is
downloaded to a temporary file, its SHA256 is checked against ``CORPORA`` (or the
``data.sha256`` override), the member is extracted to a temporary file and renamed into place,
so the cache never holds a half-written file. Without network, or with ``data.download=False``,
the error says what to download and where to put it.

The embedded hashes are the widely published ones (the same values appear in many independent
public download scripts); the zip sizes are 36,445,475 B (enwik8) and 31,344,016 B (text8).

``load_corpus(data_config)`` is ``rhhjax.data.load_corpus`` after this resolution: a config with
``format="text"``, an empty ``text_files`` and ``corpus="enwik8"`` / ``"text8"`` reads the cached
file (downloading it first if needed).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import tempfile
import urllib.request
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rhhjax import data as data_lib

DataError = data_lib.DataError


@dataclasses.dataclass(frozen=True)
class CorpusSource:
    """Where a corpus comes from and what it must look like."""

    url: str  # the zip archive
    sha256: str  # SHA256 of the zip archive
    member: str  # the file inside the zip (and its name in the cache)
    size: int  # bytes of the unzipped member


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


def cache_root() -> Path:
    """``$RHHJAX_CACHE`` (default ``~/.cache/rhhjax``)."""
    root = os.environ.get("RHHJAX_CACHE") or os.path.join("~", ".cache", "rhhjax")
    return Path(root).expanduser()


def corpus_path(name: str, cache: str | os.PathLike | None = None) -> Path:
    """Where the unzipped corpus ``name`` lives in the cache."""
    source = _source(name)
    folder = Path(cache).expanduser() if cache else cache_root() / name
    return folder / source.member


def _source(name: str) -> CorpusSource:
    if name not in CORPORA:
        raise DataError(f"unknown corpus {name!r}: expected one of {', '.join(CORPORA)}")
    return CORPORA[name]


def _fetch(url: str, dest: Path) -> None:
    """Download ``url`` to ``dest``: the only function here that touches the network."""
    with urllib.request.urlopen(url, timeout=60) as response, open(dest, "wb") as f:
        shutil.copyfileobj(response, f, length=1 << 20)


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def ensure_corpus(
    name: str,
    *,
    download: bool = True,
    url: str = "",
    sha256: str = "",
    cache: str | os.PathLike | None = None,
) -> Path:
    """Path of the unzipped corpus ``name`` ("enwik8" | "text8"), downloading it if needed.

    Args:
      name: a key of ``CORPORA``.
      download: fetch the zip when the file is not in the cache (else: error).
      url: another address for the zip (a mirror); "" = the official one.
      sha256: expected SHA256 of the zip instead of the embedded one (for a mirror that
        serves a different archive of the same file).
      cache: folder for the file; None = ``$RHHJAX_CACHE/<name>``.
    Raises:
      DataError (one line): offline / download disabled, hash mismatch, bad archive.
    """
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
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_zip = tempfile.mkstemp(prefix=f".{name}.", suffix=".zip.part", dir=path.parent)
        os.close(fd)
    except OSError as e:
        raise DataError(f"cannot write to the cache folder {path.parent}: {e}") from e
    tmp_zip = Path(tmp_zip)
    try:
        try:
            _fetch(url, tmp_zip)
        except Exception as e:  # any failure to fetch means "offline"
            reason = " ".join(f"{type(e).__name__}: {e}".split())
            raise DataError(
                f"{name} not found at {path} and the download failed ({reason}): {hint}"
            ) from None
        got = _file_sha256(tmp_zip)
        if got != expected:
            raise DataError(
                f"SHA256 mismatch for {url}: expected {expected}, got {got}; the download is "
                f"corrupt or not the expected archive (pass --config.data.sha256=... only if you "
                f"trust this file)"
            )
        _extract(tmp_zip, source, path, url)
    finally:
        tmp_zip.unlink(missing_ok=True)
    return path


def _extract(archive: Path, source: CorpusSource, path: Path, url: str) -> None:
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
        Path(tmp).unlink(missing_ok=True)


def _get(cfg: Any, key: str, default: Any) -> Any:
    if isinstance(cfg, Mapping):
        return cfg.get(key, default)
    return getattr(cfg, key, default) if hasattr(cfg, key) else default


def resolve_data_config(cfg: Any) -> dict:
    """The data config as a dict, with ``text_files`` filled in for a known ``corpus``.

    Only ``format="text"`` with an empty ``text_files`` and ``corpus`` in ``CORPORA`` is
    resolved (downloading when needed); everything else is returned unchanged.
    """
    items = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
    corpus = items.get("corpus") or ""
    if items.get("format") == "text" and not items.get("text_files") and corpus:
        path = ensure_corpus(
            corpus,
            download=bool(items.get("download", True)),
            url=items.get("url") or "",
            sha256=items.get("sha256") or "",
        )
        items["text_files"] = str(path)
    return items


def load_corpus(cfg: Any) -> data_lib.Corpus:
    """``rhhjax.data.load_corpus`` of ``resolve_data_config(cfg)``."""
    return data_lib.load_corpus(resolve_data_config(cfg))
