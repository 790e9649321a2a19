"""The Mosaic GPU micro-layer forward (`kernels/mosaic/forward.py`).

On a CPU: its reference and operand layout against the highway math of `ops.cells`, and its
one-line config errors. ``gpu_compile``: the kernel lowers and compiles for an H100 without
a GPU (needs the JAX CUDA plugin; skipped without it). `TestCompiled`: the kernel against
its reference, on a GPU only; `TestInterpret`: the same tests with the kernel executed in GPU
interpret mode on a CPU, race detector on (jax >= 0.11.2), and a kernel with its barrier
waits removed reported as a race."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu
from kernel_cases import MosaicGpuMode, assert_race_reported, compile_deviceless, needs_cuda
from rhhjax.kernels.mosaic import forward as mf

from rhhjax.ops import cells

TOLERANCE = {"float32": 1e-5, "bfloat16": 1e-5}


def _case(seed, batch, width):
    """Fresh (W [n, 2n], s [B, n], z [B, n], b [2n])."""
    rng = np.random.default_rng(seed)
    w = jnp.asarray(rng.normal(size=(width, 2 * width)) * 0.2, jnp.float32)
    s = jnp.asarray(rng.normal(size=(batch, width)), jnp.float32)
    z = 1.0 + jnp.asarray(rng.normal(size=(batch, width)) * 0.3, jnp.float32)
    b = jnp.asarray(rng.normal(size=(2 * width,)) * 0.3, jnp.float32)
    return w, s, z, b


@pytest.mark.pure_jax
@pytest.mark.parametrize(
    ("dtype", "batch", "width", "units", "k_pad"),
    [("bfloat16", 64, 32, 8, 64), ("float32", 128, 48, 16, 48), ("bfloat16", 64, 24, 8, 32)],
)
def test_reference_on_the_kernel_operands_is_the_highway_micro_layer(
    dtype, batch, width, units, k_pad
):
    """Block-major transposed weight, padded K and row-broadcast bias give exactly
    `cells.highway_gate((s W) * [z, z] + b, s)` with the same matmul dtype."""
    w, s, z, b = _case(batch + width, batch, width)
    ops = mf.operands(w, s, z, b, jnp.dtype(dtype), units, k_pad)
    actual = mf.highway_forward_reference(*ops, units=units)
    a = cells.matmul(s, w, jnp.dtype(dtype)) * cells.double(z) + b
    expected = cells.highway_gate(a, s, None)
    np.testing.assert_allclose(actual, expected, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])
    # Block g's rows of W^T are the h- then t-columns of its units.
    w_blk = np.asarray(ops[1], np.float32)
    g = width // units - 1
    cols = [g * units + j for j in range(units)] + [width + g * units + j for j in range(units)]
    expected_rows = np.asarray(w.astype(jnp.dtype(dtype)), np.float32)[:, cols].T
    np.testing.assert_array_equal(w_blk[g * 2 * units : (g + 1) * 2 * units, :width], expected_rows)


@pytest.mark.parametrize(
    ("config", "shape", "message"),
    [
        (mf.MosaicForwardConfig(tile_m=32), (64, 64, 64), "tile_m % 64"),
        (mf.MosaicForwardConfig(), (100, 64, 64), "b_pad 100"),
        (mf.MosaicForwardConfig(units=16), (64, 40, 64), "n_pad 40"),
        (mf.MosaicForwardConfig(tile_k=64), (64, 64, 96), "k_pad 96"),
    ],
)
def test_misaligned_shapes_are_one_line_errors(config, shape, message):
    with pytest.raises(ValueError, match=message) as e:
        config.check(*shape)
    assert "\n" not in str(e.value)


_COMPILE = """
from rhhjax.kernels.mosaic import forward as mf
rows = []
for b_pad, n_pad, k_pad, units, tile_k, stages in {cases!r}:
    config = mf.MosaicForwardConfig(units=units, tile_k=tile_k, stages=stages)
    args = (sds((b_pad, k_pad), jnp.bfloat16), sds((2 * n_pad, k_pad), jnp.bfloat16),
            sds((b_pad, n_pad), jnp.float32), sds((b_pad, 2, n_pad), jnp.float32),
            sds((b_pad, n_pad), jnp.float32))
    f = lambda *a: mf.highway_forward(*a, config=config)
    text = lower_and_compile(f, *args)
    rows.append({{"mosaic": "mosaic_gpu" in text, "compiled": True}})
