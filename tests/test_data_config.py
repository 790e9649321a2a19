"""Tests of rhhjax.data.config: the data block's defaults, its validation, and load_corpus
(defaults filled in, known corpora resolved to their cached file). Nothing here touches the
network: ``cache.fetch`` is replaced in every test."""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import numpy as np
import pytest

from rhhjax import data
from rhhjax.data import DataError, text

ROOT = Path(__file__).resolve().parents[1]
TINY_SHAKESPEARE = Path(__file__).resolve().parents[2] / "shared/data/tinyshakespeare/input.txt"
TEXT = ("the quick brown fox jumps over the lazy dog " * 400).encode()


pytestmark = pytest.mark.usefixtures("offline_cache")


@pytest.fixture
def cached_fake_corpus(monkeypatch) -> Path:
    """A known corpus 'fake' whose unzipped file is already in the cache."""
    source = text.CorpusSource("http://example.invalid/fake.zip", "0" * 64, "fake", len(TEXT))
    monkeypatch.setitem(text.CORPORA, "fake", source)
    path = text.corpus_path("fake")
    path.parent.mkdir(parents=True)
    path.write_bytes(TEXT)
    return path


def test_unseen_text_symbols_get_ids_or_with_unk_the_reserved_id(tmp_path):
    paths = []
    for name, content in [("tr", "abcabc"), ("va", "abz"), ("te", "cab")]:
        (tmp_path / name).write_text(content)
        paths.append(str(tmp_path / name))
    cfg = data.default_data_config()
    cfg.format, cfg.text_split, cfg.text_files = "text", "files", ",".join(paths)
    every = data.load_corpus(cfg)  # without unk: every symbol of the files gets an id
    assert every.vocab.symbols == ("a", "b", "c", "z") and not every.vocab.unk
    cfg.unk = True
    corpus = data.load_corpus(cfg)
    assert corpus.vocab.size == 4 and corpus.vocab.symbols == ("a", "b", "c")
    np.testing.assert_array_equal(corpus.valid, [0, 1, 3])


def test_bad_config_values_are_one_line_data_errors():
    for field, value in [
        ("format", "words"),
        ("unk", "yes"),
        ("text_split", "random"),
        ("text_vocab", "word"),
        ("hutter_holdout", -1),
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


def test_default_config_is_a_fresh_valid_block_each_time():
    cfg = data.default_data_config()
    data.validate_data_config(cfg)
    assert cfg.format == "chars" and cfg.sampler == "windows"
    assert cfg.hutter_holdout == data.DEFAULT_HUTTER_HOLDOUT
    cfg.dir = "/some/where"  # a caller's change stays its own
    assert data.default_data_config().dir == ""


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("format", "nope", "data.format='nope' is not one of chars, mikolov_char, text"),
        ("sampler", "random", "data.sampler='random' is not one of windows, stream"),
        ("corpus", "enwik9", "data.corpus='enwik9' is not one of enwik8, text8"),
        ("unk", "yes", "data config unk must be a bool, got 'yes'"),
        ("download", 1, "data config download must be a bool, got 1"),
        ("dir", 5, "data config dir must be a path or None, got 5"),
    ],
)
def test_validate_data_config_names_the_field_and_value(field, value, message):
    data.validate_data_config(data.default_data_config())  # the defaults are valid
    cfg = {**data.default_data_config().to_dict(), field: value}
    with pytest.raises(DataError) as err:
        data.validate_data_config(cfg)
    assert str(err.value) == message


def test_validate_checks_text_fields_only_for_format_text():
    cfg = data.default_data_config().to_dict()
    cfg.update(text_split="random", text_vocab="word", hutter_holdout=-1)
    data.validate_data_config(cfg)  # format="chars": the text fields are not read
    for field, value in [("text_split", "random"), ("text_vocab", "word"), ("hutter_holdout", -1)]:
        bad = {**data.default_data_config().to_dict(), "format": "text", field: value}
        with pytest.raises(DataError, match=repr(value)):
            data.validate_data_config(bad)
    files = {**bad, "hutter_holdout": -1, "text_split": "files", "text_vocab": "char"}
    data.validate_data_config(files)  # the holdout is only read by the hutter split


def test_load_corpus_resolves_a_known_corpus_to_its_cached_file(tmp_path, cached_fake_corpus):
    cfg = {
        "format": "text",
        "corpus": "fake",
        "text_files": "",
        "hutter_holdout": 1000,
        "text_split": "hutter",
        "text_vocab": "char",
    }
    corpus = data.load_corpus(cfg)
    assert len(corpus.test) == len(corpus.valid) == 1000
    assert corpus.vocab.size == len(set(TEXT.decode()))
    assert corpus.source == str(cached_fake_corpus)
    # an explicit text_files wins; other formats are untouched
    explicit = tmp_path / "mine.txt"
    explicit.write_bytes(TEXT[:5000])
    assert data.resolve_data_config({**cfg, "text_files": str(explicit)})["text_files"] == str(
        explicit
    )
    assert data.resolve_data_config({"format": "chars", "corpus": "fake"})["format"] == "chars"


def test_configs_of_the_known_corpora_prepare():
    for name, vocab, kind in (("enwik8", 205, "byte"), ("text8", 27, "char")):
        spec = importlib.util.spec_from_file_location(name, ROOT / "configs" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        cfg = module.get_config()
        assert cfg.data.corpus == name and cfg.data.text_vocab == kind
        assert cfg.model.embed_dim == vocab and cfg.model.depth == 10 and cfg.model.hidden == 1500
        assert (cfg.train.batch_size, cfg.train.seq_len, cfg.data.sampler) == (128, 50, "stream")
        data.validate_data_config(cfg.data)
        from rhhjax.train import config as train_config

        train_config.prepare_config(cfg)  # every field valid
