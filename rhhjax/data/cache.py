"""The download cache ``$RHHJAX_CACHE`` (default ``~/.cache/rhhjax``): the one network call
(``fetch``, replaced by the tests), hashing and atomic writes."""

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
    root = os.environ.get("RHHJAX_CACHE") or os.path.join("~", ".cache", "rhhjax")
    return pathlib.Path(root).expanduser()


def fetch(url: str, dest: pathlib.Path) -> None:
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
    """``url`` fetched into a temporary file in ``folder``, deleted afterwards."""
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
        except Exception as e:
            offline(e)
            raise
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: pathlib.Path) -> str:
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
