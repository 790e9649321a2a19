"""configs/: loading by name and variant, typed overrides, the shared enwik8/text8 recipe; the
library's defaults (``rhhjax.train.config.default_config``) as the one place for defaults, which
config files start from and the library never reads them back from."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rhhjax import configs
from rhhjax import data as data_lib
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
    assert configs.load("ptb", {"model.hidden": 32}).model.hidden == 32


@pytest.mark.parametrize(
    "override,needle",
    [
        ("model.dept=3", "unknown config field model.dept (did you mean model.depth?)"),
        ("modle.depth=3", "unknown config field modle.depth (did you mean model?)"),
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
    assert config.data.hutter_holdout == data_lib.HUTTER_HOLDOUT == 5_000_000  # set, not default
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


def test_the_library_never_imports_the_config_files():
    """Defaults flow from the library to configs/, never back: importing the trainer and what
    it imports when it trains (it validates and fills configs) loads no module of configs/."""
    code = (
        "import sys\n"
        "import rhhjax.train.trainer, rhhjax.train.config, rhhjax.data, rhhjax.models\n"
        "import rhhjax.train.setup, rhhjax.train.loop, rhhjax.train.step, rhhjax.train.state\n"
        "from rhhjax.train import config\n"
        "config.prepare_config(config.default_config())\n"
        "print(sorted(m for m in sys.modules if m.startswith('rhhjax.configs')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_paper_config_is_the_library_defaults():
    """configs/ptb.py sets only what its variants change: its paper config is the defaults."""
    assert configs.load("ptb").to_dict() == train_config.default_config().to_dict()
    tiny = configs.load("ptb:tiny")
    assert tiny.variant == "tiny" and tiny.model.hidden == 16 and tiny.train.max_steps == 6
    assert tiny.data.to_dict() == data_lib.default_data_config().to_dict()


_FIELD_LINE = re.compile(r'^\s+(?:[a-z_]+\.[a-z_.]+ = |"[a-z_]+\.[a-z_.]+": )')


def _uncommented_field_lines(source: str) -> list[str]:
    """Lines that set a field (``train.seed = 0`` or ``"train.seed": 0,``) with no comment
    on them or on the line above."""
    lines = source.splitlines()
    return [
        line
        for i, line in enumerate(lines)
        if _FIELD_LINE.match(line) and "#" not in line and not lines[i - 1].strip().startswith("#")
    ]


@pytest.mark.parametrize(
    "source",
    [
        Path(configs.__file__).parent / "ptb.py",
        Path(configs.__file__).parent / "hutter.py",
        train_config.default_train_config,
        train_config.default_eval_config,
        data_lib.default_data_config,
    ],
    ids=["configs/ptb.py", "configs/hutter.py", "train", "eval", "data"],
)
def test_every_field_a_config_sets_has_a_comment(source):
    text = source.read_text() if isinstance(source, Path) else inspect.getsource(source)
    assert sum(bool(_FIELD_LINE.match(line)) for line in text.splitlines()) >= 5
    assert _uncommented_field_lines(text) == []


def test_the_fast_variant_changes_only_the_optimisation_recipe_of_the_paper_model():
    from rhhjax.train.workdir import flat_fields

    paper = flat_fields(configs.load("ptb").to_dict())
    fast = flat_fields(configs.load("ptb:fast").to_dict())
    changed = {field for field in paper if paper[field] != fast[field]}
    assert changed == {
        "variant",
        "train.budget_minutes",
        "train.max_epochs",
        "train.patience",
        "train.batch_size",
        "train.schedule",
        "train.warmup_steps",
        "train.learning_rate",
        "train.clip_type",
        "train.clip_norm",
        "train.eval_every_steps",
    }
    assert fast["train.batch_size"] == 2 * paper["train.batch_size"] == 512
    assert fast["train.learning_rate"] == 8 * paper["train.learning_rate"]
    assert fast["model.keep"] == paper["model.keep"] == 0.65
    prepared = train_config.prepare_config(configs.load("ptb:fast"))  # a valid budget run
    assert prepared.train.warmup_steps > prepared.train.budget_probe_steps + 1
