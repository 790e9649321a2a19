"""Loading subjects: config specs, workdir checkpoints by step, one-line errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import ml_collections
import numpy as np
import pytest

from rhhjax import analysis as analyze
from rhhjax import data as data_lib
from rhhjax import models
from rhhjax.train import checkpoint as ckpt_lib
from rhhjax.train import config as train_config
from rhhjax.train import workdir as workdir_lib


def make_workdir(tmp_path: Path, model_type: str) -> tuple[Path, ml_collections.ConfigDict]:
    """A workdir with config.json and a best checkpoint (init params x 1.5), on a text file."""
    text = tmp_path / "text.txt"
    rng = np.random.default_rng(0)
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "ran"]
    text.write_text(" ".join(rng.choice(words, size=3000)))
    cfg = train_config.prepare_config(analyze.load_config_spec("configs/ptb.py:tiny"))
    cfg.data.format = "text"
    cfg.data.text_files = str(text)
    cfg.data.hutter_holdout = 2000
    cfg.model.type = model_type
    corpus = data_lib.load_corpus(cfg.data.to_dict())
    cfg.model.vocab_size = corpus.vocab.size
    mc = models.ModelConfig.from_config(cfg.model)
    params = analyze.init_params(mc, int(cfg.seed))
    trained = jax.tree.map(lambda a: a * 1.5, params)
    workdir = tmp_path / model_type
    workdir.mkdir()
    (workdir / workdir_lib.CONFIG_FILE).write_text(train_config.config_to_json(cfg))
    meta = {
        "version": ckpt_lib.META_VERSION,
        "vocab": corpus.vocab.to_dict(),
        "model": dataclasses.asdict(mc),  # as the trainer writes it
        "config": cfg.to_dict(),
        "step": 7,
        "epoch": 0.25,
    }
    with ckpt_lib.Checkpoints(workdir) as ckpts:
        ckpts.save_best(7, trained, meta)
    return workdir, cfg


def test_step_and_errors(tmp_path):
    workdir, _ = make_workdir(tmp_path, "rhn")
    s = analyze.subject_from_workdir(f"{workdir}@7")
    assert s.source == {"workdir": str(workdir), "checkpoint": "step 7", "step": 7, "epoch": 0.25}
    with pytest.raises(ckpt_lib.CheckpointError, match=r"no checkpoint of step 8 .*best/7"):
        analyze.subject_from_workdir(f"{workdir}@8")
    with pytest.raises(ckpt_lib.CheckpointError, match="does not exist"):
        analyze.subject_from_workdir(str(tmp_path / "missing"))
    with pytest.raises(analyze.AnalysisError, match="checkpoint must be"):
        analyze.parse_which("newest")
    assert analyze.split_workdir_spec("runs/a@b", "best") == ("runs/a@b", "best")


def test_config_spec_applies_typed_overrides():
    cfg = analyze.load_config_spec("configs/ptb.py:tiny,model.type=rhn,model.hidden=12")
    assert cfg.model.type == "rhn" and cfg.model.hidden == 12
    assert (
        analyze.load_config_spec("ptb:tiny").to_dict()
        == analyze.load_config_spec("configs/ptb.py:tiny").to_dict()
    )


def test_heldout_windows_are_evenly_spaced_shifted_pairs():
    tokens = np.arange(100)
    inputs, targets, starts = analyze.heldout_windows(tokens, 3, 10)
    assert starts.tolist() == [0, 44, 89]
    np.testing.assert_array_equal(inputs[1], np.arange(44, 54))
    np.testing.assert_array_equal(targets, inputs + 1)
    with pytest.raises(analyze.AnalysisError, match="windows need 101"):
        analyze.heldout_windows(tokens, 1, 100)
