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
    kernel_and_scan_configs,
    loss_and_grads,
)
from rhhjax.kernels.hardware import H100
from rhhjax.kernels.mosaic import persistent_forward as pf
from rhhjax.kernels.mosaic import persistent_slots as slots
from rhhjax.kernels.mosaic.plan import PlanError

from rhhjax import models
from rhhjax.ops import fused, persistent, persistent_plans, spec


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


def test_the_plan_of_the_paper_width_fits_shared_memory_in_both_dtypes():
    for dtype in ("bfloat16", "float32"):
        plan = persistent.plan_for(256, 1000, dtype)
        assert plan.smem_bytes() <= plan.smem_limit
        assert persistent.pb.backward_smem_bytes(plan) <= plan.smem_limit


def test_a_width_past_the_sms_is_one_plan_error_line():
    with pytest.raises(persistent.PlanError) as error:
        persistent.plan_for(64, max(persistent_plans.UNITS) * H100.sms + 1, "bfloat16")
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
    candidates = list(persistent_plans.candidates(batch, width, dtype))
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
def test_the_paper_candidates_are_the_tuning_space_that_runs_the_default_first(dtype):
    """`variant_candidates`: the tuning space's variants (`persistent.TUNING`) in the row-group
    layout that both kernels and the layout accept, each running plans of its own, the
    default first: bf16 16 of its 18 (split_k's second warpgroup's stages fit only with the
    epilogue in registers), f32 10 (6 stages and split_k not with the f32 tiles in shared
    memory; the paired layout's 132 + 16 blocks not on 132 SMs); in registers stages 0 is
    the deepest that fits."""
    found = persistent.variant_candidates(256, 1000, 128, dtype)
    space = persistent.tuning_space()
    assert found[0] == persistent.PersistentVariant() == space[0]
    assert found == [v for v in space if v in found]
    plans = [persistent.variant_plans(v, 256, 1000, 128, dtype) for v in found]
    assert len(set(plans)) == len(found) == (16 if dtype == "bfloat16" else 10)
    default = plans[0][1]
    for variant, (layout, main, hyper) in zip(found, plans, strict=True):
        if layout == "paired":
            assert variant.layout == "paired" and dtype == "bfloat16"
            continue
        assert layout == "rowgroup" and main.multicast_a == (variant.sharing == "multicast")
        assert main.split_k == (variant.sharing == "split_k") and not main.multicast_b
        assert main.producer == hyper.producer == (variant.sharing == "producer")
        assert main.in_registers == hyper.in_registers == (variant.epilogue == "registers")
        if variant.stages or not main.in_registers:
            assert main.stages == (variant.stages or default.stages)
        for plan in (main, hyper):
            persistent_plans.check_runnable(plan)


def test_where_the_row_group_layout_cannot_run_the_candidates_are_the_grids():
    """1,200 bf16 units need more column blocks than a cluster holds."""
    found = persistent.variant_candidates(256, 1200, 128, "bfloat16")
    assert found[0] == persistent.PersistentVariant("grid") and len(found) > 1
    assert {v.layout for v in found} == {"grid", "paired"}


def test_a_variant_round_trips_through_the_config_into_the_spec():
    for variant in persistent.variant_candidates(256, 1000, 128, "bfloat16")[1:]:
        config = models.ModelConfig(impl="persistent", persistent=variant)
        config.validate()
        assert models.sequence_spec(config, platform="gpu").variant == variant


def test_by_default_the_variant_is_the_row_group_layout_where_its_plan_runs():
    """The default: the spec carries none and the op runs the row-group layout (and the
    plan's pipeline) where its plan runs, else the grid; asked for, it is kept, to fail."""
    resolved = models.sequence_spec(models.ModelConfig(impl="persistent"), platform="gpu")
    assert resolved.variant is None
    rowgroup, grid = persistent.PersistentVariant(), persistent.PersistentVariant("grid")
    assert persistent.variant_of(resolved) == rowgroup and rowgroup.layout == "rowgroup"
    assert persistent.variant_at(resolved, 256, 1000) == rowgroup
    want = persistent.plan_for(256, 1000, "float32", "rowgroup")
    assert persistent._plan_of(resolved, 256, 1000) == want
    bf16 = dataclasses.replace(resolved, dtype=jnp.bfloat16)
    with pytest.raises(PlanError):
        persistent.variant_plans(rowgroup, 256, 1200, 0, "bfloat16")
    assert persistent.variant_at(bf16, 256, 1200) == grid
    assert persistent._plan_of(bf16, 256, 1200) == persistent.plan_for(256, 1200, "bfloat16")
    asked = dataclasses.replace(bf16, variant=persistent.PersistentVariant(stages=4))
    assert persistent.variant_at(asked, 256, 1200) == asked.variant
    assert models.sequence_spec(models.ModelConfig(impl="fused")).variant is None


