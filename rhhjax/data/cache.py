"""The download cache: where it lives, the one network call, hashing and atomic writes.

The cache is ``$RHHJAX_CACHE`` (default ``~/.cache/rhhjax``): PTB in ``ptb/``, enwik8 / text8 in
``<name>/``. Files are written to a temporary file beside their final name and renamed, so the
cache never holds a half-written file. ``fetch`` is the only function of ``rhhjax.data`` that
touches the network (tests replace it).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import shutil
import tempfile
import urllib.request
from collections.abc import Callable, Iterator

from rhhjax.data.errors import DataError


def cache_root() -> pathlib.Path:
    """``$RHHJAX_CACHE`` (default ``~/.cache/rhhjax``)."""
    root = os.environ.get("RHHJAX_CACHE") or os.path.join("~", ".cache", "rhhjax")
    return pathlib.Path(root).expanduser()


def fetch(url: str, dest: pathlib.Path) -> None:
    """Download ``url`` to ``dest``: the only function that touches the network."""
    with urllib.request.urlopen(url, timeout=60) as response, open(dest, "wb") as f:
        shutil.copyfileobj(response, f, length=1 << 20)


@contextlib.contextmanager
def download(
    url: str,
    folder: pathlib.Path,
    stem: str,
    suffix: str,
    offline: Callable[[Exception], None],
    what: str,
) -> Iterator[pathlib.Path]:
    """``url`` fetched into a temporary ``.{stem}.*{suffix}`` in ``folder`` (created), deleted
    afterwards. ``offline(error)`` raises when the fetch fails; ``what`` names the folder."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{stem}.", suffix=suffix, dir=folder)
        os.close(fd)
    except OSError as e:
        raise DataError(f"cannot write to the {what} {folder}: {e}") from e
    tmp = pathlib.Path(name)
    try:
        try:
            fetch(url, tmp)
        except Exception as e:  # any failure to fetch means "offline"
            offline(e)
            raise
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)


def sha256_bytes(data: bytes) -> str:
    """Hex SHA256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: pathlib.Path) -> str:
    """Hex SHA256 of the file at ``path``, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def atomic_write(path: pathlib.Path, data: bytes) -> None:
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
