"""Tests of rhhjax.data.text: text-file corpora (Hutter split, three files, byte / char) and the
known corpora's download: verified, atomic, offline-safe. The network is never touched:
``cache.fetch`` is replaced by a copy of a small synthetic zip."""

from __future__ import annotations

import hashlib
import re
import shutil
import zipfile
from pathlib import Path

import pytest

from rhhjax.data import DataError, text
from rhhjax.data import cache as cache_lib
from rhhjax.data.corpus import SPLITS

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
TINY_SHAKESPEARE = SHARED / "tinyshakespeare" / "input.txt"
TEXT = ("the quick brown fox jumps over the lazy dog " * 400).encode()


pytestmark = pytest.mark.usefixtures("offline_cache")


# --------------------------------------------------------------------------------------------
# The user's own text files
# --------------------------------------------------------------------------------------------


def _tiny_shakespeare() -> Path:
    if not TINY_SHAKESPEARE.is_file():
        pytest.skip(f"tinyshakespeare not found at {TINY_SHAKESPEARE}")
    return TINY_SHAKESPEARE


def test_hutter_split_sizes_and_byte_vocab_on_tinyshakespeare():
    path = _tiny_shakespeare()
    corpus = text.load_text_corpus(str(path), "hutter", "byte", holdout=1000)
    raw = path.read_bytes()
    assert [len(corpus.split(s)) for s in SPLITS] == [len(raw) - 2000, 1000, 1000]
    assert corpus.vocab.kind == "byte" and corpus.vocab.symbols == tuple(sorted(set(raw[:-2000])))
    assert corpus.vocab.decode(corpus.test) == raw[-1000:]
    assert corpus.vocab.decode(corpus.train) == raw[:-2000]


def test_hutter_split_of_a_too_short_file_is_an_error(tmp_path):
    path = tmp_path / "short.txt"
    path.write_text("x" * 10_000)
    with pytest.raises(DataError, match="10000 characters, too short.*hutter_holdout=5000"):
        text.load_text_corpus(str(path), "hutter", "char", holdout=5000)


def test_char_text_corpus_from_three_files_handles_non_ascii(tmp_path):
    texts = {"train": "héllo wörld\n" * 3, "valid": "wörld héllo\n", "test": "höll wö\n"}
    for split, content in texts.items():
        (tmp_path / split).write_text(content, encoding="utf-8")
    corpus = text.load_text_corpus([tmp_path / s for s in SPLITS], split="files", vocab="char")
    assert corpus.vocab.symbols == tuple(sorted(set(texts["train"])))
    assert all(corpus.vocab.decode(corpus.split(s)) == texts[s] for s in SPLITS)