def test_a_variant_of_too_many_blocks_is_one_plan_error_line():
    """8 units a block: 4 x 125 blocks, over an H100's SMs (the plans' own check)."""
    variant = persistent.PersistentVariant("grid", units=8)
    with pytest.raises(PlanError, match="units=8") as error:
        persistent.variant_plans(variant, 256, 1000, 128, "bfloat16")
    assert "\n" not in str(error.value)


def test_a_variant_whose_pipeline_does_not_fit_is_one_plan_error_line():
    """bf16 at 32 stages, even of 16: over a block's shared memory (the plan's own check)."""
    variant = persistent.PersistentVariant(stages=32)
    with pytest.raises(PlanError, match="shared memory") as error:
        persistent.variant_plans(variant, 256, 1000, 128, "bfloat16")
    assert "\n" not in str(error.value) and "stages=32" in str(error.value)


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
    rowgroup = persistent.PersistentVariant()
    value, status = jnp.arange(4.0), jnp.array([0, 5, 0], jnp.int32)
    for named in ("s_last", None):
        outs = pf.Saved(value, value, value, status)
        assert persistent._checked(rowgroup, outs, named, "forward") is outs
        assert not host


@pytest.mark.parametrize(
    "layout, hidden, expected",
    [("grid", 1000, True), ("rowgroup", 1000, False), ("rowgroup", 1200, True)],
)  # 1200: no row-group plan, the grid
def test_a_grid_barrier_runs_where_the_variant_or_its_fallback_is_the_grid(
    layout, hidden, expected
):
    variant = persistent.PersistentVariant(layout)
    assert persistent.grid_barrier_runs(variant, 256, hidden, 128, "bfloat16") == expected


# (variant, KERNEL_CASES case): the tuning space's kernels that differ from the default's
# (the A chunk multicast to a row group's cluster, interpret mode copies it to each block;
# the backward's GEMM split between two warpgroups; the epilogue in registers, whose
# variant rounds the plan's 16 units a block up to 32; a producer warpgroup, alone and
# with it) and the grid with the weights multicast to a column's row blocks (two row blocks).
SMALL = ("hyperrhn-f32-dropout-odd", "hyperrhn-bf16-dropout-first-step")
TUNED_CASES = [
    *[("sharing=multicast", case) for case in SMALL],
    *[("layout=grid,stages=2,sharing=split_k", case) for case in SMALL],
    *[("layout=grid,sharing=multicast", case) for case in TWO_ROW_BLOCKS],
    *[("epilogue=registers", case) for case in SMALL],
    *[("sharing=producer", case) for case in SMALL],
    *[("sharing=producer,epilogue=registers", case) for case in SMALL[:1]],
    *[("layout=paired", case) for case in (*SMALL, *TWO_ROW_BLOCKS)],
    ("layout=paired,sharing=producer,epilogue=registers", SMALL[0]),
]


