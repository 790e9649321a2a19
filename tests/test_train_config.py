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
    del config["model"]["original_first_step"], config["model"]["lowrank_op"]
    prepared = train_config.prepare_config(config)
    defaults = train_config.default_config()
    assert prepared.train.divergence_factor == defaults.train.divergence_factor == 10.0
    assert (prepared.data.corpus, prepared.data.url, prepared.data.sha256) == ("", "", "")
    assert prepared.seed == 0 and prepared.model.original_first_step is False
    assert prepared.model.lowrank_op == defaults.model.lowrank_op
    assert prepared.model.hidden == 16  # what the old config has is kept


@pytest.mark.parametrize(
    "section, field, value, needle",
    [
        ("train", "batch_size", 0, "train.batch_size=0 must be an integer >= 1"),
        ("train", "learning_rate", float("nan"), "train.learning_rate=nan must be a finite number"),
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


@pytest.mark.parametrize("value", [float("inf"), -1.0, 0.0])
def test_an_unbounded_range_message_asks_for_a_finite_number_and_names_no_inf(value):
    """``inf`` was refused with "must be ... in (0.0, inf]", an interval
    that holds it."""
    config = configs.load("ptb:tiny")
    config.train.learning_rate = value
    with pytest.raises(train_config.TrainError) as info:
        train_config.prepare_config(config)
    assert str(info.value) == f"train.learning_rate={value!r} must be a finite number > 0.0"


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


def _budget(**fields):
    train = dict(budget_minutes=8.0, budget_step_seconds=0.0, schedule="cosine", warmup_steps=200)
    return types.SimpleNamespace(**{**train, **fields})


def test_a_budget_becomes_steps_deterministically():
    """Given the step time: floor(60 * minutes / seconds), the same on every machine;
    measured: the steps run so far plus what the rest of the budget buys."""
    given = _budget(budget_step_seconds=0.034)
    assert train_config.budget_steps_for(given, 123.0, 21, 0.5) == 14_117  # 480 / 0.034
    assert train_config.budget_steps_for(given, 0.0, 0, 0.034) == 14_117
    measured = _budget()
    assert train_config.budget_steps_for(measured, 60.0, 21, 0.035) == 21 + 12_000
    assert train_config.budget_steps_for(measured, 500.0, 21, 0.035) == 21  # spent already


def test_the_first_bound_reached_counts_the_budget_first():
    train = types.SimpleNamespace(max_steps=10, max_epochs=2, max_minutes=1.0, patience=3)
    assert train_config.bound_reached(train, 100, 7, 0, 0.0, budget_steps=7) == "budget"
    assert train_config.bound_reached(train, 100, 7, 0, 0.0, budget_steps=0) is None


@pytest.mark.parametrize(
    "fields, needle",
    [
        (
            dict(budget_minutes=0.01, budget_step_seconds=0.05, warmup_steps=20),
            "train.budget_minutes=0.01 buys 12 steps (0.05 s a step), too few for "
            "train.warmup_steps=20 and a decay: raise budget_minutes or lower warmup_steps",
        ),
        (
            dict(budget_minutes=1.0, warmup_steps=10, budget_probe_steps=20),
            "train.warmup_steps=10 must exceed budget_probe_steps + 1 = 21",
        ),
        (dict(optimizer="sgd"), "train.schedule='cosine' applies to adam"),
        (dict(max_steps=5, warmup_steps=4), "train.max_steps=5 leaves no decay"),
        (dict(max_steps=0, max_epochs=0), "decays over the run: set train.budget_minutes"),
        (dict(final_lr_fraction=1.5), "train.final_lr_fraction=1.5 must be"),
        (dict(max_minutes=0.2), "train.max_minutes=0.2 does not fix: set train.budget_minutes"),
    ],
)
def test_a_schedule_that_cannot_decay_is_refused_in_one_line_before_training(fields, needle):
    config = configs.load("ptb:tiny")
    config.train.schedule = "cosine"
    for field, value in fields.items():
        config.train[field] = value
    with pytest.raises(train_config.TrainError) as info:
        train_config.prepare_config(config)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_every_step_bound_must_leave_a_decay_after_the_warm_up():
    """max_epochs=1 of 337 steps with a 1,000-step warm-up never finished warming up."""
    train = _budget(budget_minutes=0.0, max_steps=0, max_epochs=1, warmup_steps=1000)
    with pytest.raises(train_config.TrainError) as info:
        train_config.check_schedule_horizon(train, 337)
    assert "train.max_epochs=1 (337 steps) leaves no decay after train.warmup_steps=1000" in str(
        info.value
    )
    train_config.check_schedule_horizon(_budget(max_steps=0, max_epochs=4, warmup_steps=1000), 337)
