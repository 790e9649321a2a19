"""Tests of rhhjax.data.ptb: both PTB formats, location, SHA256 verification, (simulated) download.

Real-PTB tests read the folder from $RHHJAX_PTB_DIR, else ../shared/data/ptb beside the repo, and
skip without it. Nothing here touches the network: ``cache.fetch`` is replaced in every test.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import urllib.error
from pathlib import Path

import numpy as np
import pytest

from rhhjax.data import DataError, eval_protocols, ptb
from rhhjax.data import cache as cache_lib
from rhhjax.data.corpus import SPLITS, Corpus
from rhhjax.data.vocab import Vocab

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
PTB_WORD_FILES = ("ptb.train.txt", "ptb.valid.txt", "ptb.test.txt")
ALL_PTB_FILES = tuple(ptb.PTB_SHA256)


def _ptb_dir() -> Path | None:
    env = os.environ.get("RHHJAX_PTB_DIR")
    if env:
        return Path(env)
    default = SHARED / "ptb"
    return default if default.is_dir() else None


pytestmark = pytest.mark.usefixtures("offline_cache")


@pytest.fixture(scope="module")
def ptb_dir() -> Path:
    folder = _ptb_dir()
    if folder is None or not all((folder / n).is_file() for n in ALL_PTB_FILES):
        pytest.skip("real PTB not found: set RHHJAX_PTB_DIR to a folder with ptb.*.txt")
    return folder


@pytest.fixture(scope="module")
def ptb_chars(ptb_dir) -> Corpus:
    return ptb.load_ptb("chars", ptb_dir, download=False)


@pytest.fixture(scope="module")
def ptb_mikolov(ptb_dir) -> Corpus:
    return ptb.load_ptb("mikolov_char", ptb_dir, download=False)


def _make_tgz(path: Path, files: dict[str, bytes], prefix="./simple-examples/data/") -> Path:
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        extra = {
            "./simple-examples/rnnlm-0.2b/README": b"not data",
            "../evil.txt": b"must never be written",
        }
        for name, blob in [*((prefix + n, b) for n, b in files.items()), *extra.items()]:
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return path


@pytest.fixture(scope="module")
def ptb_bytes(ptb_dir) -> dict[str, bytes]:
    return {n: (ptb_dir / n).read_bytes() for n in ALL_PTB_FILES}


@pytest.fixture(scope="module")
def fake_tgz(ptb_bytes, tmp_path_factory) -> Path:
    return _make_tgz(tmp_path_factory.mktemp("tgz") / "simple-examples.tgz", ptb_bytes)


@pytest.fixture(scope="module")
def tampered_tgz(ptb_bytes, tmp_path_factory) -> Path:
    files = dict(ptb_bytes)
    files["ptb.valid.txt"] = files["ptb.valid.txt"].replace(b" the ", b" teh ", 1)
    return _make_tgz(tmp_path_factory.mktemp("tgz") / "simple-examples.tgz", files)


def _serve(monkeypatch, archive: Path, calls: list):
    def fake_fetch(url, dest):
        calls.append(url)
        shutil.copyfile(archive, dest)

    monkeypatch.setattr(cache_lib, "fetch", fake_fetch)


# --------------------------------------------------------------------------------------------
# PTB corpora and vocabularies
# --------------------------------------------------------------------------------------------


def test_chars_vocab_is_the_papers_50_symbols(ptb_chars):
    vocab = ptb_chars.vocab
    assert vocab.size == 50 and vocab.kind == "char" and not vocab.unk
    assert {"\n", " ", "<", ">", "N"} <= set(vocab.symbols)
    assert list(vocab.symbols) == sorted(vocab.symbols)
    assert ptb_chars.train.dtype == np.uint8
    assert [len(ptb_chars.split(s)) for s in SPLITS] == [5_101_618, 399_782, 449_945]


def test_mikolov_char_vocab_is_49_symbols_plus_end_of_line(ptb_mikolov):
    vocab = ptb_mikolov.vocab
    assert vocab.size == 50
    assert ptb.MIKOLOV_EOL in vocab.symbols and "_" in vocab.symbols and " " not in vocab.symbols


def test_both_formats_encode_the_same_text(ptb_chars, ptb_mikolov):
    def word_chars(corpus, separators):
        ids = [corpus.vocab.symbols.index(s) for s in separators]
        return int(np.count_nonzero(~np.isin(corpus.train, ids)))

    assert word_chars(ptb_chars, " \n") == word_chars(ptb_mikolov, "_\n") == 4_129_961
    words = ptb_chars.vocab.decode(ptb_chars.valid).split("\n")
    chars = ptb_mikolov.vocab.decode(ptb_mikolov.valid).split("\n")
    assert len(words) == len(chars) == 3371
    assert ["_".join(line.split()) for line in words] == chars


def test_ptb_vocab_round_trips_through_json(ptb_chars):
    vocab = ptb_chars.vocab
    restored = Vocab.from_dict(json.loads(json.dumps(vocab.to_dict())))
    assert restored == vocab
    np.testing.assert_array_equal(restored.encode(vocab.decode(ptb_chars.test)), ptb_chars.test)


# --------------------------------------------------------------------------------------------
# PTB location, verification and (simulated) download
# --------------------------------------------------------------------------------------------


def test_explicit_dir_with_verified_files_is_used(ptb_dir):
    assert ptb.resolve_ptb_dir(ptb_dir, download=False) == ptb_dir


def test_checksum_mismatch_in_dir_is_an_error(tmp_path):
    for name in PTB_WORD_FILES:
        (tmp_path / name).write_text(" not the penn treebank \n")
    with pytest.raises(DataError) as err:
        ptb.load_ptb("chars", tmp_path, download=False)
    msg = str(err.value)
    assert "SHA256 mismatch" in msg and "ptb.train.txt" in msg and str(tmp_path) in msg


def test_checksum_mismatch_in_the_cache_is_an_error_not_a_silent_download(tmp_path):
    cache = tmp_path / "cache" / "ptb"
    cache.mkdir(parents=True)
    for name in PTB_WORD_FILES:
        (cache / name).write_bytes(b"tampered")
    with pytest.raises(DataError, match="SHA256 mismatch for ptb.train.txt"):
        ptb.resolve_ptb_dir(None, download=True, files=PTB_WORD_FILES)  # cache.fetch would fail


def test_offline_error_names_url_files_and_folder(tmp_path, monkeypatch):
    def offline(url, dest):
        raise urllib.error.URLError("no route to host")

    monkeypatch.setattr(cache_lib, "fetch", offline)
    cache = tmp_path / "cache" / "ptb"
    for download in (True, False):
        with pytest.raises(DataError) as err:
            ptb.load_ptb("chars", None, download=download)
        msg = str(err.value)
        assert ptb.PTB_URL in msg and str(cache) in msg and "\n" not in msg
        assert all(name in msg for name in PTB_WORD_FILES)
        assert "--config.data.dir=FOLDER" in msg and "data config's dir" not in msg
        assert not cache.exists() or list(cache.iterdir()) == []  # no temp file left behind


def test_simulated_download_writes_verified_files_into_the_cache(
    tmp_path, monkeypatch, fake_tgz, ptb_bytes
):
    calls: list[str] = []
    _serve(monkeypatch, fake_tgz, calls)
    folder = ptb.resolve_ptb_dir(None, download=True)
    cache = tmp_path / "cache" / "ptb"
    assert folder == cache and calls == [ptb.PTB_URL]
    assert sorted(p.name for p in cache.iterdir()) == sorted(ALL_PTB_FILES)  # no temp files
    assert all((cache / n).read_bytes() == ptb_bytes[n] for n in ALL_PTB_FILES)
    assert not (tmp_path / "cache" / "evil.txt").exists() and not (tmp_path / "evil.txt").exists()
    # the cache is used from now on (no second download)
    corpus = ptb.load_ptb("chars", None, download=True)
    assert calls == [ptb.PTB_URL] and corpus.vocab.size == 50
    assert corpus.source == str(cache)


def test_explicit_dir_that_is_wrong_is_an_error_not_the_cache(
    tmp_path, monkeypatch, fake_tgz, ptb_bytes
):
    """An explicit data dir is used or refused: never silently replaced by the cache."""
    _serve(monkeypatch, fake_tgz, [])
    ptb.resolve_ptb_dir(None, download=True)  # the cache holds every file
    with pytest.raises(DataError, match="is not a folder") as err:
        ptb.load_ptb("chars", tmp_path / "missing", download=True)
    assert str(tmp_path / "missing") in str(err.value) and "\n" not in str(err.value)
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "ptb.train.txt").write_bytes(ptb_bytes["ptb.train.txt"])
    with pytest.raises(DataError, match="lacks ptb.valid.txt, ptb.test.txt"):
        ptb.load_ptb("chars", partial, download=True)
    for name in ("ptb.valid.txt", "ptb.test.txt"):
        (partial / name).write_bytes(ptb_bytes[name])
    assert ptb.load_ptb("chars", partial, download=False).source == str(partial)


def test_simulated_download_of_a_tampered_archive_writes_nothing(
    tmp_path, monkeypatch, tampered_tgz
):
    _serve(monkeypatch, tampered_tgz, [])
    with pytest.raises(DataError, match="SHA256 mismatch for ptb.valid.txt"):
        ptb.resolve_ptb_dir(None, download=True)
    cache = tmp_path / "cache" / "ptb"
    assert list(cache.iterdir()) == []


# --------------------------------------------------------------------------------------------
# PTB under the paper's evaluation protocol
# --------------------------------------------------------------------------------------------


def test_paper_protocol_on_ptb_test_mask_95_scores_about_5_of_51(ptb_chars):
    test = ptb_chars.test
    n = len(test)
    rows = (n - 101) // 51 + 1
    assert eval_protocols.scored_count(n, "paper", paper_mask=50) == rows * 50 == 441_050
    assert eval_protocols.scored_count(n, "paper", paper_mask=95) == rows * 5 == 44_105
    b50 = list(eval_protocols.eval_batches(test, "paper", 256, 100, paper_mask=50))
    b95 = list(eval_protocols.eval_batches(test, "paper", 256, 100, paper_mask=95))
    assert len(b50) == len(b95)
    for x, y in zip(b50, b95, strict=True):  # the SAME batches, only the mask differs
        np.testing.assert_array_equal(x.inputs, y.inputs)
        np.testing.assert_array_equal(x.targets, y.targets)
    assert sum(float(x.mask.sum()) for x in b95) == 44_105
    assert abs(44_105 / (n - 1) - 5 / 51) < 1e-3
    assert (
        eval_protocols.scored_count(n, "windows")
        == eval_protocols.scored_count(n, "stream")
        == n - 1
    )