class VariantMatchesScan(KernelModelMatchesScan):
    """The HyperRHN at a ``model.persistent`` variant against `scan`: loss and every
    gradient."""

    CASES = {
        **KernelModelMatchesScan.CASES,
        "variant_case": VARIANT_CASES,
        "option_case": VARIANT_CASES[:1],  # units=16
        "tuned_case": TUNED_CASES,
    }

    def test_a_variant_of_the_config_matches_scan(self, variant_case):
        """``model.persistent`` (not the default): every plan at 2 pipeline stages in the
        grid, the barrier status folded into the step (no block gives up: equal values)."""
        variant = persistent.PersistentVariant("grid", stages=2)
        hidden, hyper_hidden, _, batch, *_ = variant_case
        spec = self.model(models.ModelConfig(impl=self.IMPL, persistent=variant)).spec
        plans = [persistent._plan_of(spec, batch, n) for n in (hidden, hyper_hidden)]
        assert [plan.stages for plan in plans] == [2, 2]
        self._matches_scan(variant_case, variant)

    def test_a_plan_of_more_blocks_matches_scan(self, option_case):
        """``units=16``: every cell's plan at 16 units a block (GPU interpret mode's own plan
        here is 2 blocks of 32)."""
        hidden, hyper_hidden, _, batch, *_ = option_case
        variant = persistent.PersistentVariant("grid", units=16)
        spec = self.model(models.ModelConfig(impl=self.IMPL, persistent=variant)).spec
        plans = [persistent._plan_of(spec, batch, n) for n in (hidden, hyper_hidden)]
        assert [plan.units_per_block for plan in plans] == [16, 16]
        assert plans[0].col_blocks == hidden // 16
        self._matches_scan(option_case, variant)

    def test_a_tuned_variant_matches_scan(self, tuned_case):
        text, case = tuned_case
        variant = persistent.parse_variant(text)
        self.check_loss_and_gradients(case, persistent=variant)

    def test_the_paired_layout_runs_both_cells_in_one_op_each_way(self, monkeypatch):
        """``layout=paired``: training's forward (saved) and its backward, and evaluation's
        forward (not saved), each go through the pair's loops once, with the model's values;
        the gradients are `test_a_tuned_variant_matches_scan`'s."""
        calls = []
        for name in ("pair_forward_loop", "pair_backward_loop"):
            loop = getattr(persistent, name)
            spy = lambda *a, loop=loop, name=name, **k: calls.append(name) or loop(*a, **k)  # noqa: E731
            monkeypatch.setattr(persistent, name, spy)
        monkeypatch.setattr(persistent, "backward_loop", None)  # never the cells apart
        paired = persistent.parse_variant("layout=paired")
        self.check_loss_and_gradients(SMALL[0], persistent=paired)
        assert calls == ["pair_forward_loop", "pair_backward_loop"]
        config, scan_config = kernel_and_scan_configs(SMALL[0], self.IMPL, persistent=paired)
        params = models.init_params(models.build_model(scan_config), jax.random.key(2))
        tokens = jnp.asarray(np.random.default_rng(2).integers(0, 11, (5, 6)))

        def logits(model):
            return jax.jit(lambda p: model.apply({"params": p}, tokens, train=False)[0])(params)

        expected = logits(models.build_model(scan_config))
        np.testing.assert_allclose(logits(self.model(config)), expected, rtol=1e-4, atol=1e-4)
        assert calls[2:] == ["pair_forward_loop"]

    def _matches_scan(self, case, variant: persistent.PersistentVariant):
        hidden, hyper_hidden, depth, batch, length, first = case
        base = dict(
            type="hyperrhn", vocab_size=11, embed_dim=5, hidden=hidden, hyper_hidden=hyper_hidden,
            depth=depth, dropout="gate", keep=0.7, dtype="float32", original_first_step=first,
        )  # fmt: skip
        scan = models.build_model(models.ModelConfig(**base, impl="scan"))
        config = models.ModelConfig(**base, impl=self.IMPL, persistent=variant)
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
    # units=16 and the tuned kernels change no reference but the grid's padding: their tests
    # are the kernels'
    CASES = {
        **VariantMatchesScan.CASES,
        "option_case": [],
        "tuned_case": [c for c in TUNED_CASES if c[1] in TWO_ROW_BLOCKS],
    }


class TestPersistentCompiled(VariantMatchesScan):
    IMPL = "persistent"
    TOLERANCE = KERNEL_TOL_COMPILED


