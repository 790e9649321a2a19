"""Corpora, vocabularies, samplers and evaluation batches (numpy, no jax): errors.py, vocab.py,
corpus.py, cache.py, ptb.py, text.py (text files, enwik8 / text8), config.py (the ``data``
block), samplers.py, eval_protocols.py; the names below are re-exported."""

from __future__ import annotations

from rhhjax.data.config import (
    FORMATS,
    default_data_config,
    load_corpus,
    resolve_data_config,
    validate_data_config,
)
from rhhjax.data.corpus import SPLITS, Corpus
from rhhjax.data.errors import DataError
from rhhjax.data.eval_protocols import (
    EVAL_PROTOCOLS,
    MAX_CHUNK,
    PAPER_CHUNK,
    PAPER_SEQ_LEN,
    EvalBatch,
    eval_batches,
    num_eval_batches,
    scored_count,
)
from rhhjax.data.ptb import (
    MIKOLOV_EOL,
    PTB_FILES,
    PTB_SHA256,
    PTB_URL,
    load_ptb,
    ptb_cache_dir,
    resolve_ptb_dir,
)
from rhhjax.data.samplers import SAMPLERS, StreamSampler, TrainBatch, WindowSampler
from rhhjax.data.text import (
    CORPORA,
    DEFAULT_HUTTER_HOLDOUT,
    HUTTER_HOLDOUT,
    TEXT_SPLITS,
    CorpusSource,
    auto_holdout,
    corpus_path,
    ensure_corpus,
    load_text_corpus,
)
from rhhjax.data.vocab import TEXT_VOCABS, UNK_TEXT, Vocab

__all__ = [
    "CORPORA",
    "DEFAULT_HUTTER_HOLDOUT",
    "EVAL_PROTOCOLS",
    "HUTTER_HOLDOUT",
    "FORMATS",
    "MAX_CHUNK",
    "MIKOLOV_EOL",
    "PAPER_CHUNK",
    "PAPER_SEQ_LEN",
    "PTB_FILES",
    "PTB_SHA256",
    "PTB_URL",
    "SAMPLERS",
    "SPLITS",
    "TEXT_SPLITS",
    "TEXT_VOCABS",
    "UNK_TEXT",
    "Corpus",
    "CorpusSource",
    "DataError",
    "EvalBatch",
    "StreamSampler",
    "TrainBatch",
    "Vocab",
    "WindowSampler",
    "auto_holdout",
    "corpus_path",
    "default_data_config",
    "ensure_corpus",
    "eval_batches",
    "load_corpus",
    "load_ptb",
    "load_text_corpus",
    "num_eval_batches",
    "ptb_cache_dir",
    "resolve_data_config",
    "resolve_ptb_dir",
    "scored_count",
    "validate_data_config",
]
