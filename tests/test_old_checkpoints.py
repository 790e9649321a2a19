"""Workdirs written by earlier versions still load, predict the same and resume.

The fixture ``tests/fixtures/checkpoints_1ee8db0`` was made by commit 1ee8db0 (the layout before
the restructure into packages by role): ``configs/ptb.py:tiny`` (HyperRHN, and the same with
``model.type=rhn``) trained 6 steps on ``text.txt``, its latest checkpoint kept, and the logits
that code computed for fixed tokens saved beside it (``<type>_expected.npz``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from rhhjax import models
from rhhjax.train import checkpoint as ckpt_lib
from rhhjax.train import trainer

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "checkpoints_1ee8db0"
TYPES = ("hyperrhn", "rhn")


def _quiet(message: str) -> None:
    del message


@pytest.mark.parametrize("model_type", TYPES)
def test_old_checkpoint_predicts_what_the_old_code_predicted(model_type):
    params, meta, which = ckpt_lib.load_for_inference(FIXTURE / f"{model_type}_workdir", "best")
    assert which == "latest" and meta["step"] == 6  # the fixture keeps no best/ folder
    model_config = models.ModelConfig.from_config(meta["model"])
    assert model_config.type == model_type
    expected = np.load(FIXTURE / f"{model_type}_expected.npz")
    logits, _ = models.build_model(model_config).apply(
        {"params": params}, jnp.asarray(expected["tokens"]), None, train=False
    )
    np.testing.assert_allclose(np.asarray(logits), expected["logits"], rtol=1e-5, atol=1e-6)


def test_old_workdir_resumes_where_it_stopped(tmp_path):
    workdir = tmp_path / "hyperrhn_workdir"
    shutil.copytree(FIXTURE / "hyperrhn_workdir", workdir)
    config = json.loads((workdir / "config.json").read_text())
    config["data"]["text_files"] = str(FIXTURE / "text.txt")  # written relative to the fixture
    config["train"]["max_steps"] = 8
    config["eval"]["final_protocols"] = "windows"
    results = trainer.train_and_evaluate(config, workdir, log=_quiet)
    assert results["status"] == "finished" and results["step"] == 8
    steps = [
        json.loads(line)["step"]
        for line in (workdir / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["kind"] == "train"
    ]
    assert steps == [1, 2, 3, 4, 5, 6, 7, 8]  # the old records kept, two new steps appended
