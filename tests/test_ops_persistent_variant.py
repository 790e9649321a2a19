"""`rhhjax.ops.persistent_variant`: ``model.persistent``'s fields make one variant or one error
line before anything is built, its text form round-trips (recorded texts read as today's), the
tuning space is a small product, and `PersistentVariant.planned` puts each field on the plan."""

import dataclasses

import pytest
from rhhjax.kernels.mosaic import persistent_backward as pb
from rhhjax.kernels.mosaic.plan import PlanError

from rhhjax import models
from rhhjax.ops import persistent_plans
from rhhjax.ops import persistent_variant as pv
from rhhjax.ops.persistent_variant import PersistentVariant, parse_variant
from rhhjax.train import config as train_config


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"layout": "diagonal"}, "layout='diagonal' is not one of"),
        ({"stages": "two"}, "stages='two' is not a whole number"),
        ({"stages": -3}, "stages=-3 must be 0 or >= 1"),
        ({"k_chunk": 32}, "field 'k_chunk' was removed: the K chunk is the plan's"),
        ({"epilogue": "l2"}, "epilogue='l2' is not one of"),
        ({"units": 6}, "units=6 must be 0 or >= 4, a multiple of 4"),
        ({"sharing": "both"}, "sharing='both' is not one of"),
        ({"hyper_inside": 1}, "field 'hyper_inside' was removed: .* \\+6.3 ms"),
        ({"in_flight": 1}, "field 'in_flight' was removed: .* \\+1.9 to \\+3.4 ms"),
        ({"depth": 3}, "field 'depth' is not one of epilogue, layout, sharing, stages, units"),
    ],
)
def test_a_bad_field_is_one_config_error_line_before_anything_is_built(fields, words):
    with pytest.raises(models.ConfigError, match=words) as error:
        models.ModelConfig.from_config({"impl": "persistent", "persistent": fields})
    line = str(error.value)
    assert line.startswith("model.persistent: ") and "\n" not in line


def test_the_config_sets_each_field_like_any_other():
    """``--config.model.persistent.stages=6`` sets one field; the others stay at default."""
    config = train_config.default_config()
    assert dict(config.model.persistent) == dataclasses.asdict(PersistentVariant())
    config.model.persistent.stages = 6
    config.model.persistent.sharing = "multicast"
    model = models.ModelConfig.from_config(config.model)
    assert model.persistent == PersistentVariant(stages=6, sharing="multicast")
    assert hash(model) == hash(dataclasses.replace(model))


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("hyper_inside=1", "was removed: .* \\+6.3 ms"),  # the GPU measured it slower
        ("prefetch=1", "was removed: .* \\+1.2 ms"),
        ("hyper_blocks=own", "was removed"),
        ("status=later", "was removed: .* checked on the device in training"),
        ("fast", "key one of"),
        ("", "is empty"),
        ("stages=-3", "stages='-3' is not a whole number >= 0"),
        ("stages=2,stages=3", "gives stages twice: keep one stages=..."),
    ],
)
def test_a_bad_text_is_one_variant_error_line(text, words):
    with pytest.raises(pv.VariantError, match=words) as error:
        parse_variant(text)
    assert "\n" not in str(error.value)


def test_a_text_round_trips_and_keys_left_out_are_defaults():
    variant = parse_variant(" stages=2 , layout=grid,units=32")
    assert variant == PersistentVariant(layout="grid", stages=2, units=32)
    assert variant.text() == "layout=grid,stages=2,units=32"
    assert parse_variant(variant.text()) == variant
    assert parse_variant("default") == PersistentVariant() == parse_variant("layout=rowgroup")
    for variant in pv.tuning_space():
        assert parse_variant(variant.text()) == variant


@pytest.mark.parametrize(
    ("recorded", "today"),
    [
        ("layout=grid,status=poison", PersistentVariant("grid")),
        ("layout=rowgroup,status=host", PersistentVariant()),
        ("hyper_inside=0,layout=rowgroup", PersistentVariant()),
        ("layout=rowgroup,multicast=1", PersistentVariant(sharing="multicast")),
        ("layout=grid,stages=4,k_chunk=32,split_k=1",
         PersistentVariant("grid", stages=4, sharing="split_k")),
    ],
)  # fmt: skip
def test_the_texts_of_recorded_runs_name_todays_variant(recorded, today):
    """The 2026-11-28 runs and tables wrote ``status=``, ``hyper_inside=0``, ``multicast=1``,
    ``split_k=1`` and ``k_chunk=32`` (beside stages 4 or 6: the widest K chunk that fits);
    each reads as the variant that runs the same kernels today."""
    assert parse_variant(recorded) == today


@pytest.mark.parametrize(
    ("text", "fields"),
    [
        ("default", {}),
        ("auto", {}),
        ("stages=2", {"layout": "grid", "stages": 2}),  # the grid was the default then
        ("layout=rowgroup,multicast=1", {"sharing": "multicast"}),
    ],
)
def test_an_older_configs_variant_text_becomes_the_fields(text, fields):
    config = train_config.default_config().to_dict()
    del config["model"]["persistent"]
    config["model"]["persistent_variant"] = text
    prepared = train_config.prepare_config(config)
    assert "persistent_variant" not in prepared.model
    model = models.ModelConfig.from_config(prepared.model)
    assert model.persistent == PersistentVariant(**fields)


