"""Gate traces: the gates the model records, against the numpy reference of the equations."""

from __future__ import annotations

import numpy as np
import pytest
from test_models_reference import np_core

from rhhjax import analysis as analyze
from rhhjax import models

VOCAB = 13


@pytest.fixture(scope="module")
def tokens() -> np.ndarray:
    return np.random.default_rng(0).integers(0, VOCAB, size=3000).astype(np.uint8)


def _subject(tokens, **kw) -> analyze.Subject:
    fields = dict(vocab_size=VOCAB, embed_dim=5, hidden=16, hyper_hidden=8, depth=2)
    fields.update(kw)
    mc = models.ModelConfig(**fields)
    params = analyze.init_params(mc, seed=1)
    return analyze.Subject(label=mc.type, config=mc, params=params, tokens=tokens)


@pytest.mark.parametrize(
    ("model_type", "kw"),
    [("rhn", {"impl": "fused"}), ("hyperrhn", {}), ("hyperrhn", {"hyper_rank": 2})],
)
def test_gate_trace_matches_numpy_reference(model_type, kw, tokens):
    s = _subject(tokens, type=model_type, **kw)
    inputs, _, _ = analyze.heldout_windows(tokens, 3, 10)
    trace = analyze.make_gate_trace(s.config)(s.params, inputs)
    _, expected = np_core(s.params, inputs, s.config)
    assert set(trace) == set(expected)
    for name, gates in trace.items():
        np.testing.assert_allclose(gates, expected[name], rtol=2e-5, atol=2e-6)
    assert trace["main"].shape == (3, 2, 10, 16)
    gates = analyze.gate_activity(s, inputs, sequences=2)
    assert len(gates["main"]["sequences"]) == 2
    activity = np.asarray(gates["main"]["sequences"][0]["activity"])
    np.testing.assert_allclose(activity, expected["main"][0].mean(axis=-1), rtol=2e-5)
    assert ("hyper" in gates) == (model_type == "hyperrhn")


def test_lstm_has_no_gate_trace(tokens):
    s = _subject(tokens, type="lstm")
    assert not analyze.can_trace_gates(s.config)
    with pytest.raises(analyze.AnalysisError, match="no highway gates"):
        analyze.make_gate_trace(s.config)
