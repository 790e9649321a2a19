"""Penn Treebank: locate, download and SHA256-verify the files, parse both formats (``chars``,
``mikolov_char``). Details: docs/operations.md#data."""

from __future__ import annotations

import os
import pathlib
import tarfile
from collections.abc import Sequence

from rhhjax.data import cache as cache_lib
from rhhjax.data.corpus import SPLITS, Corpus, corpus_from_codes
from rhhjax.data.errors import DataError
from rhhjax.data.vocab import codepoints, decode_utf8

PTB_URL = "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz"
PTB_ARCHIVE_DIR = "simple-examples/data"

# SHA256 of Mikolov's simple-examples/data files
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

MIKOLOV_EOL = "\n"  # end-of-line symbol of the mikolov_char format


def ptb_cache_dir() -> pathlib.Path:
    return cache_lib.cache_root() / "ptb"


def _verify(name: str, data: bytes, where: str) -> None:
    got = cache_lib.sha256_bytes(data)
    if got != PTB_SHA256[name]:
        raise DataError(
            f"SHA256 mismatch for {name} in {where}: expected {PTB_SHA256[name]}, got {got}; "
            f"the file is corrupt or not Mikolov's PTB (delete it and download again)"
        )


def _read_verified(folder: pathlib.Path, names: Sequence[str]) -> dict[str, bytes]:
    """Read each file once and check the SHA256 of the very bytes used."""
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


def _offline_error(
    names: Sequence[str], cache: pathlib.Path, reason: str, explicit: pathlib.Path | None
) -> DataError:
    extra = f"; {explicit} does not hold them all" if explicit is not None else ""
    return DataError(
        f"PTB files not found and not downloaded ({reason}): download {PTB_URL}, take "
        f"{', '.join(names)} from {PTB_ARCHIVE_DIR}/ in the archive and put them in {cache} "
        f"(or give a folder that holds them: --config.data.dir=FOLDER){extra}"
    )


def _extract_ptb(archive: pathlib.Path, names: Sequence[str]) -> dict[str, bytes]:
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
    names = tuple(PTB_SHA256)

    def offline(e: Exception):
        raise _offline_error(needed, cache, f"{type(e).__name__}: {e}", explicit) from e

    folder = "PTB cache folder"
    with cache_lib.download(PTB_URL, cache, "simple-examples", ".tgz.part", offline, folder) as tmp:
        files = _extract_ptb(tmp, names)
    for name in names:
        try:
            cache_lib.atomic_write(cache / name, files[name])
        except OSError as e:
            raise DataError(f"cannot write {cache / name}: {e}") from e


def _locate_ptb(
    dir: str | os.PathLike | None, download: bool, names: Sequence[str]
) -> tuple[pathlib.Path, dict[str, bytes]]:
    names = tuple(names)
    unknown = [n for n in names if n not in PTB_SHA256]
    if unknown:
        raise DataError(f"unknown PTB file(s) {unknown}: expected some of {list(PTB_SHA256)}")
    explicit = pathlib.Path(dir).expanduser() if dir not in (None, "") else None
    cache = ptb_cache_dir()
    if explicit is not None:
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
    """Folder of verified PTB files: ``dir``, else the cache, else a download into the
    cache when ``download``, else a DataError naming what to put where."""
    folder, _ = _locate_ptb(dir, download, files if files is not None else tuple(PTB_SHA256))
    return folder


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
    if format not in PTB_FILES:
        raise DataError(f"PTB format must be one of {tuple(PTB_FILES)}, got {format!r}")
    names = PTB_FILES[format]
    folder, raw = _locate_ptb(dir, download, [names[s] for s in SPLITS])
    codes = {}
    for s in SPLITS:
        text = decode_utf8(raw[names[s]], str(folder / names[s]))
        if format == "mikolov_char":
            text = _parse_mikolov(text, str(folder / names[s]))
        codes[s] = codepoints(text)
    return corpus_from_codes(f"ptb_{format}", "char", codes, unk, source=str(folder))
