"""The evaluator scores the right characters, each exactly once, with the right arithmetic.

A model whose logits are the same at every position (head kernel 0, head bias = log unigram
frequencies computed here from the split) must give exactly the split's unigram
cross-entropy over the scored characters: all but the first for ``windows`` and ``stream``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rhhjax import data as data_lib
from rhhjax import evaluation as eval_lib
from rhhjax import models

VOCAB = 11
MC = models.ModelConfig(
    type="rhn", vocab_size=VOCAB, embed_dim=5, hidden=8, depth=2, dropout="none"
)


@pytest.fixture(scope="module")
def tokens() -> np.ndarray:
    rng = np.random.default_rng(1)
    probs = rng.dirichlet(np.ones(VOCAB) * 0.7)
    return rng.choice(VOCAB, size=1237, p=probs).astype(np.uint8)


@pytest.fixture(scope="module")
def params():
    model = models.build_model(MC)
    return jax.jit(lambda key: models.init_params(model, key))(jax.random.key(0))


def constant_params(params, tokens):
    """Head kernel 0 and bias log(counts + 1 normalised): logits do not depend on the input."""
    counts = np.bincount(tokens, minlength=VOCAB).astype(np.float64) + 1.0
    log_p = np.log(counts / counts.sum())
    params = jax.tree.map(lambda x: x, params)
    params["head"] = {
        "kernel": jnp.zeros_like(params["head"]["kernel"]),
        "bias": jnp.asarray(log_p, jnp.float32),
    }
    return params, log_p


def expected_unigram(log_p, targets):
    return -float(np.mean(log_p[targets]))


@pytest.mark.parametrize("protocol", ["windows", "stream"])
@pytest.mark.parametrize("batch_size,seq_len,min_context", [(7, 13, 4), (1, 50, 10), (64, 9, 0)])
def test_constant_model_gives_unigram_entropy(
    params, tokens, protocol, batch_size, seq_len, min_context
):
    const, log_p = constant_params(params, tokens)
    m = eval_lib.evaluate_tokens(
        MC, const, tokens, protocol, batch_size=batch_size, seq_len=seq_len, min_context=min_context
    )
    assert m["chars"] == len(tokens) - 1
    want = expected_unigram(log_p, tokens[1:])
    assert m["nats"] == pytest.approx(want, rel=1e-6)
    assert m["bpc"] == pytest.approx(want / math.log(2), rel=1e-6)
    assert m["ppl"] == pytest.approx(math.exp(want), rel=1e-6)
    # argmax of constant logits is the most frequent symbol
    assert m["acc"] == pytest.approx(np.mean(tokens[1:] == np.argmax(log_p)), abs=1e-9)


@pytest.mark.parametrize("mask", [50, 95])
def test_constant_model_paper_protocol(params, tokens, mask):
    const, log_p = constant_params(params, tokens)
    m = eval_lib.evaluate_tokens(
        MC, const, tokens, "paper", batch_size=5, seq_len=100, paper_mask=mask
    )
    # rows start every 51 symbols, 100 targets each, positions >= mask scored
    rows = (len(tokens) - 101) // 51 + 1
    targets = np.array([tokens[51 * i + 1 + t] for i in range(rows) for t in range(mask, 100)])
    assert (
        m["chars"] == len(targets) == data_lib.scored_count(len(tokens), "paper", paper_mask=mask)
    )
    assert m["nats"] == pytest.approx(expected_unigram(log_p, targets), rel=1e-6)


def test_stream_with_one_row_equals_one_pass(params, tokens):
    """Batch 1 stream evaluation carries the state: it equals running the whole split at once."""
    short = tokens[:301]
    m = eval_lib.evaluate_tokens(MC, params, short, "stream", batch_size=1, seq_len=37)
    model = models.build_model(MC)
    logits, _ = model.apply({"params": params}, jnp.asarray(short[None, :-1], jnp.int32))
    logp = jax.nn.log_softmax(np.asarray(logits[0], np.float64), axis=-1)
    nll = -np.asarray(logp)[np.arange(300), short[1:]]
    assert m["chars"] == 300
    assert m["nats"] == pytest.approx(float(nll.mean()), rel=1e-5)


def test_windows_first_window_has_no_context_penalty(params, tokens):
    """With one window covering everything, windows == stream with one row."""
    short = tokens[:40]
    a = eval_lib.evaluate_tokens(
        MC, params, short, "windows", batch_size=3, seq_len=50, min_context=10
    )
    b = eval_lib.evaluate_tokens(MC, params, short, "stream", batch_size=1, seq_len=50)
    assert a["chars"] == b["chars"] == 39
    assert a["nats"] == pytest.approx(b["nats"], rel=1e-6)


def test_evaluate_splits_labels_and_table(params, tokens):
    corpus = data_lib.Corpus(
        name="t",
        vocab=data_lib.Vocab("byte", tuple(range(VOCAB))),
        train=tokens,
        valid=tokens[:500],
        test=tokens[500:1000],
    )

    class Eval:
        batch_size, seq_len, min_context = 8, 30, 10

    lines = []
    out = eval_lib.evaluate_splits(MC, params, corpus, Eval, log=lines.append)
    assert list(out["valid"]) == ["windows", "stream", "paper"]
    assert list(out["test"]) == ["windows", "stream", "paper", "paper_test_mask95"]
    assert len(lines) == 7
    table = eval_lib.format_table(out)
    assert "paper_test_mask95" in table and "BPC" in table
    assert len(table.splitlines()) == 2 + 7


def test_parse_protocols():
    assert eval_lib.parse_protocols("all") == ["windows", "stream", "paper"]
    assert eval_lib.parse_protocols(" stream , windows") == ["stream", "windows"]
    assert eval_lib.parse_protocols("") == []
    with pytest.raises(data_lib.DataError, match="bogus"):
        eval_lib.parse_protocols("windows,bogus")


def test_metrics_from_sums():
    m = eval_lib.metrics_from_sums(2.0 * math.log(2), 1.0, 2.0)
    assert m == {"nats": math.log(2), "bpc": 1.0, "ppl": 2.0, "acc": 0.5, "chars": 2}
    with pytest.raises(data_lib.DataError):
        eval_lib.metrics_from_sums(0.0, 0.0, 0.0)


@pytest.mark.parametrize("protocol", ["windows", "stream"])
def test_evaluation_in_pieces_equals_whole_windows(params, tokens, protocol):
    """A window longer than max_chunk runs in pieces with the state carried: same metrics."""
    args = dict(batch_size=3, seq_len=120, min_context=40)
    whole = eval_lib.evaluate_tokens(MC, params, tokens, protocol, **args)
    pieces = eval_lib.evaluate_tokens(MC, params, tokens, protocol, max_chunk=17, **args)
    assert pieces["chars"] == whole["chars"] == len(tokens) - 1
    assert pieces["nats"] == pytest.approx(whole["nats"], rel=1e-6)
    assert pieces["acc"] == pytest.approx(whole["acc"], abs=1e-9)
