"""rhhjax.config_fields: the one dotted-field lookup, its "did you mean" hint, and the property
that every program naming a config field (config overrides, --config.<field>=, --sweep and
--variant) gives the same hint for the same typo."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from rhhjax import cli, config_fields, configs
from rhhjax.errors import UserError
from rhhjax.tools import ablate


def _miss(config, field: str) -> config_fields.UnknownField:
    with pytest.raises(config_fields.UnknownField) as info:
        config_fields.lookup(config, field)
    return info.value


def test_lookup_walks_sections_to_a_value_or_a_section():
    config = configs.load("ptb", ["model.depth=5"])
    assert config_fields.lookup(config, "model.depth") == 5
    assert config_fields.lookup(config, "model") is config.model
    plain = {"a": {"b": {"c": 3}}}  # nested mappings, not only ConfigDicts
    assert config_fields.lookup(plain, "a.b.c") == 3
    assert _miss(plain, "a.d.c").missing == "a.d"


def test_the_hint_names_the_closest_sibling_of_the_first_missing_part():
    config = configs.load("ptb")
    assert _miss(config, "model.dept").hint == " (did you mean model.depth?)"
    assert _miss(config, "modle.depth").hint == " (did you mean model?)"
    nested = {"model": {"blocks": {"size": 1}}}  # a section inside a section
    assert _miss(nested, "model.blocs.size").hint == " (did you mean model.blocks?)"
    assert _miss(nested, "model.blocks.sise").hint == " (did you mean model.blocks.size?)"
    assert _miss(config, "model.zzzzzz").hint == ""
    miss = _miss(config, "modle.depth.x")
    assert (miss.missing, miss.parent, miss.under_value) == ("modle", "", False)


def test_a_part_below_a_value_is_missing_with_no_hint():
    miss = _miss(configs.load("ptb"), "model.depth.x.y")
    assert (miss.missing, miss.parent, miss.under_value, miss.hint) == (
        "model.depth.x",
        "model.depth",
        True,
        "",
    )


def _hint(message: str) -> str:
    """The "did you mean" hint that ends a one-line error message ("" when it has none)."""
    found = re.search(r" \(did you mean [^ )]+\?\)$", message)
    return found.group(0) if found else ""


TYPOS = [
    "model.dept",  # a typo in the last part
    "model.hyper_rnk",
    "train.max_setps",
    "modle.depth",  # in a section's name: the section is the hint
    "trian.learning_rate",
    "seeed",  # a top-level field
    "model.xy",  # nothing close
    "model.zzzzzz",
    "model.depth.x",  # below a value
]


@pytest.mark.parametrize("typo", TYPOS)
def test_every_program_gives_the_same_hint_for_the_same_typo(typo):
    config = configs.load("ptb")
    expected = _miss(config, typo).hint
    with pytest.raises(UserError) as override:
        configs.load("ptb", [f"{typo}=1"])
    with pytest.raises(cli.ConfigArgumentError) as flag:
        cli.check_override(config, typo)
    with pytest.raises(ablate.SweepError) as sweep:
        ablate.parse_sweep(f"{typo}=1", config)
    with pytest.raises(ablate.SweepError) as variant:
        ablate.parse_variant(f"v:{typo}=1", config)
    hints = [_hint(str(e.value)) for e in (override, flag, sweep, variant)]
    assert hints == [expected] * 4
    assert (expected != "") == (typo not in ("model.xy", "model.zzzzzz", "model.depth.x"))


def test_the_lookup_imports_nothing_of_the_project():
    """configs/, the library and the tools all import it: it must import none of them."""
    code = (
        "import sys\nimport rhhjax.config_fields\n"
        "print(sorted(m for m in sys.modules if m.startswith(('rhhjax.', 'ml_collections'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['rhhjax.config_fields']"
