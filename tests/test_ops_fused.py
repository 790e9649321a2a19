"""`fused` (rhhjax/ops/fused.py): its layout (units padded once per call, the batch not),
weights and saved rows, and the one model only it runs among the whole-sequence ops, variational
dropout, against `scan`. Its other comparisons with `scan`: tests/test_ops_recurrence.py."""

import jax.numpy as jnp
import pytest
from helpers import assert_trees_close as _assert_trees_close
from ops_cases import config as _config
from ops_cases import fresh_case, loss_and_grads

from rhhjax import models
from rhhjax.ops import fused


def test_layout_pads_units_only_and_weights_once():
    spec = models.sequence_spec(_config(impl="fused"))
    geo = fused.geometry(spec, 5, 70)
    assert (geo.b_pad, geo.n_pad) == (5, 128) and fused.FUSED_UNIT_MULTIPLE == 64
    w = jnp.ones((2, 70, 140))
    assert [x.shape for x in fused.prepare_weights(spec, geo, w)] == [(128, 256)] * 2
    transposed = fused.prepare_weights(spec, geo, w, transposed=True)
    assert [x.shape for x in transposed] == [(256, 128)] * 2
    assert fused.saved_rows(False) == (("h", 1), ("t", 1))
    assert fused.saved_rows(True) == (("h", 1), ("t", 1), ("full", 2))


@pytest.mark.parametrize("model_type", ["rhn", "hyperrhn"])
def test_fused_matches_scan_with_variational_dropout(model_type):
    config = _config(type=model_type, dropout="variational", keep_hidden=0.7, keep_input=0.8)
    params, tokens, key = fresh_case(config, 77)
    expected = loss_and_grads(config, params, tokens, key)
    fused = models.ModelConfig(**{**config.__dict__, "impl": "fused"})
    _assert_trees_close(loss_and_grads(fused, params, tokens, key), expected, 2e-5)
