"""Character-level corpora, vocabularies, training samplers and evaluation batches.

Pure numpy + standard library (no jax): everything here runs on the host. Where things live:

    errors.py        ``DataError`` (every data problem, one line; a ``UserError``).
    vocab.py         ``Vocab``: sorted symbol table of a training split, encode / decode, JSON.
    corpus.py        ``Corpus``: three encoded splits and their vocabulary; ``SPLITS``.
    cache.py         the download cache ($RHHJAX_CACHE), the one network call, atomic writes.
    ptb.py           Penn Treebank: locate, download, verify SHA256, formats chars /
                     mikolov_char (``load_ptb``, ``resolve_ptb_dir``).
    text.py          your own text files (``load_text_corpus``) and the known corpora
                     enwik8 / text8 (``CORPORA``, ``ensure_corpus``).
    config.py        the config's ``data`` block: ``default_data_config``,
                     ``validate_data_config``, ``resolve_data_config`` and THE ``load_corpus``.
    samplers.py      training batches: ``WindowSampler`` (the paper's), ``StreamSampler`` (TBPTT).
    eval_protocols.py  evaluation batches under the protocols windows / stream / paper.

The names below are re-exported so that ``from rhhjax import data`` gives all of them.
"""

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
