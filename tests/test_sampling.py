"""Text generation: deterministic per seed, greedy = step-by-step argmax, vocabulary rules."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rhhjax import data as data_lib
from rhhjax import models
from rhhjax.tools import sample

VOCAB = data_lib.Vocab("char", tuple(" abcdefgh"))
MC = models.ModelConfig(type="rhn", vocab_size=VOCAB.size, embed_dim=4, hidden=8, depth=2)


@pytest.fixture(scope="module")
def params():
    model = models.build_model(MC)
    return jax.jit(lambda key: models.init_params(model, key))(jax.random.key(3))


def test_sampling_is_deterministic_per_seed(params):
    a = sample.generate(MC, params, VOCAB, "abc ", 50, temperature=1.0, seed=0)
    b = sample.generate(MC, params, VOCAB, "abc ", 50, temperature=1.0, seed=0)
    c = sample.generate(MC, params, VOCAB, "abc ", 50, temperature=1.0, seed=1)
    assert a == b and a != c
    assert len(a) == 50 and set(a) <= set(VOCAB.symbols)


def test_greedy_equals_stepwise_argmax(params):
    out = sample.generate(MC, params, VOCAB, "ab", 12, temperature=0.0)
    model = models.build_model(MC)
    tokens = jnp.asarray(VOCAB.encode("ab")[None, :], jnp.int32)
    apply = jax.jit(lambda p, t, c: model.apply({"params": p}, t, c))
    logits, carry = model.apply({"params": params}, tokens)
    expected = []
    for _ in range(12):
        nxt = int(jnp.argmax(logits[0, -1]))
        expected.append(nxt)
        logits, carry = apply(params, jnp.array([[nxt]], jnp.int32), carry)
    assert out == VOCAB.decode(expected)


def test_prompt_must_be_in_vocabulary(params):
    with pytest.raises(data_lib.DataError, match="'z' is not in the model's vocabulary"):
        sample.generate(MC, params, VOCAB, "az", 5)
    with pytest.raises(data_lib.DataError, match="empty"):
        sample.generate(MC, params, VOCAB, "", 5)
    with pytest.raises(data_lib.DataError, match="length"):
        sample.generate(MC, params, VOCAB, "a", 0)


def test_unknown_symbol_is_never_sampled(params):
    vocab = data_lib.Vocab("char", tuple(" abcdefg"), unk=True)  # 9 ids, the last is <unk>
    assert vocab.size == MC.vocab_size
    biased = jax.tree.map(lambda x: x, params)
    bias = np.zeros(vocab.size, np.float32)
    bias[vocab.unk_id] = 50.0  # the model loves <unk>
    biased["head"] = {"kernel": biased["head"]["kernel"] * 0, "bias": jnp.asarray(bias)}
    for temperature in (0.0, 1.0):
        out = sample.generate(MC, biased, vocab, "ab", 30, temperature=temperature)
        assert data_lib.UNK_TEXT not in out and len(out) == 30


def test_byte_vocabulary_returns_bytes(params):
    vocab = data_lib.Vocab("byte", tuple(range(97, 97 + MC.vocab_size)))
    out = sample.generate(MC, params, vocab, "abc", 10, temperature=0.5)
    assert isinstance(out, bytes) and len(out) == 10
