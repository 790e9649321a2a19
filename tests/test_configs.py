"""configs/: loading by name and variant, typed overrides, the shared enwik8/text8 recipe, and
configs/ptb.py as the one place for defaults."""

from __future__ import annotations

import dataclasses

import pytest

from rhhjax import configs, models
from rhhjax.errors import UserError
from rhhjax.train import config as train_config


def test_load_accepts_a_name_or_the_file_path_with_a_variant():
    by_name = configs.load("ptb:cpu")
    by_path = configs.load("configs/ptb.py:cpu")
    assert by_name.to_dict() == by_path.to_dict()
    assert by_name.variant == "cpu" and by_name.model.hidden == 256


@pytest.mark.parametrize(
    "spec,needle",
    [("ptb:gpu", "unknown variant 'gpu' of configs/ptb.py"), ("wiki", "unknown config 'wiki'")],
)
def test_unknown_names_and_variants_are_one_line_errors(spec, needle):
    with pytest.raises(UserError, match=needle) as info:
        configs.load(spec)
    assert "\n" not in str(info.value)


def test_a_config_file_path_loads_that_file_not_the_installed_one(tmp_path):
    edited = tmp_path / "ptb.py"
    edited.write_text(
        "import ml_collections\n\n\ndef get_config(variant=''):\n"
        "    c = ml_collections.ConfigDict()\n    c.marker = 'edited:' + variant\n    return c\n"
    )
    assert configs.load(f"{edited}:cpu").marker == "edited:cpu"
    with pytest.raises(UserError, match="not found"):
        configs.load(str(tmp_path / "missing.py"))


def test_string_overrides_are_typed_like_the_default():
    config = configs.load(
        "ptb", ["model.depth=5", "train.learning_rate=3e-4", "data.unk=true", "model.type=rhn"]
    )
    assert config.model.depth == 5 and isinstance(config.model.depth, int)
    assert config.train.learning_rate == 3e-4 and isinstance(config.train.learning_rate, float)
    assert config.data.unk is True and config.model.type == "rhn"
    assert configs.load("ptb", {"model.kernel.block_b": 32}).model.kernel.block_b == 32


@pytest.mark.parametrize(
    "override,needle",
    [
        ("model.dept=3", "unknown config field model.dept (did you mean model.depth?)"),
        ("model.depth=2.5", "model.depth: '2.5' is not an integer"),
        ("model.depth=deep", "model.depth: 'deep' is not a number"),
        ("data.unk=maybe", "data.unk: 'maybe' is not a boolean"),
        ("model=3", "model is a block of fields"),
        ("model.depth", "is not block.field=value"),
    ],
)
def test_bad_overrides_name_the_field(override, needle):
    with pytest.raises(UserError) as info:
        configs.load("ptb", [override])
    assert needle in str(info.value)


@pytest.mark.parametrize("corpus,vocab,unit", [("enwik8", 205, "byte"), ("text8", 27, "char")])
def test_hutter_recipe_differs_only_in_the_corpus(corpus, vocab, unit):
    config = configs.load(corpus)
    assert config.data.corpus == corpus and config.data.text_vocab == unit
    assert config.model.embed_dim == vocab and config.model.type == "rhn"
    assert config.train.optimizer == "sgd" and config.train.lr_decay == 1.03
    other = configs.load("text8" if corpus == "enwik8" else "enwik8")
    differing = {
        f"{block}.{key}"
        for block in ("data", "model", "train", "eval")
        for key in config[block]
        if config[block][key] != other[block][key]
    }
    assert differing == {
        "data.corpus",
        "data.unk",
        "data.text_vocab",
        "model.vocab_size",
        "model.embed_dim",
    }


def test_model_config_defaults_are_the_ptb_model_block():
    from_file = models.ModelConfig.from_config(configs.load("ptb").model)
    assert dataclasses.asdict(from_file) == dataclasses.asdict(models.ModelConfig())


def test_prepare_config_fills_fields_an_old_config_lacks():
    config = configs.load("ptb:tiny").to_dict()
    del config["train"]["divergence_factor"], config["seed"]
    for field in ("corpus", "url", "sha256"):  # data fields older configs predate
        del config["data"][field]
    prepared = train_config.prepare_config(config)
    assert prepared.train.divergence_factor == configs.load("ptb").train.divergence_factor
    assert (prepared.data.corpus, prepared.data.url, prepared.data.sha256) == ("", "", "")
    assert prepared.seed == 0
