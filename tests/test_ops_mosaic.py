"""`rhhjax.ops.mosaic` (impl="mosaic"): a Mosaic GPU kernel per micro-layer, forward and
backward.

On a CPU: the registration, the one-line refusals (off a GPU, variational dropout, rank d)
and that their advice runs, and the whole model against `scan` (values and gradients; f32,
bf16, gate dropout, odd sizes) with the kernels' pure-JAX references in their place
(`TestMosaicReference`, any jax) and with the real kernels executed in GPU interpret mode,
race detector on (`TestMosaicInterpret`, jax >= 0.11.2). ``gpu_compile``: the paper-size
HyperRHN training step with impl="mosaic" lowers and compiles for an H100 without a GPU
(CUDA plugin). `TestMosaicCompiled`: the same model comparisons with the compiled kernels,
on a GPU only.
"""

import pytest
from kernel_cases import assert_no_spills, compile_paper_step, needs_cuda
from model_cases import (
    KERNEL_TOL,
    KERNEL_TOL_COMPILED,
    KernelModelMatchesScan,
    assert_compiled_off_a_gpu_lowers_but_does_not_execute,
    assert_interpret_mode_runs_or_names_the_jax,
    assert_off_gpu_refusal_advises_what_runs,
)

from rhhjax import models
from rhhjax.ops import fused, mosaic, spec


def test_mosaic_is_registered_but_not_ranked_for_auto():
    assert spec.IMPLEMENTATIONS["mosaic"] is mosaic
    assert "mosaic" in models.IMPLS
    for ranking, _ in spec._MEASURED.values():
        assert "mosaic" not in ranking  # not measured yet
    for platform in ("gpu", "cpu"):
        assert (
            spec.resolve(
                "auto", spec.ModelFacts("hyperrhn"), dtype="bfloat16", platform=platform
            ).impl
            != "mosaic"
        )


@pytest.mark.parametrize("platform", ["cpu", "tpu"])
def test_off_a_gpu_mosaic_is_refused_in_one_line_whose_advice_runs(platform):
    assert_off_gpu_refusal_advises_what_runs("mosaic", platform)


def test_interpret_mode_runs_the_kernels_interpreted_or_names_the_jax_it_needs():
    assert_interpret_mode_runs_or_names_the_jax("mosaic")


def test_compiled_off_a_gpu_lowers_but_the_trainer_refuses_to_execute_it():
    assert_compiled_off_a_gpu_lowers_but_does_not_execute("mosaic")


def test_build_model_off_a_gpu_refuses_before_tracing():
    config = models.ModelConfig(hidden=8, hyper_hidden=4, depth=2, impl="mosaic")
    config.validate()  # the model itself is fine: only where it runs is refused
    with pytest.raises(spec.UnsupportedImpl, match="for a Hopper GPU, and the platform is cpu"):
        models.build_model(config, platform="cpu")


@pytest.mark.parametrize(
    ("pallas_mode", "platform"), [("compiled", "cpu"), ("auto", "gpu"), ("compiled", "gpu")]
)
def test_on_a_gpu_or_lowering_for_one_mosaic_compiles_its_kernel(pallas_mode, platform):
    resolved = spec.resolve(
        "mosaic",
        spec.ModelFacts("hyperrhn", dropout="gate"),
        dtype="bfloat16",
        pallas_mode=pallas_mode,
        platform=platform,
    )
    assert resolved.impl == "mosaic" and not resolved.interpret


@pytest.mark.parametrize(
    ("facts", "message"),
    [
        (spec.ModelFacts("hyperrhn", dropout="variational"), "variational"),
        (spec.ModelFacts("hyperrhn", hyper_rank=4), "hyper_rank=4"),
        (spec.ModelFacts("lstm"), "only for RHN"),
        (spec.ModelFacts("hyperrhn", hyper_input="x_and_state"), "hyper_input='x'"),
    ],
)
def test_what_the_kernel_cannot_run_is_refused_in_one_line_on_any_platform(facts, message):
    with pytest.raises(spec.UnsupportedImpl, match=message) as error:
        spec.check("mosaic", facts)
    assert "\n" not in str(error.value) and "use " in str(error.value)


@pytest.mark.parametrize(("batch", "width"), [(1, 1), (64, 64), (65, 1000), (256, 128)])
def test_geometry_pads_rows_to_the_row_tile_and_units_to_the_k_tile(batch, width):
    geo = mosaic.geometry(None, batch, width)
    assert geo.b_pad % mosaic.CONFIG.tile_m == 0 and 0 <= geo.b_pad - batch < 64
    assert geo.n_pad % mosaic.UNIT_MULTIPLE == 0 and 0 <= geo.n_pad - width < 64
    mosaic.CONFIG.check(geo.b_pad, geo.n_pad, geo.n_pad)  # the kernel's K is n_pad


def test_saved_rows_are_the_rows_the_fused_backward_reads():
    for has_z in (True, False):
        assert mosaic.saved_rows(has_z) == fused.saved_rows(has_z)
    assert mosaic.KEEP_DTYPE == fused.KEEP_DTYPE


# ----------------------------------------------------------------------------- the model


@pytest.mark.pure_jax
class TestMosaicReference(KernelModelMatchesScan):
    IMPL = "mosaic"
    REFERENCES = True
    TOLERANCE = KERNEL_TOL


class TestMosaicCompiled(KernelModelMatchesScan):
    IMPL = "mosaic"
    TOLERANCE = KERNEL_TOL_COMPILED


class TestMosaicInterpret(TestMosaicCompiled):
    INTERPRET = True
    TOLERANCE = KERNEL_TOL
    # two of the model cases: `mosaic` is not the path `auto` or the autotune runs, and its
    # kernels are interpreted one by one in tests/test_kernels_mosaic_*.py
    CASES = {"model_case": ["hyperrhn-bf16-dropout-first-step", "rhn-f32-depth1"]}


# ----------------------------------------------------------------------------- deviceless


@pytest.mark.gpu_compile
@needs_cuda
def test_paper_hyperrhn_training_step_lowers_and_compiles_for_an_h100_without_a_gpu(tmp_path):
    """configs/ptb.py's HyperRHN (batch 256 x 100, width 1000, depth 7) with impl="mosaic",
    the trainer's jitted step, bf16 and f32, deviceless (pallas_mode="compiled", as
    benchmarks/gpu_report.py sets): both Mosaic GPU kernels, forward and backward, are in
    the compiled step, and ptxas builds them for sm_90a without a register spill."""
    dtypes = ["bfloat16", "float32"]
    kernels = ["mosaic_highway_forward", "mosaic_highway_backward"]
    rows, reports = compile_paper_step("mosaic", dtypes, kernels, tmp_path)
    expected = dict(impl="mosaic", mode="compiled", batch=256, seq_len=100, hidden=1000, depth=7)
    for row, dtype in zip(rows, dtypes, strict=True):
        assert {k: row[k] for k in expected} == expected and row["dtype"] == dtype
        assert all(row["kernels"].values()), row
    assert len(reports) >= 2 * len(dtypes)
    assert_no_spills(reports)
