"""Tests of rhhjax.data: corpora, vocabularies, PTB download/verification, samplers, eval batches.

Real-PTB tests read the folder from $RHHJAX_PTB_DIR, else ../shared/data/ptb beside the repo.
Nothing here touches the network: ``data._fetch`` is replaced in every test.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import types
import urllib.error
from pathlib import Path

import numpy as np
import pytest

from rhhjax import data

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
TINY_SHAKESPEARE = SHARED / "tinyshakespeare" / "input.txt"
PTB_WORD_FILES = ("ptb.train.txt", "ptb.valid.txt", "ptb.test.txt")
ALL_PTB_FILES = tuple(data.PTB_SHA256)


def _ptb_dir() -> Path | None:
    env = os.environ.get("RHHJAX_PTB_DIR")
    if env:
        return Path(env)
    default = SHARED / "ptb"
    return default if default.is_dir() else None


@pytest.fixture(autouse=True)
def _no_network_and_private_cache(tmp_path, monkeypatch):
    """Every test: the cache lives in tmp_path and any attempt to download fails loudly."""
    monkeypatch.setenv("RHHJAX_CACHE", str(tmp_path / "cache"))

    def no_network(url, dest):
        raise AssertionError(f"test tried to download {url}")

    monkeypatch.setattr(data, "_fetch", no_network)


@pytest.fixture(scope="module")
def ptb_dir() -> Path:
    folder = _ptb_dir()
    if folder is None or not all((folder / n).is_file() for n in ALL_PTB_FILES):
        pytest.skip("real PTB not found: set RHHJAX_PTB_DIR to a folder with ptb.*.txt")
    return folder


@pytest.fixture(scope="module")
def ptb_chars(ptb_dir) -> data.Corpus:
    return data.load_ptb("chars", ptb_dir, download=False)


@pytest.fixture(scope="module")
def ptb_mikolov(ptb_dir) -> data.Corpus:
    return data.load_ptb("mikolov_char", ptb_dir, download=False)


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

    monkeypatch.setattr(data, "_fetch", fake_fetch)


# --------------------------------------------------------------------------------------------
# PTB corpora and vocabularies
# --------------------------------------------------------------------------------------------


def test_chars_vocab_is_the_papers_50_symbols(ptb_chars):
    vocab = ptb_chars.vocab
    assert vocab.size == 50 and vocab.kind == "char" and not vocab.unk
    assert {"\n", " ", "<", ">", "N"} <= set(vocab.symbols)
    assert list(vocab.symbols) == sorted(vocab.symbols)
    assert ptb_chars.train.dtype == np.uint8
    assert [len(ptb_chars.split(s)) for s in data.SPLITS] == [5_101_618, 399_782, 449_945]


def test_mikolov_char_vocab_is_49_symbols_plus_end_of_line(ptb_mikolov):
    vocab = ptb_mikolov.vocab
    assert vocab.size == 50
    assert data.MIKOLOV_EOL in vocab.symbols and "_" in vocab.symbols and " " not in vocab.symbols


def test_both_formats_encode_the_same_text(ptb_chars, ptb_mikolov):
    def word_chars(corpus, separators):
        ids = [corpus.vocab.symbols.index(s) for s in separators]
        return int(np.count_nonzero(~np.isin(corpus.train, ids)))

    assert word_chars(ptb_chars, " \n") == word_chars(ptb_mikolov, "_\n") == 4_129_961
    words = ptb_chars.vocab.decode(ptb_chars.valid).split("\n")
    chars = ptb_mikolov.vocab.decode(ptb_mikolov.valid).split("\n")
    assert len(words) == len(chars) == 3371
    assert ["_".join(line.split()) for line in words] == chars


def test_vocab_round_trips_through_json(ptb_chars):
    vocab = ptb_chars.vocab
    restored = data.Vocab.from_dict(json.loads(json.dumps(vocab.to_dict())))
    assert restored == vocab
    np.testing.assert_array_equal(restored.encode(vocab.decode(ptb_chars.test)), ptb_chars.test)
    byte_vocab = data.Vocab.from_data(b"\x00hello\xff", unk=True)
    assert data.Vocab.from_dict(json.loads(json.dumps(byte_vocab.to_dict()))) == byte_vocab


def test_unknown_symbol_is_an_error_naming_symbol_split_and_position():
    vocab = data.Vocab.from_data("abc\n")
    with pytest.raises(data.DataError) as err:
        vocab.encode("ab\nbaZc", split="valid")
    msg = str(err.value)
    assert "'Z'" in msg and "valid" in msg and "position 5" in msg and "line 2" in msg
    assert "\n" not in msg


def test_unk_maps_unknown_symbols_to_the_reserved_last_id():
    vocab = data.Vocab.from_data("abc", unk=True)
    assert vocab.size == 4 and vocab.unk_id == 3
    np.testing.assert_array_equal(vocab.encode("aZc\u00e9", split="test"), [0, 3, 2, 3])
    assert vocab.decode([0, 3]) == "a\ufffd"


def test_unk_config_maps_unseen_text_symbols(tmp_path):
    paths = []
    for name, text in [("tr", "abcabc"), ("va", "abz"), ("te", "cab")]:
        (tmp_path / name).write_text(text)
        paths.append(str(tmp_path / name))
    cfg = data.default_data_config()
    cfg.format, cfg.text_split, cfg.text_files = "text", "files", ",".join(paths)
    with pytest.raises(data.DataError, match="'z'.*valid|valid.*'z'"):
        data.load_corpus(cfg)
    cfg.unk = True
    corpus = data.load_corpus(cfg)
    assert corpus.vocab.size == 4
    np.testing.assert_array_equal(corpus.valid, [0, 1, 3])


def test_bad_config_values_are_one_line_data_errors():
    for field, value in [
        ("format", "words"),
        ("unk", "yes"),
        ("text_split", "random"),
        ("text_vocab", "word"),
        ("hutter_holdout", 0),
    ]:
        cfg = types.SimpleNamespace(**data.default_data_config().to_dict())
        cfg.format = "text"
        cfg.text_files = str(TINY_SHAKESPEARE)
        setattr(cfg, field, value)
        with pytest.raises(data.DataError) as err:
            data.load_corpus(cfg)
        assert "\n" not in str(err.value) and repr(value) in str(err.value)
    with pytest.raises(data.DataError, match="text_files"):
        data.load_corpus(types.SimpleNamespace(format="text", text_files=""))


def test_default_config_has_the_documented_defaults():
    cfg = data.default_data_config()
    assert cfg.to_dict() == {
        "format": "chars",
        "dir": None,
        "download": True,
        "unk": False,
        "text_files": "",
        "text_split": "hutter",
        "text_vocab": "char",
        "hutter_holdout": 5_000_000,
    }
    cfg.dir = "/some/where"  # a None default accepts a path


# --------------------------------------------------------------------------------------------
# PTB location, verification and (simulated) download
# --------------------------------------------------------------------------------------------


def test_explicit_dir_with_verified_files_is_used(ptb_dir):
    assert data.resolve_ptb_dir(ptb_dir, download=False) == ptb_dir


def test_checksum_mismatch_in_dir_is_an_error(tmp_path):
    for name in PTB_WORD_FILES:
        (tmp_path / name).write_text(" not the penn treebank \n")
    with pytest.raises(data.DataError) as err:
        data.load_ptb("chars", tmp_path, download=False)
    msg = str(err.value)
    assert "SHA256 mismatch" in msg and "ptb.train.txt" in msg and str(tmp_path) in msg


def test_checksum_mismatch_in_the_cache_is_an_error_not_a_silent_download(tmp_path):
    cache = tmp_path / "cache" / "ptb"
    cache.mkdir(parents=True)
    for name in PTB_WORD_FILES:
        (cache / name).write_bytes(b"tampered")
    with pytest.raises(data.DataError, match="SHA256 mismatch for ptb.train.txt"):
        data.resolve_ptb_dir(None, download=True, files=PTB_WORD_FILES)  # _fetch would fail


def test_offline_error_names_url_files_and_folder(tmp_path, monkeypatch):
    def offline(url, dest):
        raise urllib.error.URLError("no route to host")

    monkeypatch.setattr(data, "_fetch", offline)
    cache = tmp_path / "cache" / "ptb"
    for download in (True, False):
        with pytest.raises(data.DataError) as err:
            data.load_ptb("chars", None, download=download)
        msg = str(err.value)
        assert data.PTB_URL in msg and str(cache) in msg and "\n" not in msg
        assert all(name in msg for name in PTB_WORD_FILES)
        assert not cache.exists() or list(cache.iterdir()) == []  # no temp file left behind


def test_simulated_download_writes_verified_files_into_the_cache(
    tmp_path, monkeypatch, fake_tgz, ptb_bytes
):
    calls: list[str] = []
    _serve(monkeypatch, fake_tgz, calls)
    folder = data.resolve_ptb_dir(None, download=True)
    cache = tmp_path / "cache" / "ptb"
    assert folder == cache and calls == [data.PTB_URL]
    assert sorted(p.name for p in cache.iterdir()) == sorted(ALL_PTB_FILES)  # no temp files
    assert all((cache / n).read_bytes() == ptb_bytes[n] for n in ALL_PTB_FILES)
    assert not (tmp_path / "cache" / "evil.txt").exists() and not (tmp_path / "evil.txt").exists()
    # the cache is used from now on (no second download)
    corpus = data.load_ptb("chars", None, download=True)
    assert calls == [data.PTB_URL] and corpus.vocab.size == 50
    assert corpus.source == str(cache)


def test_explicit_dir_that_is_wrong_is_an_error_not_the_cache(
    tmp_path, monkeypatch, fake_tgz, ptb_bytes
):
    """An explicit data dir is used or refused: never silently replaced by the cache."""
    _serve(monkeypatch, fake_tgz, [])
    data.resolve_ptb_dir(None, download=True)  # the cache holds every file
    with pytest.raises(data.DataError, match="is not a folder") as err:
        data.load_ptb("chars", tmp_path / "missing", download=True)
    assert str(tmp_path / "missing") in str(err.value) and "\n" not in str(err.value)
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "ptb.train.txt").write_bytes(ptb_bytes["ptb.train.txt"])
    with pytest.raises(data.DataError, match="lacks ptb.valid.txt, ptb.test.txt"):
        data.load_ptb("chars", partial, download=True)
    for name in ("ptb.valid.txt", "ptb.test.txt"):
        (partial / name).write_bytes(ptb_bytes[name])
    assert data.load_ptb("chars", partial, download=False).source == str(partial)


def test_simulated_download_of_a_tampered_archive_writes_nothing(
    tmp_path, monkeypatch, tampered_tgz
):
    _serve(monkeypatch, tampered_tgz, [])
    with pytest.raises(data.DataError, match="SHA256 mismatch for ptb.valid.txt"):
        data.resolve_ptb_dir(None, download=True)
    cache = tmp_path / "cache" / "ptb"
    assert list(cache.iterdir()) == []


# --------------------------------------------------------------------------------------------
# Generic text corpus
# --------------------------------------------------------------------------------------------


def _tiny_shakespeare() -> Path:
    if not TINY_SHAKESPEARE.is_file():
        pytest.skip(f"tinyshakespeare not found at {TINY_SHAKESPEARE}")
    return TINY_SHAKESPEARE


def test_hutter_split_sizes_and_byte_vocab_on_tinyshakespeare():
    path = _tiny_shakespeare()
    cfg = data.default_data_config()
    cfg.format, cfg.text_files, cfg.text_vocab, cfg.hutter_holdout = "text", str(path), "byte", 1000
    corpus = data.load_corpus(cfg)
    raw = path.read_bytes()
    assert [len(corpus.split(s)) for s in data.SPLITS] == [len(raw) - 2000, 1000, 1000]
    assert corpus.vocab.kind == "byte" and corpus.vocab.symbols == tuple(sorted(set(raw[:-2000])))
    assert corpus.vocab.decode(corpus.test) == raw[-1000:]
    assert corpus.vocab.decode(corpus.train) == raw[:-2000]


def test_hutter_split_of_a_too_short_file_is_an_error(tmp_path):
    path = tmp_path / "short.txt"
    path.write_text("x" * 10_000)
    with pytest.raises(data.DataError, match="10000 characters, too short.*hutter_holdout=5000"):
        data.load_text_corpus(str(path), "hutter", "char", holdout=5000)


def test_char_text_corpus_from_three_files_handles_non_ascii(tmp_path):
    texts = {"train": "héllo wörld\n" * 3, "valid": "wörld héllo\n", "test": "höll wö\n"}
    for split, text in texts.items():
        (tmp_path / split).write_text(text, encoding="utf-8")
    corpus = data.load_text_corpus([tmp_path / s for s in data.SPLITS], split="files", vocab="char")
    assert corpus.vocab.symbols == tuple(sorted(set(texts["train"])))
    assert all(corpus.vocab.decode(corpus.split(s)) == texts[s] for s in data.SPLITS)


# --------------------------------------------------------------------------------------------
# Training samplers
# --------------------------------------------------------------------------------------------


def test_window_sampler_shapes_dtypes_and_shifted_targets():
    tokens = np.arange(5000) % 251
    sampler = data.WindowSampler(tokens.astype(np.uint8), batch_size=8, seq_len=100, seed=3)
    assert sampler.batches_per_epoch == 5000 // 800
    batch = next(sampler)
    assert batch.inputs.shape == batch.targets.shape == (8, 100)
    assert batch.inputs.dtype == batch.targets.dtype == np.int32 and batch.reset
    np.testing.assert_array_equal(batch.targets[:, :-1], batch.inputs[:, 1:])
    big = data.WindowSampler(np.arange(5000), batch_size=64, seq_len=100, seed=3)
    b = big.batch_at(7)
    np.testing.assert_array_equal(b.inputs, b.inputs[:, :1] + np.arange(100))
    np.testing.assert_array_equal(b.targets, b.inputs + 1)


def test_window_sampler_is_deterministic_from_the_seed():
    tokens = np.arange(3000)
    a = [next(data.WindowSampler(tokens, 4, 50, seed=1)).inputs for _ in range(2)]
    s1, s2, s3 = (data.WindowSampler(tokens, 4, 50, seed=s) for s in (1, 1, 2))
    first = [next(s1).inputs for _ in range(5)]
    np.testing.assert_array_equal(a[0], a[1])
    assert all(np.array_equal(x, next(s2).inputs) for x in first)
    assert not all(np.array_equal(x, next(s3).inputs) for x in first)


@pytest.mark.parametrize("kind", ["window", "stream"])
def test_sampler_restore_continues_like_an_uninterrupted_sampler(kind):
    tokens = np.arange(4000) % 200

    def make(seed=0):
        if kind == "window":
            return data.WindowSampler(tokens, 4, 30, seed=seed)
        return data.StreamSampler(tokens, 4, 30, seed=seed)

    reference = make(seed=5)
    expected = [next(reference) for _ in range(25)]
    interrupted = make(seed=5)
    for _ in range(11):
        next(interrupted)
    state = json.loads(json.dumps(interrupted.state()))
    resumed = make(seed=0)  # the seed comes back with the state
    resumed.restore(state)
    for want in expected[11:]:
        got = next(resumed)
        np.testing.assert_array_equal(got.inputs, want.inputs)
        np.testing.assert_array_equal(got.targets, want.targets)
        assert (got.reset, got.step, got.epoch) == (want.reset, want.step, want.epoch)
    with pytest.raises(data.DataError, match="batch_size"):
        (data.WindowSampler if kind == "window" else data.StreamSampler)(tokens, 5, 30).restore(
            state
        )


@pytest.mark.parametrize("random_offset", [False, True])
def test_stream_sampler_rows_continue_across_batches_and_reset_each_epoch(random_offset):
    n, b, t = 1003, 3, 7
    sampler = data.StreamSampler(np.arange(n), b, t, seed=2, random_offset=random_offset)
    bpe = sampler.batches_per_epoch
    assert bpe == (n - 1 - (t - 1 if random_offset else 0)) // (b * t)
    offsets = set()
    for epoch in range(6):
        batches = [next(sampler) for _ in range(bpe)]
        assert [x.reset for x in batches] == [True] + [False] * (bpe - 1)
        assert all(x.epoch == epoch for x in batches)
        rows_in = np.concatenate([x.inputs for x in batches], axis=1)
        rows_tg = np.concatenate([x.targets for x in batches], axis=1)
        np.testing.assert_array_equal(rows_tg, rows_in + 1)
        # every row is one contiguous slice, rows are adjacent, all inside the data
        start = rows_in[0, 0]
        expected = start + np.arange(b)[:, None] * sampler.row_len + np.arange(bpe * t)
        np.testing.assert_array_equal(rows_in, expected)
        assert rows_tg.max() <= n - 1 and 0 <= start < t
        offsets.add(int(start))
    assert (len(offsets) > 1) == random_offset


# --------------------------------------------------------------------------------------------
# Evaluation batches
# --------------------------------------------------------------------------------------------

EVAL_CASES = [
    # (N, B, T, m)
    (2, 1, 1, 0),
    (2, 3, 5, 4),
    (11, 1, 10, 0),
    (12, 1, 10, 9),
    (101, 4, 10, 3),
    (1000, 7, 33, 32),
    (1000, 1, 100, 50),
    (1001, 8, 100, 50),
    (57, 64, 8, 7),
    (5000, 5, 7, 0),
]


def _scored_positions(batches) -> np.ndarray:
    """Target positions (tokens = arange) of every scored entry, in order."""
    return np.concatenate([b.targets[b.mask == 1] for b in batches])


@pytest.mark.parametrize("n,b,t,m", EVAL_CASES)
def test_windows_protocol_scores_every_position_once_with_min_context(n, b, t, m):
    batches = list(data.eval_batches(np.arange(n), "windows", b, t, min_context=m))
    assert len(batches) == data.num_eval_batches(n, "windows", b, t, m)
    for batch in batches:
        assert batch.inputs.shape == batch.targets.shape == batch.mask.shape == (b, t)
        assert batch.inputs.dtype == np.int32 and batch.mask.dtype == np.float32 and batch.reset
        on = batch.mask == 1
        np.testing.assert_array_equal(batch.targets[on], batch.inputs[on] + 1)
    total = sum(float(x.mask.sum()) for x in batches)
    assert total == data.scored_count(n, "windows", seq_len=t, min_context=m) == n - 1
    positions = _scored_positions(batches)
    np.testing.assert_array_equal(np.sort(positions), np.arange(1, n))
    # window k starts at k * (t - m); window 0 scores from position 0, later ones from m
    inputs = np.concatenate([x.inputs for x in batches])
    masks = np.concatenate([x.mask for x in batches])
    for w in np.flatnonzero(masks.any(axis=1)):
        scored = np.flatnonzero(masks[w])
        assert inputs[w, 0] == w * (t - m)
        assert scored.min() == (0 if w == 0 else m)
        np.testing.assert_array_equal(inputs[w, scored], w * (t - m) + scored)


@pytest.mark.parametrize("n,b,t,m", EVAL_CASES)
def test_stream_protocol_scores_every_position_once_with_carried_state(n, b, t, m):
    batches = list(data.eval_batches(np.arange(n), "stream", b, t, min_context=m))
    assert len(batches) == data.num_eval_batches(n, "stream", b, t, m)
    assert [x.reset for x in batches] == [True] + [False] * (len(batches) - 1)
    total = sum(float(x.mask.sum()) for x in batches)
    assert total == data.scored_count(n, "stream", seq_len=t) == n - 1
    np.testing.assert_array_equal(np.sort(_scored_positions(batches)), np.arange(1, n))
    # each row is a contiguous stream: concatenating the chunks gives consecutive inputs
    inputs = np.concatenate([x.inputs for x in batches], axis=1)
    mask = np.concatenate([x.mask for x in batches], axis=1)
    targets = np.concatenate([x.targets for x in batches], axis=1)
    np.testing.assert_array_equal(targets[mask == 1], inputs[mask == 1] + 1)
    row_len = -(-(n - 1) // b)
    for r in range(b):
        scored = np.flatnonzero(mask[r])
        if scored.size:
            np.testing.assert_array_equal(scored, np.arange(scored.size))
            np.testing.assert_array_equal(inputs[r, scored], r * row_len + scored)


@pytest.mark.parametrize("n", [100, 101, 152, 153, 1000])
@pytest.mark.parametrize("paper_mask", [0, 50, 95])
def test_paper_protocol_rows_and_counts(n, paper_mask):
    tokens = np.arange(n)
    if n < 101:
        with pytest.raises(data.DataError, match="101"):
            data.eval_batches(tokens, "paper", 4, seq_len=7)
        assert data.scored_count(n, "paper", paper_mask=paper_mask) == 0
        return
    batches = list(data.eval_batches(tokens, "paper", 4, seq_len=7, paper_mask=paper_mask))
    rows = (n - 101) // 51 + 1
    inputs = np.concatenate([x.inputs for x in batches])
    mask = np.concatenate([x.mask for x in batches])
    assert inputs.shape[1] == 100 and all(x.reset for x in batches)
    np.testing.assert_array_equal(inputs[:rows], 51 * np.arange(rows)[:, None] + np.arange(100))
    assert not mask[rows:].any()
    total = sum(float(x.mask.sum()) for x in batches)
    assert total == data.scored_count(n, "paper", paper_mask=paper_mask)
    assert total == rows * (100 - paper_mask)
    scored = _scored_positions(batches)
    if paper_mask >= 50:  # rows overlap by 50 symbols: a mask >= 50 scores no symbol twice
        assert len(np.unique(scored)) == len(scored)
    if paper_mask == 50:
        assert not np.any(scored % 51 == 50)  # the 51st symbol of every chunk is never scored


def test_paper_protocol_on_ptb_test_mask_95_scores_about_5_of_51(ptb_chars):
    test = ptb_chars.test
    n = len(test)
    rows = (n - 101) // 51 + 1
    assert data.scored_count(n, "paper", paper_mask=50) == rows * 50 == 441_050
    assert data.scored_count(n, "paper", paper_mask=95) == rows * 5 == 44_105
    b50 = list(data.eval_batches(test, "paper", 256, 100, paper_mask=50))
    b95 = list(data.eval_batches(test, "paper", 256, 100, paper_mask=95))
    assert len(b50) == len(b95)
    for x, y in zip(b50, b95, strict=True):  # the SAME batches, only the mask differs
        np.testing.assert_array_equal(x.inputs, y.inputs)
        np.testing.assert_array_equal(x.targets, y.targets)
    assert sum(float(x.mask.sum()) for x in b95) == 44_105
    assert abs(44_105 / (n - 1) - 5 / 51) < 1e-3
    assert data.scored_count(n, "windows") == data.scored_count(n, "stream") == n - 1


def test_eval_rejects_bad_protocol_and_min_context():
    with pytest.raises(data.DataError, match="protocol"):
        data.eval_batches(np.arange(50), "sliding", 2, 10)
    with pytest.raises(data.DataError, match="min_context"):
        data.eval_batches(np.arange(50), "windows", 2, 10, min_context=10)
