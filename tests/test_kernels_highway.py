"""Tests of the fused highway Pallas kernels (kernels/highway.py).

Values and gradients are checked in interpret mode (CPU). Interpret mode accepts things Triton
rejects (value slicing, non power-of-two blocks), so the CUDA lowering tests below -- which need
no GPU -- are the guard that the real kernels lower through the Triton backend.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kernels import highway as hw

# Custom-call target of a Triton pallas_call: "__gpu$xla.gpu.triton" (jaxlib <= 0.10.2, Triton
# IR serialized in the backend config) or "triton_kernel_call" (compiled-at-lowering path).
TRITON_TARGETS = ("__gpu$xla.gpu.triton", "triton_kernel_call")

TEST_CONFIG = hw.HighwayConfig(block_b=16, block_n=16, block_k=16, num_warps=4, num_stages=2)

# Tolerances. f32 weights: exact-f32 dots on both sides, only the summation order differs.
# bf16 weights: the reference also casts s to bf16 for the forward dot, so the forward stays
# tight; the backward casts d_pre to bf16 for the XLA dots and rounds dw to bf16, which the
# autodiff reference does differently, so allow ~1-2 bf16 ulps relative to the largest entry.
TOL = {
    jnp.float32: dict(fwd=(1e-5, 1e-5), grad=(1e-5, 1e-5)),
    jnp.bfloat16: dict(fwd=(1e-4, 1e-4), grad=(2e-2, 2e-2)),
}


@dataclasses.dataclass(frozen=True)
class Case:
    batch: int
    n: int
    w_dtype: type
    has_z: bool
    has_extra: bool
    has_mask: bool

    def __str__(self):
        flags = "".join(
            c
            for c, on in zip("zem", (self.has_z, self.has_extra, self.has_mask), strict=True)
            if on
        )
        return f"B{self.batch}-n{self.n}-{jnp.dtype(self.w_dtype).name}-{flags or 'plain'}"


CASES = [
    Case(3, 8, jnp.float32, True, True, True),
    Case(16, 24, jnp.float32, False, False, False),
    Case(3, 40, jnp.float32, True, False, True),
    Case(16, 40, jnp.float32, False, True, False),
    Case(16, 24, jnp.bfloat16, True, True, True),
    Case(3, 40, jnp.bfloat16, False, False, False),
    Case(16, 8, jnp.bfloat16, True, False, True),
]


def make_inputs(key, case: Case, keep: float = 0.75):
    ks = jax.random.split(key, 7)
    b, n = case.batch, case.n
    s = jax.random.normal(ks[0], (b, n), jnp.float32)
    w = (jax.random.normal(ks[1], (n, 2 * n), jnp.float32) / np.sqrt(n)).astype(case.w_dtype)
    z = 1.0 + 0.3 * jax.random.normal(ks[2], (b, n), jnp.float32) if case.has_z else None
    bias = 0.5 * jax.random.normal(ks[3], (2 * n,), jnp.float32)
    extra = 0.5 * jax.random.normal(ks[4], (b, 2 * n), jnp.float32) if case.has_extra else None
    mask = None
    if case.has_mask:
        mask = (jax.random.uniform(ks[5], (b, n)) < keep).astype(jnp.float32) / keep
    cotangent = jax.random.normal(ks[6], (b, n), jnp.float32)
    return (s, w, z, bias, extra, mask), cotangent


def case_key(case: Case):
    """A different key per case: every case sees fresh random inputs."""
    return jax.random.key(CASES.index(case))


def assert_close(actual, expected, rtol, atol, scale_atol=False, err_msg=""):
    actual = np.asarray(jnp.asarray(actual, jnp.float32))
    expected = np.asarray(jnp.asarray(expected, jnp.float32))
    if scale_atol:
        atol = atol * max(1.0, float(np.max(np.abs(expected))))
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=err_msg)


# --- interpret mode: values and gradients ------------------------------------------------------


NAMES = ("s", "w", "z", "bias", "extra", "mask")


@functools.cache
def run_case(case: Case):
    """Kernel (interpret mode) and reference results for one case, each in a single jit.

    One compilation per case and side keeps the suite fast; the three tests below share it.
    """
    args, cotangent = make_inputs(case_key(case), case)
    # Differentiate w.r.t. every array argument that is present (mask included: its gradient is
    # computed by XLA in the custom VJP).
    argnums = tuple(i for i, a in enumerate(args) if a is not None)

    def kernel_step(*a):
        return hw.highway_step(*a, config=TEST_CONFIG, interpret=True)

    def kernel_side(*a):
        fwd = hw.highway_forward(*a, config=TEST_CONFIG, interpret=True)
        s, _, z, bias, extra, mask = a
        pre_ref = hw.highway_forward_reference(*a)[1]  # same `pre` for both backward kernels
        bwd = hw.highway_backward(
            cotangent, s, pre_ref, z, bias, extra, mask, config=TEST_CONFIG, interpret=True
        )
        grads = jax.value_and_grad(
            lambda *b: jnp.sum(kernel_step(*b) * cotangent), argnums=argnums
        )(*a)
        return fwd, bwd, grads

    def reference_side(*a):
        fwd = hw.highway_forward_reference(*a)
        s, _, z, bias, extra, mask = a
        bwd = hw.highway_backward_reference(cotangent, s, fwd[1], z, bias, extra, mask)
        grads = jax.value_and_grad(
            lambda *b: jnp.sum(hw.highway_step_reference(*b) * cotangent), argnums=argnums
        )(*a)
        return fwd, bwd, grads

    got = jax.jit(kernel_side)(*args)
    want = jax.jit(reference_side)(*args)
    return args, argnums, got, want


@pytest.mark.parametrize("case", CASES, ids=str)
def test_forward_matches_reference(case):
    _, _, (got, _, _), (want, _, _) = run_case(case)
    s_new, pre = got
    assert s_new.dtype == jnp.float32 and pre.dtype == jnp.float32
    assert s_new.shape == (case.batch, case.n) and pre.shape == (case.batch, 2 * case.n)
    rtol, atol = TOL[case.w_dtype]["fwd"]
    assert_close(pre, want[1], rtol, atol, err_msg="pre")
    assert_close(s_new, want[0], rtol, atol, err_msg="s_new")


@pytest.mark.parametrize("case", CASES, ids=str)
def test_backward_kernel_matches_reference(case):
    _, _, (_, got, _), (_, want, _) = run_case(case)
    for name, g, r in zip(("da", "ds_carry", "dz"), got, want, strict=True):
        if r is None:
            assert g is None, name
        else:
            assert_close(g, r, 1e-5, 1e-5, err_msg=name)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_grads_match_reference(case):
    args, argnums, (_, _, (loss, got)), (_, _, (loss_ref, want)) = run_case(case)
    # The primal output of the custom VJP (through the loss).
    assert_close(loss, loss_ref, *TOL[case.w_dtype]["fwd"], scale_atol=True, err_msg="loss")
    for i, g, r in zip(argnums, got, want, strict=True):
        assert g.shape == r.shape and g.dtype == args[i].dtype, NAMES[i]
        # Only ds and dw go through the weight-side (bf16) dots; dz, dbias, dextra and dmask
        # are f32 elementwise results and keep the f32 tolerance.
        kind = "grad" if NAMES[i] in ("s", "w") else "fwd"
        rtol, atol = (
            TOL[case.w_dtype][kind] if case.w_dtype == jnp.bfloat16 else TOL[jnp.float32]["grad"]
        )
        assert_close(g, r, rtol, atol, scale_atol=True, err_msg=f"d{NAMES[i]}")


# --- padding -------------------------------------------------------------------------------


def test_padded_units_stay_zero():
    case = Case(5, 20, jnp.float32, True, True, True)
    args, _ = make_inputs(jax.random.key(11), case)
    padded = jax.jit(
        functools.partial(hw._highway_forward_padded, config=TEST_CONFIG, interpret=True)
    )
    s_new, pre = padded(*args)
    b, n = case.batch, case.n
    assert s_new.shape == (16, 32) and pre.shape == (16, 2, 32)
    # Padded units: exactly zero in both halves of pre and in s_new, for every row.
    np.testing.assert_array_equal(np.asarray(s_new[:, n:]), 0.0)
    np.testing.assert_array_equal(np.asarray(pre[:, :, n:]), 0.0)
    # Padded rows have s = 0, hence pre = 0 there (their s_new is discarded).
    np.testing.assert_array_equal(np.asarray(pre[b:]), 0.0)
    # The h/t halves stay aligned: the valid region is the reference.
    s_ref, pre_ref = hw.highway_forward_reference(*args)
    assert_close(s_new[:b, :n], s_ref, 1e-5, 1e-5)
    assert_close(pre[:b, 0, :n], pre_ref[:, :n], 1e-5, 1e-5)
    assert_close(pre[:b, 1, :n], pre_ref[:, n:], 1e-5, 1e-5)


def test_results_independent_of_block_config():
    case = Case(20, 40, jnp.float32, True, True, True)
    args, ds_new = make_inputs(jax.random.key(12), case)
    configs = [
        TEST_CONFIG,
        hw.HighwayConfig(block_b=32, block_n=32, block_k=16),
        hw.HighwayConfig(block_b=16, block_n=16, block_k=32),
    ]

    @jax.jit
    def run_all(*a):
        s, _, z, bias, extra, mask = a
        fwd = [hw.highway_forward(*a, config=c, interpret=True) for c in configs]
        pre = fwd[0][1]
        bwd = [
            hw.highway_backward(ds_new, s, pre, z, bias, extra, mask, config=c, interpret=True)
            for c in configs
        ]
        return fwd, bwd

    fwd, bwd = run_all(*args)
    for other_fwd, other_bwd in zip(fwd[1:], bwd[1:], strict=True):
        for x, y in zip(fwd[0], other_fwd, strict=True):
            assert_close(x, y, 1e-6, 1e-6)  # the K summation order depends on block_k
        for x, y in zip(bwd[0], other_bwd, strict=True):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # elementwise: bitwise


def test_blocks_clamped_for_small_problems():
    geo = hw._Geometry.make(hw.HighwayConfig(), batch=3, n=8)
    assert (geo.block_b, geo.block_n, geo.block_k, geo.b_pad, geo.n_pad) == (16, 16, 16, 16, 16)
    geo = hw._Geometry.make(hw.HighwayConfig(), batch=256, n=1000)
    assert (geo.b_pad, geo.n_pad) == (256, 1024)
    assert geo.grid == (4, 32)


@pytest.mark.parametrize(
    "bad", [dict(block_k=24), dict(block_n=48), dict(block_b=8), dict(block_k=8), dict(num_warps=3)]
)
def test_invalid_config_rejected(bad):
    case = Case(4, 16, jnp.float32, False, False, False)
    args, _ = make_inputs(jax.random.key(0), case)
    with pytest.raises(ValueError, match="HighwayConfig"):
        hw.highway_forward(*args, config=hw.HighwayConfig(**bad), interpret=True)


def test_shape_errors():
    case = Case(4, 16, jnp.float32, True, False, False)
    (s, w, z, bias, extra, mask), _ = make_inputs(jax.random.key(0), case)
    with pytest.raises(ValueError, match="w must be"):
        hw.highway_forward(s, w[:, :16], z, bias, extra, mask, interpret=True)
    with pytest.raises(ValueError, match="z must be"):
        hw.highway_forward(s, w, z[:2], bias, extra, mask, interpret=True)


# --- CUDA lowering (no GPU needed) ---------------------------------------------------------


@contextlib.contextmanager
def verified_triton_modules():
    """Runs the MLIR verifier on every Triton module produced while lowering.

    Lowering builds the Triton IR op by op without verifying the whole module; verification adds
    the type and TensorSizeTrait checks. Uses a private hook; skipped if it moved.
    """
    try:
        from jax._src.pallas.triton import lowering as triton_lowering
    except ImportError:  # pragma: no cover - private module layout changed
        yield None
        return
    original = triton_lowering.lower_jaxpr_to_triton_module
    verified = []
    jax.clear_caches()  # otherwise a cached lowering of an inner jit skips the hook

    def lower_and_verify(*args, **kwargs):
        result = original(*args, **kwargs)
        assert result.module.operation.verify()
        verified.append(result)
        return result

    triton_lowering.lower_jaxpr_to_triton_module = lower_and_verify
    try:
        yield verified
    finally:
        triton_lowering.lower_jaxpr_to_triton_module = original


def lower_for_cuda(fn, *args) -> str:
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def count_triton_calls(text: str) -> int:
    return sum(text.count(target) for target in TRITON_TARGETS)


B_REAL, N_REAL = 256, 1000


def real_shapes(w_dtype):
    sds = jax.ShapeDtypeStruct
    f32 = jnp.float32
    return (
        sds((B_REAL, N_REAL), f32),  # s
        sds((N_REAL, 2 * N_REAL), w_dtype),  # w
        sds((B_REAL, N_REAL), f32),  # z
        sds((2 * N_REAL,), f32),  # bias
        sds((B_REAL, 2 * N_REAL), f32),  # extra
        sds((B_REAL, N_REAL), f32),  # mask
    )


OPTIONALS = [(True, True, True), (False, False, False), (True, False, True)]


def _select(args, flags):
    s, w, z, bias, extra, mask = args
    has_z, has_extra, has_mask = flags
    return (
        s,
        w,
        z if has_z else None,
        bias,
        extra if has_extra else None,
        mask if has_mask else None,
    )


@pytest.mark.parametrize("w_dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("flags", OPTIONALS, ids=["zem", "plain", "zm"])
def test_forward_lowers_to_triton(w_dtype, flags):
    with verified_triton_modules() as modules:
        text = lower_for_cuda(hw.highway_forward, *_select(real_shapes(w_dtype), flags))
    assert count_triton_calls(text) == 1, text[:2000]
    assert 'name = "highway_forward"' in text
    assert modules is None or len(modules) == 1  # None: private hook unavailable


@pytest.mark.parametrize("flags", OPTIONALS, ids=["zem", "plain", "zm"])
def test_backward_lowers_to_triton(flags):
    s, _, z, bias, extra, mask = _select(real_shapes(jnp.float32), flags)
    pre = jax.ShapeDtypeStruct((B_REAL, 2 * N_REAL), jnp.float32)
    with verified_triton_modules() as modules:
        text = lower_for_cuda(hw.highway_backward, s, s, pre, z, bias, extra, mask)
    assert count_triton_calls(text) == 1
    assert 'name = "highway_backward"' in text
    assert modules is None or len(modules) == 1


@pytest.mark.parametrize("w_dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
def test_grad_lowers_to_triton(w_dtype):
    args = real_shapes(w_dtype)

    def loss(s, w, z, bias, extra, mask):
        return jnp.sum(hw.highway_step(s, w, z, bias, extra, mask) ** 2)

    with verified_triton_modules() as modules:
        text = lower_for_cuda(jax.grad(loss, argnums=(0, 1, 2, 3, 4)), *args)
    # One forward and one backward kernel; the weight-side matmuls are XLA dots.
    assert count_triton_calls(text) == 2
    assert 'name = "highway_forward"' in text and 'name = "highway_backward"' in text
    assert modules is None or len(modules) == 2


def test_lowering_catches_non_power_of_two_blocks(monkeypatch):
    """The guard: interpret mode runs a block_k=24 kernel, Triton lowering rejects it."""
    monkeypatch.setattr(hw, "_validate_config", lambda config: None)
    bad = hw.HighwayConfig(block_b=16, block_n=16, block_k=24)
    case = Case(4, 48, jnp.float32, False, False, False)
    args, _ = make_inputs(jax.random.key(3), case)
    s_new, _ = hw.highway_forward(*args, config=bad, interpret=True)  # interpret: fine
    assert_close(s_new, hw.highway_forward_reference(*args)[0], 1e-5, 1e-5)
    s, w, _, bias, _, _ = real_shapes(jnp.bfloat16)
    with pytest.raises(ValueError, match="power of 2"):
        lower_for_cuda(
            functools.partial(hw.highway_forward, config=bad), s, w, None, bias, None, None
        )


def test_lowering_catches_value_slicing():
    """Slicing a loaded value runs in interpret mode but has no Triton lowering."""

    def kernel(x_ref, o_ref):
        x = x_ref[...]
        o_ref[...] = x[:, :16] + x[:, 16:]

    def call(x, interpret=False):
        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((16, 16), jnp.float32),
            compiler_params=plgpu.CompilerParams(num_warps=4),
            interpret=interpret,
        )(x)

    x = jnp.arange(16 * 32, dtype=jnp.float32).reshape(16, 32)
    np.testing.assert_array_equal(call(x, interpret=True), x[:, :16] + x[:, 16:])
    with pytest.raises(Exception, match="slice"):
        lower_for_cuda(call, jax.ShapeDtypeStruct(x.shape, x.dtype))


# --- on a real GPU (skipped elsewhere) -----------------------------------------------------


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")
@pytest.mark.parametrize("w_dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
def test_gpu_compiled_matches_reference(w_dtype):
    case = Case(B_REAL, N_REAL, w_dtype, True, True, True)
    args, cotangent = make_inputs(jax.random.key(21), case)
    s_new, pre = jax.jit(hw.highway_forward)(*args)
    s_ref, pre_ref = jax.jit(hw.highway_forward_reference)(*args)
    assert_close(pre, pre_ref, 1e-4, 1e-4)
    assert_close(s_new, s_ref, 1e-4, 1e-4)
    argnums = (0, 1, 2, 3, 4)

    def loss(fn, *a):
        return jnp.sum(fn(*a) * cotangent)

    got = jax.jit(jax.grad(lambda *a: loss(hw.highway_step, *a), argnums=argnums))(*args)
    want = jax.jit(jax.grad(lambda *a: loss(hw.highway_step_reference, *a), argnums=argnums))(*args)
    rtol, atol = (2e-2, 2e-2) if w_dtype == jnp.bfloat16 else (1e-4, 1e-4)
    for g, r in zip(got, want, strict=True):
        assert_close(g, r, rtol, atol, scale_atol=True)
