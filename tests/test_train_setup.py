"""rhhjax.train.setup: what ``prepare_run`` checks before anything is written or compiled,
on the command lines the README prints."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import jax
import pytest
import train_cases
from helpers import ROOT, write_text
from helpers import tiny_run_config as tiny_config
from train_cases import (
    quiet,
)

from rhhjax import configs, models
from rhhjax import data as data_lib
from rhhjax.errors import UserError
from rhhjax.train import trainer
from rhhjax.train.config import TrainError
from rhhjax.train.setup import prepare_run
from rhhjax.train.signals import SignalCatcher


def readme_command(needle: str) -> list[str]:
    """The README's ``python train.py ...`` line that holds ``needle``, as arguments."""
    lines = (ROOT / "README.md").read_text().splitlines()
    found = [line for line in lines if line.startswith("python train.py") and needle in line]
    assert len(found) == 1, f"the README has {len(found)} train.py lines with {needle!r}"
    return shlex.split(found[0])[2:]


def config_of(arguments: list[str]):
    """The config a train.py command line gives: --config, then its --config.x=y."""
    (spec,) = [a.split("=", 1)[1] for a in arguments if a.startswith("--config=")]
    overrides = [a[len("--config.") :] for a in arguments if a.startswith("--config.")]
    name, _, variant = spec.partition(":")
    return configs.load(f"{ROOT / name}:{variant}" if variant else str(ROOT / name), overrides)


@pytest.mark.parametrize("n_chars,holdout", [(3_000, 750), (30_000, 1_500)])
def test_the_readme_own_text_line_prepares_a_run_on_a_file_of_a_few_kb(
    tmp_path, monkeypatch, n_chars, holdout
):
    """The README's own-text line failed on any file under 10 M characters (a 5 M Hutter
    holdout); the default split is now sized to the file."""
    arguments = readme_command("--config.data.text_files=input.txt")
    monkeypatch.chdir(tmp_path)
    write_text(Path("input.txt"), n_chars)
    run = prepare_run(config_of(arguments), tmp_path / "w", lambda m: None, SignalCatcher())
    sizes = [len(run.corpus.train), len(run.corpus.valid), len(run.corpus.test)]
    assert sizes == [n_chars - 2 * holdout, holdout, holdout]
    assert not (tmp_path / "w").exists()  # nothing written


def test_the_readme_shows_the_own_text_line_in_a_code_block():
    text = (ROOT / "README.md").read_text()
    assert re.search(
        r"```bash\npython train.py [^\n]*--config.data.text_files=input.txt\n```", text
    )


@pytest.mark.parametrize(
    "field,needle",
    [
        ("train.batch_size", "training needs about "),
        ("eval.batch_size", "evaluation (windows protocol) needs about "),
    ],
)
def test_a_batch_that_cannot_fit_is_one_line_before_anything_is_written(tmp_path, field, needle):
    """train.batch_size or eval.batch_size = 1e8 ended in 40-48-line RESOURCE_EXHAUSTED
    tracebacks; now the estimate refuses them before compiling (train.check_memory=False
    lets them run)."""
    from helpers import tiny_run_config

    from rhhjax import memory

    text = write_text(tmp_path / "t.txt", 20_000)
    config = tiny_run_config(text)
    section, name = field.split(".")
    config[section][name] = 100_000_000
    with pytest.raises(memory.MemoryCheckError) as info:
        prepare_run(config, tmp_path / "w", lambda m: None, SignalCatcher())
    message = str(info.value)
    assert message.startswith(needle) and f"({field}=100000000 x " in message
    assert "is free (" in message
    assert f": lower {field}" in message and "\n" not in message
    assert not (tmp_path / "w").exists()
    config.train.check_memory = False
    prepare_run(config, tmp_path / "w", lambda m: None, SignalCatcher())  # not refused


def test_a_run_states_its_memory_estimate_beside_the_free_memory_at_start_up(tmp_path):
    """A run that passed the memory check never printed its estimate."""
    from helpers import tiny_run_config

    lines: list[str] = []
    config = tiny_run_config(write_text(tmp_path / "t.txt", 20_000))
    prepare_run(config, tmp_path / "w", lines.append, SignalCatcher())
    memory_lines = [line for line in lines if line.startswith("memory: ")]
    assert len(memory_lines) == 1, lines
    assert re.fullmatch(
        r"memory: .+ needs about [\d.]+ MB \+ 402\.7 MB to compile of host memory \(.+\), "
        r"[\d.,]+ [kMGT]?B is free \(.+\)",
        memory_lines[0],
    )
    config.train.check_memory = False
    lines.clear()
    prepare_run(config, tmp_path / "w", lines.append, SignalCatcher())
    assert not any(line.startswith("memory: ") for line in lines)


text_file = train_cases.text_file  # a shared fixture (tests/train_cases.py)


# ------------------------------------------------------ bad configs fail before anything is written


BAD_CONFIGS = [
    (dict(model__depth=0), models.ConfigError, "model.depth"),
    (dict(model__keep=1.5), models.ConfigError, "model.keep"),
    (dict(model__hidden=-3), models.ConfigError, "model.hidden"),
    (dict(model__impl="magic"), models.ConfigError, "model.impl"),
    (dict(data__format="nope"), data_lib.DataError, "data.format"),
    (dict(data__text_files="/nonexistent/file.txt"), data_lib.DataError, "/nonexistent"),
    (dict(train__clip_type="l3"), TrainError, "train.clip_type"),
    (dict(train__learning_rate=0.0), TrainError, "train.learning_rate"),
    (dict(train__on_nonfinite="ignore"), TrainError, "train.on_nonfinite"),
    (dict(eval__min_context=20), TrainError, "eval.min_context"),
    (dict(eval__final_protocols="windows,bogus"), TrainError, "bogus"),
    (dict(data__hutter_holdout=20_000), data_lib.DataError, "hutter_holdout"),
    # the retired Pallas Triton implementation: one line naming what replaces it
    (dict(model__impl="pallas"), UserError, "'mosaic' or 'persistent' (Hopper GPUs"),
]


if jax.default_backend() != "gpu":  # impl="mosaic" and "persistent" compile for a GPU only
    BAD_CONFIGS += [
        (dict(model__impl="mosaic"), UserError, "for a Hopper GPU, and the platform is"),
        (dict(model__impl="persistent"), UserError, "for a Hopper GPU, and the platform is"),
        # lowering only (the compile report's mode): not executed off a GPU
        (dict(model__impl="mosaic", model__pallas_mode="compiled"), UserError, "only lowers"),
        (dict(model__impl="persistent", model__pallas_mode="compiled"), UserError, "only lowers"),
    ]


@pytest.mark.parametrize("overrides,error,needle", BAD_CONFIGS)
def test_bad_config_fails_before_writing(tmp_path, text_file, overrides, error, needle):
    workdir = tmp_path / "never"
    with pytest.raises(error) as info:
        trainer.train_and_evaluate(tiny_config(text_file, **overrides), workdir, log=quiet)
    assert needle in str(info.value) and "\n" not in str(info.value)
    assert isinstance(info.value, UserError)
    assert not workdir.exists()


def test_tensorboard_without_the_package_is_one_line(tmp_path, text_file, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    workdir = tmp_path / "run"
    with pytest.raises(TrainError, match="needs the tensorboardX package") as info:
        trainer.train_and_evaluate(
            tiny_config(text_file, train__tensorboard=True), workdir, log=quiet
        )
    assert "\n" not in str(info.value) and not workdir.exists()
