"""rhhjax/config_files.py: the one config loader behind ``configs.load`` and ``--config``;
each refusal is one ConfigArgumentError line. (The configs themselves: tests/test_configs.py;
the flags on top: tests/test_cli.py.)"""

from __future__ import annotations

import pytest
from helpers import ROOT

from rhhjax import config_files, configs
from rhhjax.config_files import ConfigArgumentError


def _refusal(argument: str) -> str:
    with pytest.raises(ConfigArgumentError) as info:
        config_files.load_config_file(argument)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_an_installed_name_is_the_installed_module_and_a_path_is_that_file(tmp_path):
    module, config = config_files.load_config_file("ptb:cpu")
    assert module is configs.ptb and config.to_dict() == configs.ptb.get_config("cpu").to_dict()
    copy = tmp_path / "ptb.py"
    copy.write_text("def get_config(variant=''):\n    return {'variant': variant}\n")
    module, config = config_files.load_config_file(f"{copy}:tiny")
    assert module is not configs.ptb and config == {"variant": "tiny"}
    assert config_files.resolve_config_argument("ptb:cpu").endswith("/configs/ptb.py:cpu")
    assert config_files.resolve_config_argument(f"{copy}:cpu") == f"{copy}:cpu"


def test_every_refusal_is_one_line(tmp_path):
    assert _refusal("wiki") == "unknown config 'wiki': one of ptb, enwik8, text8, or a .py file"
    assert _refusal("nowhere/x.py:cpu").startswith("config file nowhere/x.py not found (or ")
    broken, empty = tmp_path / "broken.py", tmp_path / "empty.py"
    broken.write_text("raise RuntimeError('half-written\\nfile')\n")
    empty.write_text("X = 1\n")
    assert _refusal(str(broken)).startswith(f"cannot load config file {broken}: ")
    assert _refusal(str(empty)) == f"config file {empty} defines no get_config()"
    assert "unknown variant 'gpu' of configs/ptb.py" in _refusal("ptb:gpu")


def test_overrides_are_applied_and_a_malformed_one_is_one_line():
    assert config_files.load("ptb:cpu", ["model.depth=3"]).model.depth == 3
    assert config_files.load("ptb", {"seed": 7}).seed == 7
    with pytest.raises(ConfigArgumentError, match="'model.depth' is not block.field=value"):
        config_files.load("ptb", ["model.depth"])


def test_the_docs_unknown_variant_example_is_the_message_a_run_gives():
    """docs/operations.md showed the variants without `fast`."""
    docs = (ROOT / "docs" / "operations.md").read_text()
    (shown,) = [line for line in docs.splitlines() if line.startswith("error: unknown variant")]
    assert shown == f"error: {_refusal('ptb:gpu')}"
