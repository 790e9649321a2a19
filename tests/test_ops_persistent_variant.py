"""`rhhjax.ops.persistent_variant`: a variant's text parses to one variant or one error line
before anything is built, and `PersistentVariant.planned` puts each option on the plan."""

import dataclasses

import pytest
from rhhjax.kernels.mosaic.plan import PlanError

from rhhjax import models
from rhhjax.ops import persistent_cost
from rhhjax.ops.persistent_variant import PersistentVariant, parse_variant


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("layout=diagonal", "is not one of"),
        ("stages=two", "is not a whole number >= 0"),
        ("hyper_inside=1", "was removed: .* \\+6.3 ms"),  # the GPU measured it slower
        ("k_chunk=12", "multiple of 8"),
        ("in_flight=1", "was removed: .* \\+1.9 to \\+3.4 ms"),
        ("prefetch=1", "was removed: .* \\+1.2 ms"),
        ("units=6", "must be >= 4 and a multiple of 4"),
        ("hyper_blocks=own", "was removed"),
        ("status=later", "was removed: .* checked on the device in training"),
        ("split_k=2", "must be 0 or 1"),
        ("split_k=1,layout=rowgroup,multicast=1", "runs without multicast"),
        ("depth=3", "key one of"),
        ("fast", "key one of"),
        ("", "is empty"),
        ("stages=-3", "stages='-3' is not a whole number >= 0"),
        ("stages=2,stages=3", "gives stages twice: keep one stages=..."),
    ],
)
def test_a_bad_variant_is_one_config_error_line_before_anything_is_built(text, words):
    with pytest.raises(models.ConfigError, match=words) as error:
        models.ModelConfig.from_config({"impl": "persistent", "persistent_variant": text})
    line = str(error.value)
    assert line.startswith(f"model.persistent_variant={text!r} ") and "\n" not in line


def test_a_text_round_trips_and_keys_left_out_are_defaults():
    variant = parse_variant(" stages=2 , layout=rowgroup,units=32")
    assert variant == PersistentVariant(layout="rowgroup", stages=2, units=32)
    assert parse_variant(variant.text()) == variant
    split = parse_variant("split_k=1,k_chunk=32")
    assert split == PersistentVariant(k_chunk=32, split_k=1)
    assert split.text() == "layout=grid,k_chunk=32,split_k=1"
    assert parse_variant(split.text()) == split
    assert parse_variant("default") is None and parse_variant("auto") is None


@pytest.mark.parametrize("layout", ["grid", "rowgroup"])
@pytest.mark.parametrize("status", ["host", "poison"])
def test_the_status_texts_of_recorded_runs_name_todays_variant(layout, status):
    """The 2026-11-28 runs and tables wrote ``status=host|poison``; the grid's give-up is
    now always checked on the device in training, so both name the variant without it."""
    recorded = parse_variant(f"layout={layout},status={status}")
    assert recorded == PersistentVariant(layout) and recorded.text() == f"layout={layout}"


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_planned_puts_each_option_on_the_paper_plan(dtype):
    grid = persistent_cost.plan_for(256, 1000, dtype)
    rowgroup = persistent_cost.plan_for(256, 1000, dtype, "rowgroup")
    assert PersistentVariant().planned(grid) is grid
    multicast = parse_variant("layout=rowgroup,multicast=1").planned(rowgroup)
    assert multicast == dataclasses.replace(rowgroup, multicast_a=True)
    shared_weights = parse_variant("multicast=1").planned(grid)
    assert shared_weights == dataclasses.replace(grid, multicast_b=True)
    one_row_block = persistent_cost.plan_for(64, 1000, dtype)  # nothing to share: as it is
    assert one_row_block.row_blocks == 1
    assert parse_variant("multicast=1").planned(one_row_block) == one_row_block
    wide = parse_variant("units=32,stages=2").planned(grid)
    assert (wide.units_per_block, wide.col_blocks, wide.row_blocks) == (32, 32, 4)
    assert (wide.stages, wide.k_chunk) == (2, grid.k_chunk)
    split = parse_variant("split_k=1,k_chunk=32,stages=2").planned(grid)
    assert split == dataclasses.replace(grid, split_k=True, k_chunk=32, stages=2)
    with pytest.raises(PlanError, match="shared memory"):  # two warpgroups' stages at its own
        parse_variant("split_k=1").planned(grid)
