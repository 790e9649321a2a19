"""`rhhjax.ops.mosaic` (impl="mosaic"): the Mosaic GPU micro-layer forward with `fused`'s
backward loop.

On a CPU: the registration, the one-line refusals (off a GPU, variational dropout, rank d),
and the whole model against `scan` (values and gradients; f32, bf16, gate dropout, odd
sizes) with the kernel's pure-JAX reference in its place (`spec.interpret`, the INTERPRET
attribute below), which checks the layout, the saved rows and the backward around it.
``gpu_compile``: the paper-size HyperRHN training step with impl="mosaic" lowers and
compiles for an H100 without a GPU (CUDA plugin). `TestMosaicCompiled`: the same model
comparisons with the compiled kernel, on a GPU only.
"""

import jax
import pytest
from kernel_cases import assert_no_spills, compile_paper_step, needs_cuda
from model_cases import KERNEL_TOL, KERNEL_TOL_COMPILED, KernelModelMatchesScan

from rhhjax import models
from rhhjax.ops import fused, mosaic, spec

NEEDS_GPU = pytest.mark.skipif(
    jax.default_backend() != "gpu",
    reason="impl='mosaic' compiles its Mosaic GPU kernel on a Hopper GPU only "
    "(jax.default_backend() != 'gpu')",
)


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


@pytest.mark.parametrize(
    ("pallas_mode", "platform", "message"),
    [
        ("auto", "cpu", r"\(cpu\)"),
        ("interpret", "gpu", "pallas_mode='interpret'"),
        ("interpret", "cpu", "pallas_mode='interpret'"),
        ("auto", "tpu", r"\(tpu\)"),
    ],
)
def test_off_a_gpu_mosaic_is_refused_in_one_line(pallas_mode, platform, message):
    with pytest.raises(spec.UnsupportedImpl, match=message) as error:
        spec.resolve(
            "mosaic",
            spec.ModelFacts("hyperrhn"),
            dtype="float32",
            pallas_mode=pallas_mode,
            platform=platform,
        )
    assert "\n" not in str(error.value)
    assert "Hopper GPU only" in str(error.value) and "pallas_mode='compiled'" in str(error.value)


def test_build_model_off_a_gpu_refuses_before_tracing():
    config = models.ModelConfig(hidden=8, hyper_hidden=4, depth=2, impl="mosaic")
    config.validate()  # the model itself is fine: only where it runs is refused
    with pytest.raises(spec.UnsupportedImpl, match="Hopper GPU only"):
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


class TestMosaicReference(KernelModelMatchesScan):
    IMPL = "mosaic"
    INTERPRET = True
    TOLERANCE = KERNEL_TOL


@NEEDS_GPU
class TestMosaicCompiled(KernelModelMatchesScan):
    IMPL = "mosaic"
    INTERPRET = False
    TOLERANCE = KERNEL_TOL_COMPILED


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