print(json.dumps(rows))
"""


@pytest.mark.gpu_compile
@needs_cuda
def test_kernel_lowers_and_compiles_for_an_h100_without_a_gpu(tmp_path):
    """The paper's main cell (batch 256, 1056 padded units of 8 per program: 132 column
    blocks, K 1024) and a small odd case, deviceless, in a fresh process."""
    cases = [(256, 1056, 1024, 8, 64, 4), (64, 48, 48, 8, 16, 2)]
    code = _COMPILE.format(cases=cases)
    rows, _ = compile_deviceless(code, tmp_path)
    assert rows == [{"mosaic": True, "compiled": True}] * len(cases)


class TestCompiled(MosaicGpuMode):
    """The kernel against its reference on fresh random inputs: compiled (a GPU only), and
    in `TestInterpret` executed in GPU interpret mode, race detector on (jax >= 0.11.2).
    f32 operands run as TF32 in wgmma on a GPU (the compiled f32 tolerance is TF32's) and in
    f32 interpreted."""

    CASES = {
        # (batch, width, units, k_pad, tile_k): grids of (batch / 64) x (width / units)
        "shape": [(64, 64, 8, 64, 64), (128, 48, 8, 64, 32), (256, 1056, 8, 1088, 64)],
    }
    TOL = {"bfloat16": 2e-5, "float32": 3e-3}

    def run(self, *operands, **kwargs):
        """The jitted kernel on ``operands`` in this class's mode."""
        kernel = functools.partial(mf.highway_forward, interpret=self.interpret(), **kwargs)
        return jax.jit(kernel)(*operands)

    def test_matches_reference(self, shape):
        batch, width, units, k_pad, tile_k = shape
        w, s, z, b = _case(width + batch, batch, width)
        ops = mf.operands(w, s, z, b, jnp.bfloat16, units, k_pad)
        actual = self.run(*ops, config=mf.MosaicForwardConfig(units=units, tile_k=tile_k))
        expected = mf.highway_forward_reference(*ops, units=units)
        np.testing.assert_allclose(actual, expected, rtol=2e-5, atol=2e-5)

    @pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
    @pytest.mark.parametrize(("z_on", "x_on", "mask_on"), [(True, True, True), (False, True, False),
                                                           (True, False, True)])  # fmt: skip
    def test_every_option_and_saved_row_matches_reference(self, dtype, z_on, x_on, mask_on):
        """xproj, z, the dropout mask and the saved rows (h, t, full) against the reference,
        on a 2 x 9 grid (72 units of 8)."""
        ops, _ = _full_case(11, 128, 72, 128, 8, dtype)
        s_mm, w_blk, s, bias, z, xproj, mask = ops
        args = (s_mm, w_blk, s, bias, z if z_on else None, xproj if x_on else None,
                mask if mask_on else None)  # fmt: skip
        actual = self.run(*args, save=True)
        expected = mf.highway_forward_reference(*args, save=True, units=8)
        tol = self.TOL[dtype]
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            np.testing.assert_allclose(a, e, rtol=tol, atol=tol)


class TestInterpret(TestCompiled):
    INTERPRET = True
    CASES = {"shape": TestCompiled.CASES["shape"][:2]}  # the paper size takes ~45 s here
    TOL = {"bfloat16": 2e-5, "float32": 2e-5}

    def test_the_race_detector_reports_a_missing_barrier_wait(self, monkeypatch, capsys):
        """The check can fail: without the epilogue's waits for its TMA loads, the
        epilogue reads shared memory that a TMA copy may still be writing."""
        ops, _ = _full_case(3, 64, 16, 64, 8, "bfloat16")
        self.run(*ops)  # as it is: no race
        monkeypatch.setattr(plgpu, "barrier_wait", lambda barrier: None)
        assert_race_reported(lambda: jax.block_until_ready(self.run(*ops)), capsys, monkeypatch)


def _full_case(seed, batch, width, k_pad, units, dtype, keep=0.7):
    """Kernel operands with every option: (s_mm, w_blk, s, bias, z, xproj, mask) and the
    unpadded (w, s, z, b, xproj, mask) they come from."""
    w, s, z, b = _case(seed, batch, width)
    rng = np.random.default_rng(seed + 1)
    xproj = jnp.asarray(rng.normal(size=(batch, 2, width)) * 0.5, jnp.float32)
    mask = jnp.asarray(rng.random((batch, width)) < keep, jnp.float32) / keep
    ops = mf.operands(w, s, z, b, jnp.dtype(dtype), units, k_pad)
    return (*ops, xproj, mask), (w, s, z, b, xproj, mask)


@pytest.mark.pure_jax
@pytest.mark.parametrize(
    ("dtype", "z_on"), [("float32", True), ("bfloat16", True), ("float32", False)]
)
def test_reference_with_input_projection_and_dropout_saves_the_fused_rows(dtype, z_on):
    """With xproj and a gate-dropout mask, the reference's (s_new, h, t[, full]) are the
    highway micro-layer of layer 0 and the rows `rhhjax.ops.fused` saves for its backward."""
    units, k_pad = 8, 32
    ops, (w, s, z, b, xproj, mask) = _full_case(7, 64, 24, k_pad, units, dtype)
    if not z_on:
        ops = (*ops[:4], None, *ops[5:])
    out = mf.highway_forward_reference(*ops, save=True, units=units)
    assert len(out) == (4 if z_on else 3)
    full = cells.matmul(s, w, jnp.dtype(dtype)).reshape(64, 2, 24) + xproj
    a = (full * z[:, None] if z_on else full).reshape(64, 48) + b
    tol = TOLERANCE[dtype]
    h, t = jnp.tanh(a[:, :24]), jax.nn.sigmoid(a[:, 24:])
    np.testing.assert_allclose(out[0], h * (t * mask) + s * (1 - t), rtol=tol, atol=tol)
    np.testing.assert_allclose(out[1], h, rtol=tol, atol=tol)
    np.testing.assert_allclose(out[2], t, rtol=tol, atol=tol)
    if z_on:
        np.testing.assert_allclose(out[3], full, rtol=tol, atol=tol)
    # Without save: the new state only, the same.
    s_new = mf.highway_forward_reference(*ops, save=False, units=units)
    np.testing.assert_array_equal(s_new, out[0])