def test_the_tuning_space_is_a_product_and_two_paired_variants_the_default_first():
    """TUNING's product (16), the second design's right after the default, then the paired
    layout at the default's fields and the second design's."""
    space = pv.tuning_space()
    assert space[0] == PersistentVariant()
    assert len(space) == len(set(space)) <= 18
    sizes = [len(values) for values in pv.TUNING.values()]
    product = [v for v in space if v.layout != pv.PAIRED]
    assert len(product) == sizes[0] * sizes[1] * sizes[2] and len(pv.TUNING) == 3
    second = PersistentVariant(sharing="producer", epilogue="registers")
    assert space[3] == second
    paired = [PersistentVariant(pv.PAIRED), dataclasses.replace(second, layout=pv.PAIRED)]
    assert space[4:6] == paired
    assert len(dataclasses.fields(PersistentVariant)) <= 5
    tested = [v == dataclasses.replace(v, layout="rowgroup", sharing="none",
              epilogue="shared_memory") for v in space]  # fmt: skip
    assert [v.tested_on_a_gpu() for v in space] == tested


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_planned_puts_each_field_on_the_paper_plan(dtype):
    grid = persistent_plans.plan_for(256, 1000, dtype)
    rowgroup = persistent_plans.plan_for(256, 1000, dtype, "rowgroup")
    assert PersistentVariant().planned(rowgroup) is rowgroup
    producer = PersistentVariant(sharing="producer").planned(rowgroup)
    assert producer == dataclasses.replace(rowgroup, producer=True)
    multicast = PersistentVariant(sharing="multicast").planned(rowgroup)
    assert multicast == dataclasses.replace(rowgroup, multicast_a=True)
    shared_weights = PersistentVariant("grid", sharing="multicast").planned(grid)
    assert shared_weights == dataclasses.replace(grid, multicast_b=True)
    one_row_block = persistent_plans.plan_for(64, 1000, dtype)  # nothing to share: as it is
    assert one_row_block.row_blocks == 1
    assert PersistentVariant("grid", sharing="multicast").planned(one_row_block) == one_row_block
    wide = PersistentVariant("grid", stages=2, units=32).planned(grid)
    assert (wide.units_per_block, wide.col_blocks, wide.row_blocks) == (32, 32, 4)
    assert (wide.stages, wide.k_chunk) == (2, grid.k_chunk)
    split = PersistentVariant("grid", stages=2, sharing="split_k").planned(grid)
    chunk = 32 if dtype == "bfloat16" else 64  # the widest at which two warpgroups' stages fit
    assert split == dataclasses.replace(grid, split_k=True, k_chunk=chunk, stages=2)
    registers = PersistentVariant(epilogue="registers").planned(rowgroup)
    assert registers.in_registers and registers.stages >= rowgroup.stages
    with pytest.raises(PlanError, match="shared memory"):  # two warpgroups' stages at its own
        PersistentVariant("grid", sharing="split_k").planned(grid)


def test_stages_alone_take_the_widest_k_chunk_that_fits():
    """bf16's paper plan runs 3 stages of 64; 4 and 6 stages fit only at 32."""
    plan = persistent_plans.plan_for(256, 1000, "bfloat16", "rowgroup")
    assert (plan.stages, plan.k_chunk) == (3, 64)
    for stages in (4, 6):
        deeper = PersistentVariant(stages=stages).planned(plan)
        assert (deeper.stages, deeper.k_chunk) == (stages, 32)
    with pytest.raises(PlanError, match="stages=32, shared=none: .* shared memory") as error:
        PersistentVariant(stages=32).planned(plan)
    assert "\n" not in str(error.value)


def test_the_epilogue_in_registers_runs_deeper_where_its_tile_left_shared_memory():
    """Without the f32 GEMM tile and the bias tiles in shared memory the paper bf16 plan
    holds 5 stages of 64 (3 with them), 8 of 32 (16 with them); a config of the former
    field ``k_chunk=0`` reads."""
    plan = persistent_plans.plan_for(256, 1000, "bfloat16", "rowgroup")
    deepest = PersistentVariant(epilogue="registers").planned(plan)
    assert deepest == dataclasses.replace(plan, in_registers=True, stages=5)
    with_tiles = dataclasses.replace(deepest, in_registers=False)
    assert deepest.smem_bytes() <= plan.smem_limit < with_tiles.smem_bytes()
    assert plan.smem_limit < pb.backward_smem_bytes(with_tiles)
    eight = PersistentVariant(stages=8, epilogue="registers").planned(plan)
    assert (eight.stages, eight.k_chunk) == (8, 32)
    assert PersistentVariant(stages=8).planned(plan).k_chunk == 16  # with the tile
    assert pv.from_fields({"k_chunk": 0, "epilogue": "registers"}).epilogue == "registers"
    hyper = persistent_plans.plan_for(128, 128, "bfloat16", "rowgroup")  # batch 128's
    assert hyper.units_per_block == 16  # less than a swizzled tile's row: 32 units a block
    assert PersistentVariant(epilogue="registers").planned(hyper).units_per_block == 32