def test_bad_text_arguments_are_one_line_data_errors(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("abc" * 100)
    for kwargs, needle in [
        (dict(split="random"), "'random'"),
        (dict(vocab="word"), "'word'"),
        (dict(holdout=-1), "hutter_holdout"),
        (dict(split="files"), "3 comma-separated"),
    ]:
        with pytest.raises(DataError, match=needle) as err:
            text.load_text_corpus(str(path), **kwargs)
        assert "\n" not in str(err.value)


# --------------------------------------------------------------------------------------------
# Known corpora (enwik8 / text8): download, verify, unzip, cache
# --------------------------------------------------------------------------------------------


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A 'fake' corpus served from a local zip; returns (zip path, list of fetched urls)."""
    archive = tmp_path / "served" / "fake.zip"
    archive.parent.mkdir()
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("fake", TEXT)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    source = text.CorpusSource("http://example.invalid/fake.zip", digest, "fake", len(TEXT))
    monkeypatch.setitem(text.CORPORA, "fake", source)
    monkeypatch.setenv("RHHJAX_CACHE", str(tmp_path / "cache"))
    fetched = []

    def fetch(url, dest):
        fetched.append(url)
        shutil.copyfile(archive, dest)

    monkeypatch.setattr(cache_lib, "fetch", fetch)
    return archive, fetched


def test_download_verify_unzip_then_cached(tmp_path, fake):
    _, fetched = fake
    path = text.ensure_corpus("fake")
    assert path == tmp_path / "cache" / "fake" / "fake"
    assert path.read_bytes() == TEXT and fetched == ["http://example.invalid/fake.zip"]
    assert sorted(p.name for p in path.parent.iterdir()) == ["fake"]  # no temporary files left
    assert text.ensure_corpus("fake") == path and len(fetched) == 1  # from the cache


def test_hash_mismatch_leaves_nothing(tmp_path, fake):
    with pytest.raises(DataError, match="SHA256 mismatch") as info:
        text.ensure_corpus("fake", sha256="0" * 64)
    assert "\n" not in str(info.value)
    assert list((tmp_path / "cache" / "fake").iterdir()) == []


def test_sha256_override_and_mirror(tmp_path, fake):
    archive, fetched = fake
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    path = text.ensure_corpus("fake", url="http://mirror.invalid/f.zip", sha256=digest.upper())
    assert path.is_file() and fetched == ["http://mirror.invalid/f.zip"]


def test_offline_and_download_disabled(tmp_path, fake, monkeypatch):
    def offline(url, dest):
        raise OSError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(cache_lib, "fetch", offline)
    with pytest.raises(DataError, match="download failed") as info:
        text.ensure_corpus("fake")
    message = str(info.value)
    assert "\n" not in message and "example.invalid/fake.zip" in message and "text_files" in message
    with pytest.raises(DataError, match="download=False"):
        text.ensure_corpus("fake", download=False)
    assert list((tmp_path / "cache" / "fake").iterdir()) == []


def test_wrong_size_in_cache(tmp_path, fake):
    path = text.corpus_path("fake")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"short")
    with pytest.raises(DataError, match="delete it"):
        text.ensure_corpus("fake")


def test_embedded_sources_are_the_100mb_zips_with_sha256():
    for name, source in text.CORPORA.items():
        assert re.fullmatch(r"[0-9a-f]{64}", source.sha256), name
        assert source.url.endswith(f"/{name}.zip") and source.size == 100_000_000


@pytest.mark.parametrize(
    "n,holdout", [(3_000, 750), (10_000, 1_000), (30_000, 1_500), (1_115_394, 55_770)]
)
def test_the_default_hutter_split_is_sized_to_the_file(tmp_path, n, holdout):
    """hutter_holdout=0 (the default): 5% each for valid and test, at least 1,000 symbols or
    a quarter of the file; the explicit 5,000,000 of the Hutter recipes refused files this
    small."""
    path = tmp_path / "t.txt"
    path.write_text("ab\n" * (n // 3) + "a" * (n % 3))
    corpus = text.load_text_corpus(str(path), "hutter", "char")
    assert text.auto_holdout(n) == holdout
    assert [len(corpus.split(s)) for s in SPLITS] == [n - 2 * holdout, holdout, holdout]


def test_the_readme_states_the_held_out_sizes_the_code_gives(tmp_path):
    """A 2 KB file gets 512 characters of valid and of test each, which the
    README's own-text sentence says (it said "at least 1,000")."""
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    path = tmp_path / "t.txt"
    path.write_text("ab\n" * 682 + "ab")  # 2,048 characters
    corpus = text.load_text_corpus(str(path), "hutter", "char")
    assert [len(corpus.split(s)) for s in SPLITS] == [1_024, 512, 512]
    sentence = "each at least 1,000 characters, or a quarter of a file under 4,000: 512 each of a"
    assert f"{sentence} 2,048-character file" in readme
    assert text.auto_holdout(3_999) == 999 and text.auto_holdout(4_000) == 1_000


@pytest.mark.parametrize("split, files", [("hutter", ["e.txt"]), ("files", ["t", "e.txt", "t"])])
def test_an_empty_text_file_is_named_empty(tmp_path, split, files):
    """An empty file said "needs more than 0 ... lower hutter_holdout"."""
    (tmp_path / "t").write_text("some text\n" * 100)
    (tmp_path / "e.txt").write_bytes(b"")
    paths = ",".join(str(tmp_path / f) for f in files)
    with pytest.raises(DataError) as info:
        text.load_text_corpus(paths, split, "char")
    assert str(info.value) == (
        f"text file {tmp_path / 'e.txt'} is empty: data.text_files needs a file of text"
    )


def test_a_negative_holdout_is_an_error_and_zero_means_automatic():
    assert text.check_holdout(0) == 0 and text.DEFAULT_HUTTER_HOLDOUT == 0
    with pytest.raises(DataError, match="hutter_holdout must be an integer >= 0"):
        text.check_holdout(-1)


def test_symbols_only_the_held_out_part_has_get_ids_unless_unk(tmp_path):
    """A small file's valid or test often holds a character its train part lacks (here 'Z'):
    without unk the vocabulary holds every symbol of the file, with unk train's only."""
    path = tmp_path / "t.txt"
    path.write_text("abc " * 1000 + "Z")
    whole = text.load_text_corpus(str(path), "hutter", "char")
    assert "Z" in whole.vocab.symbols and whole.vocab.decode(whole.test).endswith("Z")
    train_only = text.load_text_corpus(str(path), "hutter", "char", unk=True)
    assert "Z" not in train_only.vocab.symbols and train_only.test[-1] == len(train_only.vocab) - 1
