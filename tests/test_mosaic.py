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

import dataclasses
import importlib.util
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rhhjax import models
from rhhjax.ops import fused, mosaic, spec

NEEDS_GPU = pytest.mark.skipif(
    jax.default_backend() != "gpu",
    reason="impl='mosaic' compiles its Mosaic GPU kernel on a Hopper GPU only "
    "(jax.default_backend() != 'gpu')",
)


def _has_cuda_plugin() -> bool:
    try:
        return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
    except ModuleNotFoundError:
        return False


needs_cuda = pytest.mark.skipif(
    not _has_cuda_plugin(), reason="no JAX CUDA plugin here (jax[cuda12])"
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

TOL = {"float32": 1e-5, "bfloat16": 3e-2}
TOL_COMPILED = {"float32": 5e-3, "bfloat16": 3e-2}  # f32 operands run as TF32 in wgmma
CASES = {
    # (type, dtype, hidden, hyper_hidden, depth, dropout, batch, length, original_first_step)
    "hyperrhn-f32-dropout-odd": ("hyperrhn", "float32", 13, 7, 3, "gate", 5, 6, False),
    "rhn-f32-nodropout-odd": ("rhn", "float32", 70, 4, 2, "none", 3, 4, False),
    "hyperrhn-bf16-dropout-first-step": ("hyperrhn", "bfloat16", 12, 6, 2, "gate", 4, 5, True),
}


def _configs(case):
    kind, dtype, hidden, hyper, depth, dropout, _, _, first = CASES[case]
    base = dict(
        type=kind,
        vocab_size=11,
        embed_dim=5,
        hidden=hidden,
        hyper_hidden=hyper,
        depth=depth,
        dropout=dropout,
        keep=0.7,
        dtype=dtype,
        original_first_step=first,
    )
    return models.ModelConfig(**base, impl="mosaic"), models.ModelConfig(**base, impl="scan")


def _loss_and_grads(model, params, tokens, key):
    def loss_fn(p):
        logits, _ = model.apply({"params": p}, tokens[:, :-1], train=True, rngs={"dropout": key})
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    return jax.jit(jax.value_and_grad(loss_fn))(params)


class MosaicModelTests:
    """The mosaic model against the scan reference on fresh random inputs: loss, every
    parameter gradient. INTERPRET: the kernel's pure-JAX reference runs in its place."""

    INTERPRET: bool
    TOLERANCE: dict

    def model(self, config):
        model = models.build_model(config, platform="gpu")
        assert model.spec.impl == "mosaic"
        if self.INTERPRET:
            model = model.clone(spec=dataclasses.replace(model.spec, interpret=True))
        return model

    @pytest.mark.parametrize("case", list(CASES))
    def test_loss_and_gradients_match_scan(self, case):
        config, scan_config = _configs(case)
        _, dtype, *_, batch, length, _ = CASES[case]
        scan = models.build_model(scan_config)
        seed = sum(map(ord, case))
        params = models.init_params(scan, jax.random.key(seed))
        tokens = jnp.asarray(np.random.default_rng(seed).integers(0, 11, (batch, length + 1)))
        key = jax.random.key(seed + 1)
        actual = _loss_and_grads(self.model(config), params, tokens, key)
        expected = _loss_and_grads(scan, params, tokens, key)
        tol = self.TOLERANCE[dtype]
        leaves = jax.tree_util.tree_leaves_with_path(actual)
        for (path, a), e in zip(leaves, jax.tree.leaves(expected), strict=True):
            scale = float(jnp.max(jnp.abs(e))) or 1.0
            np.testing.assert_allclose(
                a, e, rtol=tol, atol=tol * scale, err_msg=jax.tree_util.keystr(path)
            )

    def test_evaluation_logits_match_scan(self):
        """Without differentiation (no saved rows: the forward kernel's save=False variant)."""
        config, scan_config = _configs("hyperrhn-f32-dropout-odd")
        scan = models.build_model(scan_config)
        params = models.init_params(scan, jax.random.key(5))
        tokens = jnp.asarray(np.random.default_rng(5).integers(0, 11, (5, 6)))

        def logits(model):
            return jax.jit(lambda p: model.apply({"params": p}, tokens, train=False)[0])(params)

        expected = logits(scan)
        tol = self.TOLERANCE["float32"]
        np.testing.assert_allclose(logits(self.model(config)), expected, rtol=tol, atol=tol)


class TestMosaicReference(MosaicModelTests):
    INTERPRET = True
    TOLERANCE = TOL


@NEEDS_GPU
class TestMosaicCompiled(MosaicModelTests):
    INTERPRET = False
    TOLERANCE = TOL_COMPILED


# ----------------------------------------------------------------------------- deviceless

_STEP = """
import json
from rhhjax.tools import hlo_compile as g
g.set_deviceless_env()
rows = []
for dtype in {dtypes!r}:
    mc, oc, seed, batch, seq_len = g.build_configs(g.Case("hyperrhn", "mosaic", dtype), {{}})
    compiled, _ = g.compile_step(mc, oc, seed, batch, seq_len, g.h100_mesh())
    text = compiled.as_text()
    rows.append(dict(dtype=dtype, impl=mc.impl, mode=mc.pallas_mode, batch=batch,
                     seq_len=seq_len, hidden=mc.hidden, depth=mc.depth,
                     forward="mosaic_highway_forward" in text,
                     backward="mosaic_highway_backward" in text))
print(json.dumps(rows))
"""


@pytest.mark.gpu_compile
@needs_cuda
def test_paper_hyperrhn_training_step_lowers_and_compiles_for_an_h100_without_a_gpu(tmp_path):
    """configs/ptb.py's HyperRHN (batch 256 x 100, width 1000, depth 7) with impl="mosaic",
    the trainer's jitted step, bf16 and f32, in a fresh deviceless process
    (pallas_mode="compiled", as benchmarks/gpu_report.py sets): both Mosaic GPU kernels,
    forward and backward, are in the compiled step."""
    dtypes = ["bfloat16", "float32"]
    code = _STEP.format(dtypes=dtypes)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads(run.stdout.strip().splitlines()[-1])
    expected = dict(impl="mosaic", mode="compiled", batch=256, seq_len=100, hidden=1000,
                    depth=7, forward=True, backward=True)  # fmt: skip
    assert rows == [dict(dtype=d, **expected) for d in dtypes]
