"""Lesioning a micro-layer: its gate is 0, the loss changes, the parameters are untouched."""

from __future__ import annotations

import numpy as np
import pytest

from rhhjax import analysis as analyze
from rhhjax import models

VOCAB = 13


@pytest.fixture(scope="module")
def tokens() -> np.ndarray:
    return np.random.default_rng(0).integers(0, VOCAB, size=3000).astype(np.uint8)


def _subject(model_type: str, tokens: np.ndarray) -> analyze.Subject:
    mc = models.ModelConfig(
        type=model_type, vocab_size=VOCAB, embed_dim=5, hidden=16, hyper_hidden=8, depth=2
    )
    params = analyze.init_params(mc, seed=1)
    return analyze.Subject(label=model_type, config=mc, params=params, tokens=tokens)


@pytest.mark.parametrize("model_type", ["rhn", "hyperrhn"])
def test_lesioning_a_layer_changes_the_loss(model_type, tokens):
    s = _subject(model_type, tokens)
    inputs, _, _ = analyze.heldout_windows(tokens, 2, 10)
    result = analyze.lesion(s, chars=600, seq_len=20, batch_size=8, gate_inputs=inputs)
    cells_expected = 2 if model_type == "hyperrhn" else 1
    assert len(result["layers"]) == 2 * cells_expected
    base = result["baseline"]["nats"]
    for record in result["layers"]:
        assert record["max_gate"] < 1e-6  # the lesioned layer only carries
        assert np.isfinite(record["nats"])
        assert record["delta_nats"] == pytest.approx(record["nats"] - base)
    assert any(abs(r["delta_nats"]) > 1e-4 for r in result["layers"] if r["cell"] == "main")
    # only the t-half of one layer's bias moves, and the original params are untouched
    lesioned = analyze.lesion_params(s.config, s.params, "main", 1)
    path = dict(analyze.gated_cells(s.config))["main"]
    before, after = s.params, lesioned
    for key in path:
        before, after = before[key], after[key]
    diff = np.asarray(after) - np.asarray(before)
    assert np.all(diff[1, 16:] == analyze.LESION_BIAS) and np.all(diff[1, :16] == 0)
    assert np.all(diff[0] == 0)


def test_lstm_has_no_gates(tokens):
    s = _subject("lstm", tokens)
    with pytest.raises(analyze.AnalysisError):
        analyze.lesion_params(s.config, s.params, "main", 0)
    settings = analyze.Settings(seq_len=10, grad_sequences=2, lesion_chars=300, batch_size=4)
    result = analyze.analyse(s, settings, log=lambda m: None)
    assert "gates" not in result and "lesion" not in result
    assert result["input_gradients"] and result["weight_norms"]
