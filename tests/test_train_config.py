"""Every default of a run and its checks (rhhjax/train/config.py): an old config's missing
fields filled in, one line for each bad field, the bound that stops a run."""

import types

import pytest

from rhhjax import configs
from rhhjax.train import config as train_config


def test_prepare_config_fills_fields_an_old_config_lacks():
    config = configs.load("ptb:tiny").to_dict()
    del config["train"]["divergence_factor"], config["seed"]
    for field in ("corpus", "url", "sha256"):  # data fields older configs predate
        del config["data"][field]
    del config["model"]["original_first_step"], config["model"]["kernel"]["block_b"]
    prepared = train_config.prepare_config(config)
    defaults = train_config.default_config()
    assert prepared.train.divergence_factor == defaults.train.divergence_factor == 10.0
    assert (prepared.data.corpus, prepared.data.url, prepared.data.sha256) == ("", "", "")
    assert prepared.seed == 0 and prepared.model.original_first_step is False
    assert prepared.model.kernel.block_b == defaults.model.kernel.block_b
    assert prepared.model.hidden == 16  # what the old config has is kept


@pytest.mark.parametrize(
    "section, field, value, needle",
    [
        ("train", "batch_size", 0, "train.batch_size=0 must be an integer >= 1"),
        ("train", "learning_rate", float("nan"), "train.learning_rate=nan must be a number"),
        ("train", "divergence_factor", 0.5, "must be 0 (off) or > 1"),
        ("eval", "min_context", 20, "eval.min_context=20 must be < eval.seq_len=20"),
        ("eval", "max_valid_chars", 1, "eval.max_valid_chars=1 must be 0 or >= 2"),
    ],
)
def test_each_bad_field_is_one_line(section, field, value, needle):
    config = configs.load("ptb:tiny")
    config[section][field] = value
    with pytest.raises(train_config.TrainError) as info:
        train_config.prepare_config(config)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_the_first_bound_reached_stops_the_run():
    train = types.SimpleNamespace(max_steps=10, max_epochs=2, max_minutes=1.0, patience=3)
    assert train_config.bound_reached(train, 100, 5, 0, 0.0) is None
    assert train_config.bound_reached(train, 100, 10, 3, 61.0) == "max_steps"
    assert train_config.bound_reached(train, 4, 8, 0, 0.0) == "max_epochs"
    assert train_config.bound_reached(train, 100, 5, 0, 60.0) == "max_minutes"
    assert train_config.bound_reached(train, 100, 5, 3, 0.0) == "early_stopping"


def test_a_run_that_nothing_stops_is_refused():
    config = configs.load("ptb:tiny")
    for field in ("max_steps", "max_epochs", "max_minutes", "patience"):
        config.train[field] = 0
    with pytest.raises(train_config.TrainError, match="nothing stops training"):
        train_config.prepare_config(config)
