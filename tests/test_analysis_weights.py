"""Weight norms: one record per weight matrix and layer, in forward order."""

import numpy as np
import pytest

from rhhjax import analysis as analyze
from rhhjax import models


def _params(model_type):
    mc = models.ModelConfig(
        type=model_type, vocab_size=13, embed_dim=5, hidden=16, hyper_hidden=8, depth=2
    )
    return analyze.init_params(mc, seed=1)


def test_weight_norms_one_per_layer():
    params = _params("hyperrhn")
    norms = analyze.weight_norms(params)
    names = [w["name"] for w in norms]
    assert names[0] == "embed/embedding" and names[-1] == "head/kernel"
    assert not any("bias" in n for n in names)
    cell = params["core"]["cell"]
    main_w = [w for w in norms if w["name"] == "core/cell/main/kernel_s"]
    assert [w["layer"] for w in main_w] == [0, 1]
    for w in main_w:
        expected = np.linalg.norm(np.asarray(cell["main"]["kernel_s"][w["layer"]]))
        assert w["fro"] == pytest.approx(expected, rel=1e-6)
        assert w["shape"] == [16, 32]
    # forward order inside the cell: hyper, projections, main
    blocks = list(dict.fromkeys(w["block"] for w in norms))
    assert blocks == ["embed", "hyper", "proj", "main", "head"]
    lstm = analyze.weight_norms(_params("lstm"))
    assert [w["label"] for w in lstm] == [
        "embed E", "layers_0 Wx", "layers_0 Wh", "layers_1 Wx", "layers_1 Wh", "head out"
    ]  # fmt: skip
