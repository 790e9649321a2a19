"""enwik8 / text8 download: verified, atomic, offline-safe. The network is never touched:
``downloads._fetch`` is replaced by a copy of a small synthetic zip."""

from __future__ import annotations

import hashlib
import importlib.util
import re
import shutil
import zipfile
from pathlib import Path

import pytest

from rhhjax import data as data_lib
from rhhjax.data import downloads

ROOT = Path(__file__).resolve().parents[1]
TEXT = ("the quick brown fox jumps over the lazy dog " * 400).encode()


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A 'fake' corpus served from a local zip; returns (zip path, list of fetched urls)."""
    archive = tmp_path / "served" / "fake.zip"
    archive.parent.mkdir()
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("fake", TEXT)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    source = downloads.CorpusSource("http://example.invalid/fake.zip", digest, "fake", len(TEXT))
    monkeypatch.setitem(downloads.CORPORA, "fake", source)
    monkeypatch.setenv("RHHJAX_CACHE", str(tmp_path / "cache"))
    fetched = []

    def fetch(url, dest):
        fetched.append(url)
        shutil.copyfile(archive, dest)

    monkeypatch.setattr(downloads, "_fetch", fetch)
    return archive, fetched


def test_download_verify_unzip_then_cached(tmp_path, fake):
    _, fetched = fake
    path = downloads.ensure_corpus("fake")
    assert path == tmp_path / "cache" / "fake" / "fake"
    assert path.read_bytes() == TEXT and fetched == ["http://example.invalid/fake.zip"]
    assert sorted(p.name for p in path.parent.iterdir()) == ["fake"]  # no temporary files left
    assert downloads.ensure_corpus("fake") == path and len(fetched) == 1  # from the cache


def test_hash_mismatch_leaves_nothing(tmp_path, fake):
    with pytest.raises(data_lib.DataError, match="SHA256 mismatch") as info:
        downloads.ensure_corpus("fake", sha256="0" * 64)
    assert "\n" not in str(info.value)
    assert list((tmp_path / "cache" / "fake").iterdir()) == []


def test_sha256_override_and_mirror(tmp_path, fake):
    archive, fetched = fake
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    path = downloads.ensure_corpus("fake", url="http://mirror.invalid/f.zip", sha256=digest.upper())
    assert path.is_file() and fetched == ["http://mirror.invalid/f.zip"]


def test_offline_and_download_disabled(tmp_path, fake, monkeypatch):
    def offline(url, dest):
        raise OSError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(downloads, "_fetch", offline)
    with pytest.raises(data_lib.DataError, match="download failed") as info:
        downloads.ensure_corpus("fake")
    message = str(info.value)
    assert "\n" not in message and "example.invalid/fake.zip" in message and "text_files" in message
    with pytest.raises(data_lib.DataError, match="download=False"):
        downloads.ensure_corpus("fake", download=False)
    assert list((tmp_path / "cache" / "fake").iterdir()) == []


def test_wrong_size_in_cache(tmp_path, fake):
    path = downloads.corpus_path("fake")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"short")
    with pytest.raises(data_lib.DataError, match="delete it"):
        downloads.ensure_corpus("fake")


def test_load_corpus_resolves_known_corpus(tmp_path, fake):
    cfg = {
        "format": "text",
        "corpus": "fake",
        "text_files": "",
        "hutter_holdout": 1000,
        "text_split": "hutter",
        "text_vocab": "char",
    }
    corpus = downloads.load_corpus(cfg)
    assert len(corpus.test) == len(corpus.valid) == 1000
    assert corpus.vocab.size == len(set(TEXT.decode()))
    # an explicit text_files wins; other formats are untouched
    explicit = tmp_path / "mine.txt"
    explicit.write_bytes(TEXT[:5000])
    assert downloads.resolve_data_config({**cfg, "text_files": str(explicit)})["text_files"] == str(
        explicit
    )
    assert downloads.resolve_data_config({"format": "chars", "corpus": "fake"})["format"] == "chars"


def test_embedded_sources_and_configs():
    for name, source in downloads.CORPORA.items():
        assert re.fullmatch(r"[0-9a-f]{64}", source.sha256), name
        assert source.url.endswith(f"/{name}.zip") and source.size == 100_000_000
    for name, vocab, kind in (("enwik8", 205, "byte"), ("text8", 27, "char")):
        spec = importlib.util.spec_from_file_location(name, ROOT / "configs" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        cfg = module.get_config()
        assert cfg.data.corpus == name and cfg.data.text_vocab == kind
        assert cfg.model.embed_dim == vocab and cfg.model.depth == 10 and cfg.model.hidden == 1500
        assert (cfg.train.batch_size, cfg.train.seq_len, cfg.data.sampler) == (128, 50, "stream")
        from rhhjax.train import loop as trainer

        trainer.prepare_config(cfg)  # every field valid
