"""`rhhjax.ops.persistent` (impl="persistent"): one persistent Mosaic GPU kernel for the whole
forward time loop and one for the whole backward.

On a CPU: the registration, the one-line refusals (off a GPU, variational dropout) and that
their advice runs, rank-d running `fused` in its place, the plan chosen for a size (and the
one-block plan of GPU interpret mode), and the whole model against `scan` (loss and every
gradient; f32, bf16, gate dropout, odd sizes, `original_first_step`) with the kernels'
pure-JAX references in their place (`TestPersistentReference`, any jax) and with the real
kernels executed in GPU interpret mode, race detector on (`TestPersistentInterpret`, jax >=
0.11.2). ``gpu_compile``: the paper-size HyperRHN training step with impl="persistent" lowers
and compiles for an H100 without a GPU. `TestPersistentCompiled`: the same comparisons with
the compiled kernels, on a GPU only.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_cases import assert_no_spills, compile_paper_step, mosaic_mode_skip, needs_cuda
from model_cases import (
    KERNEL_TOL,
    KERNEL_TOL_COMPILED,
    TWO_ROW_BLOCKS,
    KernelModelMatchesScan,
    assert_compiled_off_a_gpu_lowers_but_does_not_execute,
    assert_interpret_mode_runs_or_names_the_jax,
    assert_off_gpu_refusal_advises_what_runs,
    assert_trees_close,
    loss_and_grads,
)
from rhhjax.kernels.hardware import H100
from rhhjax.kernels.mosaic import persistent_forward as pf
from rhhjax.kernels.mosaic import persistent_slots as slots
from rhhjax.kernels.mosaic.plan import PersistentPlan, PlanError

from rhhjax import models
from rhhjax.ops import fused, persistent, persistent_cost, spec
from rhhjax.ops.persistent_cost import predicted_phase_us


def test_persistent_is_registered_but_not_ranked_for_auto():
    assert spec.IMPLEMENTATIONS["persistent"] is persistent
    for ranking, _ in spec._MEASURED.values():
        assert "persistent" not in ranking  # not measured yet
    for platform in ("gpu", "cpu"):
        facts = spec.ModelFacts("hyperrhn")
        assert spec.resolve("auto", facts, dtype="bfloat16", platform=platform).impl != (
            "persistent"
        )


@pytest.mark.parametrize("platform", ["cpu", "tpu"])
def test_off_a_gpu_persistent_is_refused_in_one_line_whose_advice_runs(platform):
    assert_off_gpu_refusal_advises_what_runs("persistent", platform)


def test_interpret_mode_runs_the_kernels_interpreted_or_names_the_jax_it_needs():
    assert_interpret_mode_runs_or_names_the_jax("persistent")


def test_compiled_off_a_gpu_lowers_but_the_trainer_refuses_to_execute_it():
    assert_compiled_off_a_gpu_lowers_but_does_not_execute("persistent")


def test_variational_dropout_is_refused_in_one_line_on_any_platform():
    with pytest.raises(spec.UnsupportedImpl, match="variational") as error:
        spec.check("persistent", spec.ModelFacts("hyperrhn", dropout="variational"))
    assert "\n" not in str(error.value)


def test_a_rank_d_hyperrhn_runs_fused_and_the_reason_says_so():
    resolved = spec.resolve(
        "persistent", spec.ModelFacts("hyperrhn", hyper_rank=4), dtype="bfloat16", platform="gpu"
    )
    assert resolved.impl == fused.NAME
    assert "no rank-d kernels" in resolved.reason and "hyper_rank=4" in resolved.reason
    line = models.implementation_line("persistent", resolved.impl, resolved.reason)
    assert line.startswith("model.impl=persistent runs fused: ") and "\n" not in line


def _predicted(plan):
    return predicted_phase_us(plan) + predicted_phase_us(plan, backward=True)


@pytest.mark.parametrize(("batch", "width"), [(256, 1000), (256, 128), (5, 13), (3, 70), (64, 8)])
def test_the_plan_is_a_runnable_one_of_the_lowest_predicted_phase_time(batch, width):
    plan = persistent.plan_for(batch, width, "bfloat16")
    plan.check()
    assert plan.units_per_block % 8 == 0 and plan.n_pad >= width
    assert plan.k_pad <= plan.n_pad and (2 * plan.n_pad) % plan.k_chunk == 0
    assert plan.b_pad % 64 == 0 and plan.b_pad - batch < 64 * plan.row_blocks
    assert plan.grid <= H100.sms
    others = list(persistent_cost.candidates(batch, width, "bfloat16"))
    assert plan in others and len(others) > 1
    assert all(_predicted(plan) <= _predicted(other) for other in others)


def test_the_paper_plan_is_predicted_faster_than_one_row_block_of_132():
    plan = persistent.plan_for(256, 1000, "bfloat16")
    one_row = PersistentPlan(256, 1000, "bfloat16", col_blocks=132, units=8)
    assert _predicted(plan) < _predicted(one_row)
    assert plan.row_blocks > 1


def test_the_plan_of_the_paper_width_fits_shared_memory_in_both_dtypes():
    for dtype in ("bfloat16", "float32"):
        plan = persistent.plan_for(256, 1000, dtype)
        assert plan.smem_bytes() <= plan.smem_limit
        assert persistent.pb.backward_smem_bytes(plan) <= plan.smem_limit


def test_a_width_past_the_sms_is_one_plan_error_line():
    with pytest.raises(persistent.PlanError) as error:
        persistent.plan_for(64, max(persistent_cost.UNITS) * H100.sms + 1, "bfloat16")
    assert "\n" not in str(error.value) and "blocks" in str(error.value)


@pytest.mark.parametrize(("batch", "width"), [(5, 13), (3, 70), (4, 6), (64, 1)])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_interpret_mode_plans_the_fewest_blocks_that_both_kernels_accept(
    batch, width, dtype, monkeypatch
):
    """GPU interpret mode runs a plan's blocks as one cluster of threads: its plan is the
    H100 plan of the fewest blocks (at the model tests' sizes one to four), and the
    interpreted model's geometry is that plan's."""
    monkeypatch.setenv("NPROC", "17")  # XLA's CPU pool as the tests' conftest sizes it
    persistent.interpret_plan.cache_clear()
    plan = persistent.interpret_plan(batch, width, dtype)
    candidates = list(persistent_cost.candidates(batch, width, dtype))
    assert plan in candidates and plan.grid == min(c.grid for c in candidates) <= 4
    plan.check_interpretable()
    interpreted = spec.SequenceSpec("persistent", 1.0, jnp.dtype(dtype), interpret=True)
    geo = persistent.geometry(interpreted, batch, width)
    assert (geo.b_pad, geo.n_pad) == (plan.b_pad, plan.n_pad)


def test_a_model_of_more_blocks_than_interpret_mode_runs_is_one_plan_error_line():
    persistent.interpret_plan.cache_clear()
    with pytest.raises(persistent.PlanError, match="GPU interpret mode runs") as error:
        persistent.interpret_plan(64, 2000, "bfloat16")  # 32 blocks of 64 units
    line = str(error.value)
    assert "\n" not in line and "needs 32 blocks" in line and "impl='mosaic'" in line, line
    assert "NPROC" not in line  # more NPROC would not help past 24 blocks


def test_a_model_past_the_cpu_pool_in_interpret_mode_names_the_nproc_that_runs_it(monkeypatch):
    monkeypatch.setenv("NPROC", "2")
    persistent.interpret_plan.cache_clear()
    with pytest.raises(persistent.PlanError, match="NPROC=3") as error:
        persistent.interpret_plan(4, 8, "float32")  # 2 blocks of 32 units (f32 smem)
    assert "\n" not in str(error.value)
    persistent.interpret_plan.cache_clear()


def test_geometry_is_the_plan_layout():
    geo = persistent.geometry(spec.SequenceSpec("persistent", 1.0, jnp.bfloat16), 5, 13)
    plan = persistent.plan_for(5, 13, "bfloat16")
    assert (geo.b_pad, geo.n_pad, geo.block_n) == (plan.b_pad, plan.n_pad, plan.units_per_block)


def test_saved_rows_are_fuseds_gates_or_with_z_full_alone():
    """With z the backward kernel recomputes the gates from full: the forward saves it alone."""
    assert persistent.saved_rows(False) == fused.saved_rows(False)
    assert persistent.saved_rows(True) == (("full", 2),)
    assert dict(fused.saved_rows(True))["full"] == 2


@pytest.mark.parametrize(("steps", "depth"), [(3, 1), (2, 3), (1, 2)])
def test_states_are_the_next_phases_packed_input_rows_then_the_last_state(steps, depth):
    """The forward kernel writes each state once (as the next phase's packed row 0) and the
    last state apart: `_states_from_packed` puts them back as states [T, L, Bp, Np]."""
    phases = steps * depth
    rng = np.random.default_rng(steps * 10 + depth)
    packed = jnp.asarray(rng.standard_normal((phases, 4, 5, 8)), jnp.float32)
    s_last = jnp.asarray(rng.standard_normal((1, 4, 8)), jnp.float32)
    states = persistent._states_from_packed(packed, s_last, depth)
    assert states.shape == (steps, depth, 4, 8)
    flat = np.asarray(states).reshape(phases, 4, 8)
    np.testing.assert_array_equal(flat[:-1], packed[1:, :, 0])
    np.testing.assert_array_equal(flat[-1], s_last[0])


@pytest.mark.parametrize(("steps", "depth"), [(3, 1), (2, 3), (1, 2)])
def test_f32_states_are_the_a_buffers_slots_then_the_last_state(steps, depth):
    """In f32 the input states are s_mm's rows (layer-major slots, K columns; zero past
    them): `_states_from_s_mm` gives what `_states_from_packed` gives from them as row 0."""
    phases, k_pad = steps * depth, 6
    rng = np.random.default_rng(steps * 10 + depth + 1)
    inputs = jnp.asarray(rng.standard_normal((phases, 4, 8)), jnp.float32).at[..., k_pad:].set(0)
    s_last = jnp.asarray(rng.standard_normal((1, 4, 8)), jnp.float32)
    s_mm = slots.inputs_to_a_buffer(inputs, steps, depth, k_pad)
    states = persistent._states_from_s_mm(s_mm, s_last, steps, depth)
    packed = jnp.stack([inputs, inputs], axis=2)  # row 0: the input states
    expected = persistent._states_from_packed(packed, s_last, depth)
    np.testing.assert_array_equal(states, expected)


# ----------------------------------------------------------------------------- the model

# HyperRHNs of a few blocks also in GPU interpret mode: (hidden, hyper_hidden, depth, batch,
# length, original_first_step), f32, gate dropout.
VARIANT_CASES = [(64, 32, 3, 4, 3, True), (96, 20, 2, 5, 4, False)]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_paper_variant_candidates_are_runnable_distinct_and_today_first(dtype):
    """`variant_candidates`: today's variant first (the row-group layout), the grid, then the
    grid with each option that makes another run (the row-group layout is today's; f32's plan
    already has 32 units), each accepted by the plans' own checks (both kernels, the layout)
    and running other plans."""
    found = persistent.variant_candidates(256, 1000, 128, dtype)
    assert found[0] == persistent.default_variant() == persistent.PersistentVariant("rowgroup")
    assert found[1] == persistent.PersistentVariant()  # the grid
    plans = [persistent.variant_plans(v, 256, 1000, 128, dtype) for v in found]
    assert len(set(found)) == len(found) == len(set(plans)) > 4
    options = [dataclasses.replace(found[1], **option) for option in persistent.OPTIONS]
    grid = plans[1][1]
    # f32: an option of the grid's units is a twin; its row-group blocks (64 f32 units) leave
    # no shared memory for a second warpgroup's stages
    f32_drops = lambda v: v.units == grid.units or (v.split_k and v.layout == "rowgroup")  # noqa: E731
    kept = [v for v in options if v != found[0] and (dtype != "float32" or not f32_drops(v))]
    assert found[2 : 2 + len(kept)] == kept  # the grid's options are timed next
    assert len(kept) == len(options) - 1 - 2 * (dtype == "float32")
    for variant, (layout, main, *_) in zip(kept, plans[2:], strict=False):
        assert layout == variant.layout and main.multicast == bool(variant.multicast)
        assert main.multicast_b == (variant.multicast and layout == "grid")
        assert main.split_k == bool(variant.split_k)
        if variant.units:  # 32 units: 4 x 32 blocks, 128 of an H100's 132 SMs
            assert (main.units_per_block, main.grid) == (variant.units, 128)
    for variant, (layout, main, hyper) in zip(found, plans, strict=True):
        assert layout == variant.layout
        for plan in (main, hyper):
            persistent_cost.check_runnable(plan)
    assert {v.layout for v in found} == {"grid", "rowgroup"}


def test_a_variant_text_round_trips_through_the_config_into_the_spec():
    for variant in persistent.variant_candidates(256, 1000, 128, "bfloat16"):
        assert persistent.parse_variant(variant.text()) == variant
        config = models.ModelConfig(impl="persistent", persistent_variant=variant.text())
        config.validate()
        assert models.sequence_spec(config, platform="gpu").variant == variant
    partial = persistent.parse_variant(" stages=2 , hyper_inside=0")  # an older text
    assert partial == persistent.PersistentVariant(stages=2)
    for removed in ("hyper_inside=1", "hyper_blocks=own", "in_flight=1", "prefetch=1"):
        with pytest.raises(persistent.VariantError, match="was removed: .* ms"):
            persistent.parse_variant(removed)


def test_by_default_the_variant_is_todays_the_module_layout_where_its_plan_runs():
    """ "default": the spec carries none and the op reads the module's LAYOUT (the row-group
    layout, and the plan's pipeline) where its plan runs, else the grid; LAYOUT still steers
    it, as bench.py sets it."""
    resolved = models.sequence_spec(models.ModelConfig(impl="persistent"), platform="gpu")
    assert resolved.variant is None and models.ModelConfig().persistent_variant == "default"
    rowgroup, grid = persistent.PersistentVariant("rowgroup"), persistent.PersistentVariant()
    assert persistent.variant_of(resolved) == rowgroup == persistent.default_variant()
    assert persistent.variant_at(resolved, 256, 1000) == rowgroup
    want = persistent.plan_for(256, 1000, "float32", "rowgroup")
    assert persistent._plan_of(resolved, 256, 1000) == want
    # 1,200 bf16 units need more column blocks than a cluster holds: the grid
    bf16 = dataclasses.replace(resolved, dtype=jnp.bfloat16)
    with pytest.raises(PlanError):
        persistent.variant_plans(rowgroup, 256, 1200, 0, "bfloat16")
    assert persistent.variant_at(bf16, 256, 1200) == grid
    assert persistent._plan_of(bf16, 256, 1200) == persistent.plan_for(256, 1200, "bfloat16")
    explicit = dataclasses.replace(bf16, variant=rowgroup)  # asked for: kept, to fail
    assert persistent.variant_at(explicit, 256, 1200) == rowgroup
    assert models.sequence_spec(models.ModelConfig(impl="fused")).variant is None


def test_a_variant_of_too_many_blocks_is_one_plan_error_line():
    """8 units a block: 4 x 125 blocks, over an H100's SMs (the plans' own check)."""
    variant = persistent.parse_variant("units=8")
    with pytest.raises(PlanError, match="units=8") as error:
        persistent.variant_plans(variant, 256, 1000, 128, "bfloat16")
    assert "\n" not in str(error.value)


def test_a_variant_whose_pipeline_does_not_fit_is_one_plan_error_line():
    """bf16 at 4 stages of 64: over a block's shared memory (the plan's own check)."""
    variant = persistent.parse_variant("stages=4,k_chunk=64")
    with pytest.raises(PlanError, match="shared memory") as error:
        persistent.variant_plans(variant, 256, 1000, 128, "bfloat16")
    assert "\n" not in str(error.value) and "stages=4, k_chunk=64" in str(error.value)


def test_a_grid_barrier_that_gave_up_is_nan_in_training_and_one_host_line_elsewhere(
    monkeypatch,
):
    """In a training step (an output named) a block's non-zero status turns that output NaN
    (the loss or gradient the trainer checks) and the host is not called; the evaluation
    forward (none named) checks the status on the host."""
    host = []
    monkeypatch.setattr(persistent.grid_barrier, "check_status", lambda s, n: host.append(n))
    grid = persistent.PersistentVariant("grid")
    value, other = jnp.arange(4.0), jnp.ones((2, 3), jnp.bfloat16)
    gave_up, fine = jnp.array([0, 0, 3], jnp.int32), jnp.zeros(3, jnp.int32)
    for status, expect_nan in ((gave_up, True), (fine, False)):
        outs = pf.Saved(value, other, other, status)
        out = persistent._checked(grid, outs, "s_last", "forward")
        assert bool(jnp.all(jnp.isnan(out.s_last))) == expect_nan and not host
        assert out.s_last.dtype == value.dtype and out.packed is other
        if not expect_nan:
            np.testing.assert_array_equal(out.s_last, value)
    out = persistent._checked(grid, pf.States(value, other, gave_up), None, "eval")
    assert out.states is value and host == ["eval"]


def test_the_row_group_layout_has_no_status_to_check(monkeypatch):
    """Its cluster barriers cannot give up (the kernels' status stays 0): no host check and
    no NaN, in training or evaluation."""
    host = []
    monkeypatch.setattr(persistent.grid_barrier, "check_status", lambda s, n: host.append(n))
    config = models.ModelConfig(impl="persistent", persistent_variant="layout=rowgroup")
    rowgroup = models.sequence_spec(config, platform="gpu")
    value, status = jnp.arange(4.0), jnp.array([0, 5, 0], jnp.int32)
    for named in ("s_last", None):
        outs = pf.Saved(value, value, value, status)
        assert persistent._checked(rowgroup.variant, outs, named, "forward") is outs
        assert not host


@pytest.mark.parametrize(
    "text, hidden, expected",
    [("layout=grid", 1000, True), ("layout=rowgroup", 1000, False), ("default", 1000, False),
     ("auto", 1000, False), ("default", 1200, True)],  # 1200: no row-group plan, the grid
)  # fmt: skip
def test_a_grid_barrier_runs_where_the_variant_or_its_fallback_is_the_grid(text, hidden, expected):
    assert persistent.grid_barrier_runs(text, 256, hidden, 128, "bfloat16") == expected


class VariantMatchesScan(KernelModelMatchesScan):
    """The HyperRHN at a ``model.persistent_variant`` against `scan`: loss and every
    gradient."""

    CASES = {
        **KernelModelMatchesScan.CASES,
        "variant_case": VARIANT_CASES,
        "option_case": VARIANT_CASES[:1],  # units=16
    }

    def test_a_variant_of_the_config_matches_scan(self, variant_case, monkeypatch):
        """``model.persistent_variant`` (not the module's default): every plan at 2 pipeline
        stages, the barrier status folded into the step (no block gives up: equal values)."""
        variant = "layout=grid,stages=2"
        hidden, hyper_hidden, _, batch, *_ = variant_case
        spec = self.model(models.ModelConfig(impl=self.IMPL, persistent_variant=variant)).spec
        plans = [persistent._plan_of(spec, batch, n) for n in (hidden, hyper_hidden)]
        assert [plan.stages for plan in plans] == [2, 2]
        self._matches_scan(variant_case, variant)

    def test_a_plan_of_more_blocks_matches_scan(self, option_case, monkeypatch):
        """``units=16``: every cell's plan at 16 units a block (GPU interpret mode's own plan
        here is 2 blocks of 32)."""
        hidden, hyper_hidden, _, batch, *_ = option_case
        variant = "units=16"
        spec = self.model(models.ModelConfig(impl=self.IMPL, persistent_variant=variant)).spec
        plans = [persistent._plan_of(spec, batch, n) for n in (hidden, hyper_hidden)]
        assert [plan.units_per_block for plan in plans] == [16, 16]
        assert plans[0].col_blocks == hidden // 16
        self._matches_scan(option_case, variant)

    def _matches_scan(self, case, variant: str):
        hidden, hyper_hidden, depth, batch, length, first = case
        base = dict(
            type="hyperrhn", vocab_size=11, embed_dim=5, hidden=hidden, hyper_hidden=hyper_hidden,
            depth=depth, dropout="gate", keep=0.7, dtype="float32", original_first_step=first,
        )  # fmt: skip
        scan = models.build_model(models.ModelConfig(**base, impl="scan"))
        config = models.ModelConfig(**base, impl=self.IMPL, persistent_variant=variant)
        model = self.model(config)
        params = models.init_params(scan, jax.random.key(hidden))
        tokens = jnp.asarray(np.random.default_rng(hidden).integers(0, 11, (batch, length + 1)))
        key = jax.random.key(depth)
        actual = loss_and_grads(model, params, tokens, key)
        expected = loss_and_grads(scan, params, tokens, key)
        assert_trees_close(actual, expected, self.TOLERANCE["float32"])


@pytest.mark.pure_jax
class TestPersistentReference(VariantMatchesScan):
    IMPL = "persistent"
    REFERENCES = True
    TOLERANCE = KERNEL_TOL
    # units=16 changes no reference: its tests are the kernels'
    CASES = {**VariantMatchesScan.CASES, "option_case": []}


class TestPersistentCompiled(VariantMatchesScan):
    IMPL = "persistent"
    TOLERANCE = KERNEL_TOL_COMPILED


class TestPersistentInterpret(TestPersistentCompiled):
    INTERPRET = True
    TOLERANCE = KERNEL_TOL
    # the variant at the smaller case only: the larger runs in the default's test
    CASES = {**VariantMatchesScan.CASES, "variant_case": VARIANT_CASES[:1]}


class RowgroupLayout:
    """The kernels launched as one cluster per row group (`kernels/mosaic/rowgroup_layout.py`)
    as the first of today's options runs them (`persistent.OPTIONS`, the fastest timed), at the
    model cases of the two layouts' differences: several row groups (batch 4-5)."""

    VARIANT = "layout=rowgroup"
    CASES = {
        "model_case": ["hyperrhn-f32-dropout-odd", "hyperrhn-bf16-dropout-first-step"],
        "variant_case": [],
        "option_case": [],
    }

    def model(self, config):
        model = super().model(dataclasses.replace(config, persistent_variant=self.VARIANT))
        assert model.spec.variant == persistent.parse_variant(self.VARIANT)
        return model


class MulticastRowgroup(RowgroupLayout):
    """The same with each main-GEMM A chunk multicast to its row group's cluster (the
    second option): interpret mode copies it to each block, so only a GPU multicasts."""

    VARIANT = "layout=rowgroup,multicast=1"


def test_the_cluster_classes_run_the_first_three_options():
    options = [
        dataclasses.replace(persistent.PersistentVariant(), **option).text()
        for option in persistent.OPTIONS[:3]
    ]
    assert [RowgroupLayout.VARIANT, MulticastRowgroup.VARIANT, MulticastGrid.VARIANT] == options


class MulticastGrid(RowgroupLayout):
    """The grid layout launched as clusters of a column's row blocks, the weights multicast
    to them (the third option), at a model of 2 row blocks: GPU interpret mode's plans have
    one (the fewest blocks), so the kernels' own tests interpret it."""

    VARIANT = "layout=grid,multicast=1"
    CASES = {**RowgroupLayout.CASES, "model_case": list(TWO_ROW_BLOCKS)}

    def test_evaluation_logits_match_scan(self):
        pytest.skip("its case has one row block: test_loss_and_gradients_match_scan runs it")


class SplitK(RowgroupLayout):
    """The backward's main GEMM split between two warpgroups of each block, at K chunks of
    32 and 2 stages a warpgroup (where the paper's bf16 plan fits them), in the grid."""

    VARIANT = "layout=grid,stages=2,k_chunk=32,split_k=1"


class TestPersistentCompiledRowgroup(RowgroupLayout, TestPersistentCompiled):
    """The row-group layout compiled (`gpu_suite.sh test` runs it on a GPU)."""


class TestPersistentInterpretRowgroup(RowgroupLayout, TestPersistentInterpret):
    """The row-group layout in GPU interpret mode."""


class TestPersistentCompiledMulticast(MulticastRowgroup, TestPersistentCompiled):
    """A multicast in the row-group layout, compiled."""


class TestPersistentInterpretMulticast(MulticastRowgroup, TestPersistentInterpret):
    """A multicast in the row-group layout, in GPU interpret mode."""


class TestPersistentCompiledMulticastGrid(MulticastGrid, TestPersistentCompiled):
    """The weights multicast in the grid layout, compiled."""


class TestPersistentReferenceMulticastGrid(MulticastGrid, TestPersistentReference):
    """The same with the kernels' references in place (its plans, padding and variant)."""


class TestPersistentCompiledSplitK(SplitK, TestPersistentCompiled):
    """The backward's GEMM split between two warpgroups, compiled."""


class TestPersistentInterpretSplitK(SplitK, TestPersistentInterpret):
    """The same in GPU interpret mode."""


# ----------------------------------------------------------------------------- deviceless


@pytest.mark.gpu_compile
@needs_cuda
def test_paper_hyperrhn_training_step_lowers_and_compiles_for_an_h100_without_a_gpu(tmp_path):
    """configs/ptb.py's HyperRHN (batch 256 x 100, width 1000, depth 7) with
    impl="persistent", the trainer's jitted step, bf16 and f32, deviceless: the forward and
    the backward are each the hyper cell's kernel and the main cell's. ptxas builds every one
    for sm_90a without a register spill."""
    dtypes = ["bfloat16", "float32"]
    kernels = ["persistent_highway_forward", "persistent_highway_backward"]
    rows, reports = compile_paper_step("persistent", dtypes, kernels, tmp_path, "")
    for row, dtype in zip(rows, dtypes, strict=True):
        assert row["dtype"] == dtype and row["impl"] == "persistent"
        assert (row["batch"], row["seq_len"]) == (256, 100)
        assert min(row["kernels"].values()) >= 1, row
    assert len(reports) >= 4 * len(dtypes)  # each cell's forward and backward
    assert_no_spills(reports)


@pytest.mark.gpu_compile
@needs_cuda
@pytest.mark.parametrize("option", [0, 1, 2, 3, 4])
def test_the_first_options_compile_the_paper_step_for_an_h100_without_a_gpu(tmp_path, option):
    """The first five of today's options (`persistent.OPTIONS`: the row-group layout, the
    fastest timed; with A multicast; the grid with the weights multicast; 32 units a block,
    128 blocks; the backward's GEMM split between two warpgroups) at the paper's HyperRHN
    step, bf16 and f32, deviceless: each cell's forward and backward kernels apart, no
    register spill."""
    dtypes = ["bfloat16", "float32"]
    variant = dataclasses.replace(persistent.PersistentVariant(), **persistent.OPTIONS[option])
    assert variant in persistent.variant_candidates(256, 1000, 128, "bfloat16")
    # "rowgroup": kernels/mosaic/rowgroup_layout.py in the kernels' source locations (the
    # grid layout's HLO names it nowhere)
    kernels = ["persistent_highway_forward", "persistent_highway_backward"]
    kernels += ["rowgroup"] * (variant.layout == "rowgroup")
    overrides = {"model.persistent_variant": variant.text()}
    rows, reports = compile_paper_step("persistent", dtypes, kernels, tmp_path, "", overrides)
    for row, dtype in zip(rows, dtypes, strict=True):
        assert (row["dtype"], row["variant"]) == (dtype, variant.text())
        assert min(row["kernels"].values()) >= 1, row
    assert len(reports) >= 4 * len(dtypes)  # each cell's forward and backward
    assert_no_spills(reports)


def test_record_timeline_saves_both_directions_stamps_of_every_phase_and_block(tmp_path):
    """Interpreted (a GPU runs the paper plan: benchmarks/phase_timeline.py's input)."""
    if (reason := mosaic_mode_skip(interpret=True)) is not None:
        pytest.skip(reason)
    from rhhjax.kernels.mosaic import interpret as gpu_interpret
    from rhhjax.kernels.mosaic import phase_timeline

    path = tmp_path / "stamps.npz"
    persistent.record_timeline(path, None, 64, 64, 2, 2, interpret=gpu_interpret.params())
    saved = np.load(path)
    plan = persistent.interpret_plan(64, 64, "bfloat16", persistent.LAYOUT)
    assert str(saved["variant"]) == "layout=rowgroup" and str(saved["plan"]) == str(plan)
    for direction in ("forward", "backward"):
        assert saved[f"{direction}_stamps"].shape == (4, plan.grid, phase_timeline.WORDS)
        assert list(saved[f"{direction}_sm"]) == list(range(plan.grid))
        assert (np.diff(phase_timeline.deltas(saved[f"{direction}_stamps"]), axis=-1) >= 0).all()
    assert list(saved["events"]) == list(phase_timeline.EVENTS)