class TestPersistentInterpret(TestPersistentCompiled):
    INTERPRET = True
    TOLERANCE = KERNEL_TOL
    # the variant at the smaller case only: the larger runs in the default's test
    CASES = {**VariantMatchesScan.CASES, "variant_case": VARIANT_CASES[:1]}


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
@pytest.mark.parametrize(
    "text", ["layout=grid", "sharing=multicast", "stages=6", "stages=4,sharing=split_k",
             "layout=grid,sharing=multicast"],
)  # fmt: skip
def test_the_tuning_spaces_kernels_compile_the_paper_step_for_an_h100_without_a_gpu(tmp_path, text):
    """The paper's HyperRHN step at the variants whose kernels differ from the default's (the
    grid; the A chunk multicast; 6 stages of 32; the backward's GEMM split between two
    warpgroups; the grid with the weights multicast), in each dtype that runs it,
    deviceless: each cell's forward and backward kernels apart, no register spill."""
    variant = persistent.parse_variant(text)
    dtypes = [d for d in ("bfloat16", "float32") if _runs(variant, d)]
    assert "bfloat16" in dtypes
    # "rowgroup": kernels/mosaic/rowgroup_layout.py in the kernels' source locations (the
    # grid layout's HLO names it nowhere)
    kernels = ["persistent_highway_forward", "persistent_highway_backward"]
    kernels += ["rowgroup"] * (variant.layout == "rowgroup")
    overrides = {f"model.persistent.{k}": v for k, v in dataclasses.asdict(variant).items()}
    rows, reports = compile_paper_step("persistent", dtypes, kernels, tmp_path, "", overrides)
    for row, dtype in zip(rows, dtypes, strict=True):
        assert (row["dtype"], row["variant"]) == (dtype, variant.text())
        assert min(row["kernels"].values()) >= 1, row
    assert len(reports) >= 4 * len(dtypes)  # each cell's forward and backward
    assert_no_spills(reports)


@pytest.mark.gpu_compile
@needs_cuda
def test_the_paired_layout_compiles_the_paper_step_with_one_launch_each_way(tmp_path):
    """``layout=paired`` (bf16; f32's 132-block main plan leaves no SM for the hyper cell):
    the two cells' forwards are one launch and their backwards another, no kernel of a cell
    alone remains; no register spill."""
    variant = persistent.parse_variant("layout=paired")
    assert not _runs(variant, "float32")
    kernels = ["persistent_pair_forward", "persistent_pair_backward", "persistent_highway_forward",
               "persistent_highway_backward"]  # fmt: skip
    overrides = {"model.persistent.layout": "paired"}
    rows, reports = compile_paper_step("persistent", ["bfloat16"], kernels, tmp_path, "", overrides)
    (row,) = rows
    assert row["variant"] == variant.text()
    counts = row["kernels"]
    assert counts["persistent_pair_forward"] >= 1 and counts["persistent_pair_backward"] >= 1
    assert counts["persistent_highway_forward"] == counts["persistent_highway_backward"] == 0
    assert len(reports) >= 2  # the pair's forward and backward
    assert_no_spills(reports)


def _runs(variant, dtype: str) -> bool:
    try:
        persistent.variant_plans(variant, 256, 1000, 128, dtype)
    except PlanError:
        return False
    return True


@pytest.mark.parametrize("text", ["default", "sharing=producer,epilogue=registers"])
def test_record_timeline_saves_both_directions_stamps_of_every_phase_and_block(tmp_path, text):
    """Interpreted (a GPU runs the paper plan: benchmarks/phase_timeline.py's input), at the
    default and at the second design's variant."""
    if (reason := mosaic_mode_skip(interpret=True)) is not None:
        pytest.skip(reason)
    from rhhjax.kernels.mosaic import interpret as gpu_interpret
    from rhhjax.kernels.mosaic import phase_timeline

    path = tmp_path / "stamps.npz"
    variant = persistent.parse_variant(text)
    persistent.record_timeline(path, variant, 64, 64, 2, 2, interpret=gpu_interpret.params())
    saved = np.load(path)
    plan = variant.planned(persistent.interpret_plan(64, 64, "bfloat16", "rowgroup"))
    assert str(saved["variant"]) == variant.text() and str(saved["plan"]) == str(plan)
    for direction in ("forward", "backward"):
        assert saved[f"{direction}_stamps"].shape == (4, plan.grid, phase_timeline.WORDS)
        assert list(saved[f"{direction}_sm"]) == list(range(plan.grid))
        assert (np.diff(phase_timeline.deltas(saved[f"{direction}_stamps"]), axis=-1) >= 0).all()
    assert list(saved["events"]) == list(phase_timeline.EVENTS)
