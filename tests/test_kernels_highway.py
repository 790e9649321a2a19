"""Tests of the highway Pallas kernels (kernels/highway.py).

`HighwayKernelTests` holds every value/gradient test; it runs once per mode:
`TestInterpret` (Pallas interpret mode, runs anywhere) and `TestCompiled` (the real Triton
kernels, skipped unless `jax.default_backend() == "gpu"`), so the same odd-size cases run
compiled on a GPU. Interpret mode accepts things Triton rejects (value slicing, non
power-of-two blocks), so the CUDA lowering tests at the end -- which need no GPU -- guard that
every kernel lowers through the Triton backend.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from rhhjax.kernels import highway as hw

# Custom-call target of a Triton pallas_call: "__gpu$xla.gpu.triton" (jaxlib <= 0.10.2, Triton
# IR serialized in the backend config) or "triton_kernel_call" (compiled-at-lowering path).
TRITON_TARGETS = ("__gpu$xla.gpu.triton", "triton_kernel_call")

TEST_CONFIG = hw.HighwayConfig(block_b=16, block_n=16, block_k=16, num_warps=4, num_stages=2)
KEEP = 0.7

# Tolerances (rtol, atol) of a kernel against its reference on the same inputs. f32: exact-f32
# dots on both sides, only the summation order differs. bf16 weights: both sides round the dot
# inputs to bf16 identically, so only the f32 summation order differs too. "chain": results
# that go through a bf16 dot on the kernel side and an autodiff dot on the reference side;
# atol relative to the largest entry.
TOL = {
    "float32": dict(kernel=(1e-5, 1e-5), chain=(1e-5, 1e-5)),
    "bfloat16": dict(kernel=(1e-4, 1e-4), chain=(3e-2, 3e-2)),
}


@dataclasses.dataclass(frozen=True)
class Case:
    batch: int
    n: int
    dtype: str
    has_z: bool
    has_xproj: bool
    has_mask: bool

    def __str__(self):
        flags = zip("zxm", (self.has_z, self.has_xproj, self.has_mask), strict=True)
        flags = "".join(c for c, on in flags if on)
        return f"B{self.batch}-n{self.n}-{self.dtype}-{flags or 'plain'}"


# Odd sizes: B and n not multiples of the 16-blocks (except where noted), both dtypes.
CASES = [
    Case(3, 20, "float32", True, True, True),
    Case(17, 24, "float32", False, False, False),  # grid (2, 2)
    Case(5, 40, "bfloat16", True, True, True),
    Case(16, 8, "bfloat16", True, False, True),  # B a multiple of block_b, n < block
]


def case_key(case: Case, salt: int = 0):
    """A different key per case: every case sees fresh random inputs."""
    return jax.random.fold_in(jax.random.key(CASES.index(case) if case in CASES else 99), salt)


def make_unpadded(key, batch, n, dtype, has_z, has_xproj, has_mask):
    """Unpadded random operands of one layer: dict of s, w, z, bias, xproj, keep8, g, ds."""
    ks = jax.random.split(key, 9)
    normal = jax.random.normal
    return dict(
        s=normal(ks[0], (batch, n), jnp.float32),
        w=(normal(ks[1], (n, 2 * n), jnp.float32) / np.sqrt(n)).astype(dtype),
        z=1.0 + 0.3 * normal(ks[2], (batch, n), jnp.float32) if has_z else None,
        bias=0.5 * normal(ks[3], (2 * n,), jnp.float32),
        xproj=0.5 * normal(ks[4], (batch, 2 * n), jnp.float32) if has_xproj else None,
        keep8=(jax.random.uniform(ks[5], (batch, n)) < KEEP).astype(jnp.int8) if has_mask else None,
        g=normal(ks[6], (batch, n), jnp.float32),
        ds=normal(ks[7], (batch, n), jnp.float32),
        d_above=normal(ks[8], (batch, 2 * n), jnp.float32),
    )


def pad_layer(u, geo, dtype):
    """The padded operands of one layer (what the caller builds outside its time loop)."""

    def opt(x, f):
        return None if x is None else f(x)

    return dict(
        s=geo.pad_rows(u["s"]),
        w3=geo.pad_weight(u["w"], dtype),
        w_t=geo.pad_weight_t(u["w"], dtype),
        z=opt(u["z"], geo.pad_rows),
        bias2=geo.pad_bias(u["bias"]),
        xproj=opt(u["xproj"], geo.pad_halves),
        keep8=opt(u["keep8"], geo.pad_rows),
        g=geo.pad_rows(u["g"]),
        ds=geo.pad_rows(u["ds"]),
        d_above=geo.pad_halves(u["d_above"]),
    )


def assert_close(actual, expected, rtol, atol, scale_atol=False, err_msg=""):
    assert actual.shape == expected.shape, (err_msg, actual.shape, expected.shape)
    actual = np.asarray(jnp.asarray(actual, jnp.float32))
    expected = np.asarray(jnp.asarray(expected, jnp.float32))
    if scale_atol:
        atol = atol * max(1.0, float(np.max(np.abs(expected))))
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=err_msg)


def unpadded_layer(s, w, z, bias, xproj, m):
    """The recurrence's layer on unpadded arrays (independent of the kernels' layout).

    a = (s @ w + xproj) * [z, z] + bias; s_new = h * (t * m) + s * (1 - t).
    """
    n = s.shape[-1]
    u = jnp.dot(
        s.astype(w.dtype),
        w,
        precision=hw._dot_precision(w.dtype, False),
        preferred_element_type=jnp.float32,
    )
    if xproj is not None:
        u = u + xproj
    a = u if z is None else u * jnp.concatenate([z, z], axis=-1)
    a = a + bias
    h, t = jnp.tanh(a[:, :n]), jax.nn.sigmoid(a[:, n:])
    gate = t if m is None else t * m
    return h * gate + s * (1.0 - t)


def per_mode_cache(method):
    """Caches a runner per (mode, arguments): pytest makes a new instance for every test, and
    the tests of one case share one compiled run."""
    cache = {}

    @functools.wraps(method)
    def wrapper(self, *args):
        key = (self.INTERPRET, *args)
        if key not in cache:
            cache[key] = method(self, *args)
        return cache[key]

    return wrapper


class HighwayKernelTests:
    """Every kernel against its reference; `INTERPRET` picks the mode (set by subclasses)."""

    INTERPRET: bool

    def kw(self, geo):
        return dict(geo=geo, config=TEST_CONFIG, interpret=self.INTERPRET)

    @per_mode_cache
    def run_padded(self, case: Case):
        """All padded kernels and their references on one case's random inputs, one jit each."""
        geo = hw.Geometry.make(TEST_CONFIG, case.batch, case.n)
        flags = (case.has_z, case.has_xproj, case.has_mask)
        u = make_unpadded(case_key(case), case.batch, case.n, case.dtype, *flags)
        p = pad_layer(u, geo, jnp.dtype(case.dtype))
        kw = self.kw(geo)

        def kernels(p, pre):
            elem = (p["s"], pre, p["z"], p["bias2"], p["xproj"], p["keep8"])
            fwd = hw.forward_padded(p["s"], p["w3"], *elem[2:], keep=KEEP, **kw)
            bwd = hw.backward_padded(p["ds"], *elem, g=p["g"], keep=KEEP, **kw)
            above = (p["d_above"], p["w_t"], p["ds"])
            fused = hw.backward_fused_padded(*above, p["g"], *elem, keep=KEEP, **kw)
            grad = hw.state_grad_padded(*above, p["g"], **kw)
            # "GEMM then elementwise" with the two non-fused kernels.
            two = hw.backward_padded(grad, *elem, keep=KEEP, **kw)
            return fwd, bwd, fused, grad, two

        def references(p, pre):
            elem = (p["s"], pre, p["z"], p["bias2"], p["xproj"], p["keep8"])
            fwd = hw.forward_padded_reference(p["s"], p["w3"], *elem[2:], keep=KEEP)
            bwd = hw.backward_padded_reference(p["ds"], *elem, g=p["g"], keep=KEEP)
            above = (p["d_above"], p["w_t"], p["ds"])
            fused = hw.backward_fused_reference(*above, p["g"], *elem, keep=KEEP)
            grad = hw.state_grad_reference(*above, p["g"])
            return fwd, bwd, fused, grad

        pre = hw.forward_padded_reference(
            p["s"], p["w3"], p["z"], p["bias2"], p["xproj"], p["keep8"], keep=KEEP
        )[1]
        return geo, u, p, jax.jit(kernels)(p, pre), jax.jit(references)(p, pre)

    def tol(self, case):
        return TOL[case.dtype]["kernel"]

    # --- padded kernels vs references ----------------------------------------------------

    @pytest.mark.parametrize("case", CASES, ids=str)
    def test_forward_padded(self, case):
        geo, _, _, (fwd, *_), (fwd_ref, *_) = self.run_padded(case)
        s_new, pre = fwd
        assert s_new.shape == (geo.b_pad, geo.n_pad) and pre.shape == (geo.b_pad, 2, geo.n_pad)
        assert s_new.dtype == jnp.float32 and pre.dtype == jnp.float32
        assert_close(pre, fwd_ref[1], *self.tol(case), err_msg="pre")
        assert_close(s_new, fwd_ref[0], *self.tol(case), err_msg="s_new")

    def check_backward(self, geo, case, got, want, what):
        d_scaled, ds_carry, dz, dbias_part = got
        d_scaled_r, ds_carry_r, dz_r, dbias_r = want
        rtol, atol = self.tol(case)
        assert_close(d_scaled, d_scaled_r, rtol, atol, err_msg=f"{what}: d_scaled")
        assert_close(ds_carry, ds_carry_r, rtol, atol, err_msg=f"{what}: ds_carry")
        if case.has_z:
            assert_close(dz, dz_r, rtol, atol, err_msg=f"{what}: dz")
        else:
            assert dz is None and dz_r is None
        assert dbias_part.shape == (geo.grid[0], 2, geo.n_pad)
        assert_close(dbias_part.sum(0, keepdims=True), dbias_r, rtol, atol, err_msg=f"{what}: db")

    @pytest.mark.parametrize("case", CASES, ids=str)
    def test_backward_padded(self, case):
        geo, _, _, (_, bwd, *_), (_, bwd_ref, *_) = self.run_padded(case)
        self.check_backward(geo, case, bwd, bwd_ref, "backward")

    @pytest.mark.parametrize("case", CASES, ids=str)
    def test_backward_fused_equals_gemm_then_elementwise(self, case):
        geo, _, _, (_, _, fused, _, two), (_, _, fused_ref, _) = self.run_padded(case)
        self.check_backward(geo, case, fused, fused_ref, "fused vs reference")
        # And the fused kernel equals the two separate kernels (state_grad, then backward).
        self.check_backward(geo, case, fused, two[:3] + (two[3].sum(0, keepdims=True),), "2k")

    @pytest.mark.parametrize("case", CASES, ids=str)
    def test_state_grad_padded(self, case):
        _, _, _, (*_, grad, _), (*_, grad_ref) = self.run_padded(case)
        assert_close(grad, grad_ref, *self.tol(case), err_msg="state grad")

    @pytest.mark.parametrize("case", CASES, ids=str)
    def test_padded_units_zero_and_rows_finite(self, case):
        geo, _, p, (fwd, bwd, fused, grad, _), _ = self.run_padded(case)
        s_new, pre = fwd
        b, n = case.batch, case.n
        for name, x in [("s_new", s_new), ("pre", pre[:, :, n:]), ("grad", grad)]:
            assert np.all(np.isfinite(np.asarray(x))), name
        np.testing.assert_array_equal(np.asarray(s_new[:, n:]), 0.0)
        np.testing.assert_array_equal(np.asarray(pre[:, :, n:]), 0.0)
        np.testing.assert_array_equal(np.asarray(pre[b:]), 0.0)  # padded rows: s = 0
        for out in (bwd, fused):
            d_scaled, ds_carry, dz, _ = out
            np.testing.assert_array_equal(np.asarray(d_scaled[b:]), 0.0)  # zero-padded g, ds
            np.testing.assert_array_equal(np.asarray(d_scaled[:, :, n:]), 0.0)
            np.testing.assert_array_equal(np.asarray(ds_carry[:, n:]), 0.0)
            if dz is not None:
                np.testing.assert_array_equal(np.asarray(dz[b:]), 0.0)

    # --- the caller's contract, against autodiff of the unpadded math ----------------------

    @per_mode_cache
    def run_two_layer_chain(self, dtype: str):
        """Two micro-layers (layer 0 with xproj and z; layer 1 with z and mask) as the caller runs
        them: forward_padded twice; backward_padded for layer 1, backward_fused_padded for
        layer 0 (above = layer 1), state_grad_padded for ds0; deferred dW and dbias."""
        batch, n = 5, 20
        geo = hw.Geometry.make(TEST_CONFIG, batch, n)
        key = jax.random.key(1234 + len(dtype))
        u0 = make_unpadded(jax.random.fold_in(key, 0), batch, n, dtype, True, True, False)
        u1 = make_unpadded(jax.random.fold_in(key, 1), batch, n, dtype, True, False, True)
        bias_x = 0.5 * jax.random.normal(jax.random.fold_in(key, 2), (2 * n,))
        g0, g1 = u0["g"], u1["g"]  # cotangents of both layers' outputs
        kw = self.kw(geo)
        dt = jnp.dtype(dtype)

        def kernels(s, w0, w1, z0, z1, b0, b1, bx, xproj):
            m0, m1 = None, geo.pad_rows(u1["keep8"])  # layer 0 unmasked: padded rows != 0
            z0p, z1p, xp = geo.pad_rows(z0), geo.pad_rows(z1), geo.pad_halves(xproj)
            b0p = geo.pad_bias(b0) + geo.pad_bias(bx)  # layer 0: one bias b_0 + b_U
            b1p = geo.pad_bias(b1)
            sp = geo.pad_rows(s)
            s1, pre0 = hw.forward_padded(sp, geo.pad_weight(w0, dt), z0p, b0p, xp, m0,
                                         keep=KEEP, **kw)  # fmt: skip
            s2, pre1 = hw.forward_padded(s1, geo.pad_weight(w1, dt), z1p, b1p, None, m1,
                                         keep=KEEP, **kw)  # fmt: skip
            gp0, gp1 = geo.pad_rows(g0), geo.pad_rows(g1)
            d1, c1, dz1, db1 = hw.backward_padded(gp1, s1, pre1, z1p, b1p, None, m1,
                                                  keep=KEEP, **kw)  # fmt: skip
            d0, c0, dz0, db0 = hw.backward_fused_padded(
                d1, geo.pad_weight_t(w1, dt), c1, gp0, sp, pre0, z0p, b0p, xp, m0, keep=KEEP, **kw
            )
            ds0 = hw.state_grad_padded(d0, geo.pad_weight_t(w0, dt), c0, **kw)
            dw = [
                jnp.dot(
                    x.T.astype(dt),
                    d.reshape(geo.b_pad, -1).astype(dt),
                    precision=hw._dot_precision(dt, False),
                    preferred_element_type=jnp.float32,
                ).reshape(geo.n_pad, 2, geo.n_pad)
                for x, d in ((sp, d0), (s1, d1))
            ]
            outs = (geo.unpad_rows(s1), geo.unpad_rows(s2))
            grads = dict(
                s=geo.unpad_rows(ds0),
                w0=dw[0][:n, :, :n].reshape(n, 2 * n),
                w1=dw[1][:n, :, :n].reshape(n, 2 * n),
                z0=geo.unpad_rows(dz0),
                z1=geo.unpad_rows(dz1),
                b0=db0.sum(0)[:, :n].reshape(2 * n),
                b1=db1.sum(0)[:, :n].reshape(2 * n),
                xproj=geo.unpad_halves(d0),
            )
            padded_rows = dict(s1=s1[batch:], d0=d0[batch:], d1=d1[batch:], dz0=dz0[batch:])
            return outs, grads, padded_rows

        def reference(s, w0, w1, z0, z1, b0, b1, bx, xproj):
            m0 = None
            m1 = u1["keep8"].astype(jnp.float32) / KEEP
            s1 = unpadded_layer(s, w0, z0, b0 + bx, xproj, m0)
            s2 = unpadded_layer(s1, w1, z1, b1, None, m1)
            return s1, s2

        args = (u0["s"], u0["w"], u1["w"], u0["z"], u1["z"], u0["bias"], u1["bias"], bias_x,
                u0["xproj"])  # fmt: skip
        names = ("s", "w0", "w1", "z0", "z1", "b0", "b1", "bx", "xproj")
        got = jax.jit(kernels)(*args)

        @jax.jit
        def ref(*a):
            outs, vjp = jax.vjp(reference, *a)
            grads = vjp((g0, g1))
            return outs, dict(zip(names, grads, strict=True))

        return got, ref(*args)

    @pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
    def test_two_layer_chain_matches_autodiff(self, dtype):
        (outs, grads, padded_rows), (outs_ref, grads_ref) = self.run_two_layer_chain(dtype)
        # Padded rows of an unmasked layer's output are driven by the bias (non-zero), their
        # gradients are zero,
        # so the deferred dW (computed from the padded arrays above) is right.
        assert np.all(np.abs(np.asarray(padded_rows["s1"][:, :20])) > 0)
        for name in ("d0", "d1", "dz0"):
            np.testing.assert_array_equal(np.asarray(padded_rows[name]), 0.0, err_msg=name)
        for o, r in zip(outs, outs_ref, strict=True):
            assert_close(o, r, *TOL[dtype]["kernel"], err_msg="states")
        for name, g in grads.items():
            # The bias gradient of layer 0 is both d b_0 and d b_U.
            assert_close(g, grads_ref[name], *TOL[dtype]["chain"], scale_atol=True, err_msg=name)
        assert_close(grads["b0"], grads_ref["bx"], *TOL[dtype]["chain"], scale_atol=True)

    # --- legacy API ----------------------------------------------------------------------

    @per_mode_cache
    def run_legacy(self, dtype: str, flags: tuple[bool, bool, bool]):
        """highway_forward / highway_backward / grads of highway_step vs references.

        Legacy semantics: ``extra`` is added outside the z scale; the mask is f32."""
        has_z, has_extra, has_mask = flags
        batch, n = 3, 20
        u = make_unpadded(jax.random.key(77 + sum(flags)), batch, n, dtype, has_z, True, has_mask)
        mask = None if u["keep8"] is None else u["keep8"].astype(jnp.float32) / KEEP
        args = (u["s"], u["w"], u["z"], u["bias"], u["xproj"] if has_extra else None, mask)
        argnums = tuple(i for i, a in enumerate(args) if a is not None)
        kw = dict(config=TEST_CONFIG, interpret=self.INTERPRET)
        cot = u["g"]

        def kernel_side(*a):
            fwd = hw.highway_forward(*a, **kw)
            s, _, z, bias, extra, m = a
            pre = hw.highway_forward_reference(*a)[1]
            bwd = hw.highway_backward(cot, s, pre, z, bias, extra, m, **kw)
            loss = lambda *b: jnp.sum(hw.highway_step(*b, **kw) * cot)  # noqa: E731
            return fwd, bwd, jax.grad(loss, argnums=argnums)(*a)

        def reference_side(*a):
            fwd = hw.highway_forward_reference(*a)
            s, _, z, bias, extra, m = a
            bwd = hw.highway_backward_reference(cot, s, fwd[1], z, bias, extra, m)
            loss = lambda *b: jnp.sum(hw.highway_step_reference(*b) * cot)  # noqa: E731
            return fwd, bwd, jax.grad(loss, argnums=argnums)(*a)

        return args, argnums, jax.jit(kernel_side)(*args), jax.jit(reference_side)(*args)

    @pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
    @pytest.mark.parametrize("flags", [(True, True, True), (False, False, False)], ids=["zem", "-"])
    def test_legacy_api(self, dtype, flags):
        args, argnums, got, want = self.run_legacy(dtype, flags)
        tol = TOL[dtype]["kernel"]
        for g, r in zip(got[0], want[0], strict=True):
            assert_close(g, r, *tol, err_msg="forward")
        for name, g, r in zip(("da", "ds_carry", "dz"), got[1], want[1], strict=True):
            if r is None:
                assert g is None, name
            else:
                assert_close(g, r, *tol, err_msg=name)
        for i, g, r in zip(argnums, got[2], want[2], strict=True):
            assert g.dtype == args[i].dtype
            assert_close(g, r, *TOL[dtype]["chain"], scale_atol=True, err_msg=f"grad {i}")


class TestInterpret(HighwayKernelTests):
    INTERPRET = True


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU (compiled Triton)")
class TestCompiled(HighwayKernelTests):
    INTERPRET = False


# --- geometry, padding helpers, validation (no kernels) ----------------------------------------


def test_geometry_clamps_and_pads():
    geo = hw.Geometry.make(hw.HighwayConfig(), batch=3, n=8)
    assert (geo.block_b, geo.block_n, geo.block_k, geo.b_pad, geo.n_pad) == (16, 16, 16, 16, 16)
    geo = hw.Geometry.make(hw.HighwayConfig(), batch=256, n=1000)
    assert (geo.b_pad, geo.n_pad) == (256, 1024)
    cfg = hw.HighwayConfig()
    assert geo.grid == (256 // cfg.block_b, 1024 // cfg.block_n)


def test_padding_helpers_with_leading_axes():
    geo = hw.Geometry.make(TEST_CONFIG, batch=3, n=5)
    key = jax.random.key(5)
    rows = jax.random.normal(key, (4, 2, 3, 5))  # [T, L, B, n]
    halves = jax.random.normal(key, (4, 3, 10))  # [T, B, 2n]
    w = jax.random.normal(key, (2, 5, 10))  # [L, n, 2n]
    bias = jax.random.normal(key, (2, 10))  # [L, 2n]
    pr, ph = geo.pad_rows(rows), geo.pad_halves(halves)
    assert pr.shape == (4, 2, 16, 16) and ph.shape == (4, 16, 2, 16)
    np.testing.assert_array_equal(geo.unpad_rows(pr), rows)
    np.testing.assert_array_equal(geo.unpad_halves(ph), halves)
    np.testing.assert_array_equal(ph[:, :3, 1, :5], halves[..., 5:])  # t half aligned
    np.testing.assert_array_equal(ph[:, 3:], 0.0)
    w3, w_t = geo.pad_weight(w, jnp.bfloat16), geo.pad_weight_t(w, jnp.float32)
    assert w3.shape == (2, 16, 2, 16) and w3.dtype == jnp.bfloat16
    assert w_t.shape == (2, 2, 16, 16) and w_t.dtype == jnp.float32
    for half in range(2):
        np.testing.assert_array_equal(
            w3[:, :5, half, :5], w[..., half * 5 : half * 5 + 5].astype(jnp.bfloat16)
        )
        # w_t[l, h, k, j] = w[l, j, h * n + k]
        np.testing.assert_array_equal(
            w_t[:, half, :5, :5], jnp.swapaxes(w[..., half * 5 : half * 5 + 5], -1, -2)
        )
    np.testing.assert_array_equal(w_t[:, :, 5:], 0.0)
    b2 = geo.pad_bias(bias)
    assert b2.shape == (2, 2, 16)
    np.testing.assert_array_equal(b2[:, 1, :5], bias[:, 5:])
    np.testing.assert_array_equal(hw.pad_rows(rows, geo), pr)  # module-level aliases


@pytest.mark.parametrize(
    "bad", [dict(block_k=24), dict(block_n=48), dict(block_b=8), dict(block_k=8), dict(num_warps=3)]
)
def test_invalid_config_rejected(bad):
    with pytest.raises(ValueError, match="HighwayConfig"):
        hw.Geometry.make(hw.HighwayConfig(**bad), 4, 16)


def test_shared_memory_overflow_rejected():
    """128/128/64 with 4 stages: ptxas reported 294,912 B for the f32 forward alone (over the
    H100's 232,448 B); the model (fused kernel, the largest) predicts more: rejected."""
    big = hw.HighwayConfig(block_b=128, block_n=128, block_k=64, num_stages=4)
    assert big.smem_bytes(jnp.float32) >= 294_912
    geo = hw.Geometry.make(big, 256, 1000)
    p = pad_layer(make_unpadded(jax.random.key(0), 256, 1000, "float32", False, False, False),
                  geo, jnp.float32)  # fmt: skip
    with pytest.raises(ValueError, match="shared memory"):
        hw.forward_padded(p["s"], p["w3"], None, p["bias2"], None, None, geo=geo, config=big)
    for dtype in (jnp.float32, jnp.bfloat16):
        assert hw.HighwayConfig().smem_bytes(dtype) <= hw.H100_SMEM_PER_BLOCK


def test_shape_errors():
    geo = hw.Geometry.make(TEST_CONFIG, 4, 20)
    p = pad_layer(make_unpadded(jax.random.key(0), 4, 20, "float32", True, True, True),
                  geo, jnp.float32)  # fmt: skip
    with pytest.raises(ValueError, match="w3 must have padded shape"):
        hw.forward_padded(p["s"], p["w3"][:16], None, p["bias2"], None, None, geo=geo)
    with pytest.raises(ValueError, match="z must have padded shape"):
        hw.forward_padded(p["s"], p["w3"], p["z"][:4], p["bias2"], None, None, geo=geo)
    with pytest.raises(ValueError, match="xproj must have dtype float32"):
        hw.forward_padded(p["s"], p["w3"], None, p["bias2"], p["xproj"].astype(jnp.bfloat16),
                          None, geo=geo)  # fmt: skip
    with pytest.raises(ValueError, match="keep_mask must have dtype int8, float32"):
        hw.forward_padded(p["s"], p["w3"], None, p["bias2"], None, p["keep8"] > 0, geo=geo)
    with pytest.raises(ValueError, match="Geometry needs batch >= 1"):
        hw.Geometry.make(TEST_CONFIG, 0, 20)
    with pytest.raises(ValueError, match="keep must be in"):
        hw.forward_padded(p["s"], p["w3"], None, p["bias2"], None, p["keep8"], keep=0.0, geo=geo)
    s, w = jnp.zeros((4, 16)), jnp.zeros((16, 16))
    with pytest.raises(ValueError, match="w must be"):
        hw.highway_forward(s, w, None, jnp.zeros(32), None, None, interpret=True)


# --- CUDA lowering (no GPU needed) ---------------------------------------------------------


def lower_for_cuda(fn, *args) -> str:
    with hw.cuda_lowering_device():
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def count_triton_calls(text: str) -> int:
    return sum(text.count(target) for target in TRITON_TARGETS)


B_REAL, N_REAL = 256, 1000
GEO_REAL = hw.Geometry.make(hw.HighwayConfig(), B_REAL, N_REAL)


def padded_shapes(dtype):
    sds, f32 = jax.ShapeDtypeStruct, jnp.float32
    g = GEO_REAL
    return dict(
        rows=sds((g.b_pad, g.n_pad), f32),
        rows2=sds((g.b_pad, 2, g.n_pad), f32),
        mask=sds((g.b_pad, g.n_pad), jnp.int8),
        bias2=sds((2, g.n_pad), f32),
        w3=sds((g.n_pad, 2, g.n_pad), dtype),
        w_t=sds((2, g.n_pad, g.n_pad), dtype),
    )


DTYPES = pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
OPTIONALS = pytest.mark.parametrize("full", [True, False], ids=["zxm", "plain"])


def assert_one_triton_kernel(text: str, name: str):
    assert count_triton_calls(text) == 1, text[:2000]
    assert f'name = "{name}"' in text


@DTYPES
@OPTIONALS
def test_forward_padded_lowers_to_triton(dtype, full):
    x = padded_shapes(dtype)
    opt = (lambda v: v) if full else (lambda v: None)
    fn = functools.partial(hw.forward_padded, keep=KEEP, geo=GEO_REAL)
    text = lower_for_cuda(fn, x["rows"], x["w3"], opt(x["rows"]), x["bias2"], opt(x["rows2"]),
                          opt(x["mask"]))  # fmt: skip
    assert_one_triton_kernel(text, "highway_forward")


@OPTIONALS
def test_backward_padded_lowers_to_triton(full):
    x = padded_shapes(jnp.float32)
    opt = (lambda v: v) if full else (lambda v: None)

    def fn(*args):
        return hw.backward_padded(*args[:-1], g=args[-1], keep=KEEP, geo=GEO_REAL)

    args = (x["rows"], x["rows"], x["rows2"], opt(x["rows"]), x["bias2"], opt(x["rows2"]),
            opt(x["mask"]), opt(x["rows"]))  # fmt: skip
    text = lower_for_cuda(fn, *args)
    assert_one_triton_kernel(text, "highway_backward")


@DTYPES
@OPTIONALS
def test_backward_fused_lowers_to_triton(dtype, full):
    x = padded_shapes(dtype)
    opt = (lambda v: v) if full else (lambda v: None)
    fn = functools.partial(hw.backward_fused_padded, keep=KEEP, geo=GEO_REAL)
    text = lower_for_cuda(fn, x["rows2"], x["w_t"], opt(x["rows"]), opt(x["rows"]), x["rows"],
                          x["rows2"], opt(x["rows"]), x["bias2"], opt(x["rows2"]),
                          opt(x["mask"]))  # fmt: skip
    assert_one_triton_kernel(text, "highway_backward_fused")


@DTYPES
def test_state_grad_lowers_to_triton(dtype):
    x = padded_shapes(dtype)
    fn = functools.partial(hw.state_grad_padded, geo=GEO_REAL)
    text = lower_for_cuda(fn, x["rows2"], x["w_t"], x["rows"], None)
    assert_one_triton_kernel(text, "highway_state_grad")


@DTYPES
def test_legacy_grad_lowers_to_triton(dtype):
    sds, f32 = jax.ShapeDtypeStruct, jnp.float32
    args = (sds((B_REAL, N_REAL), f32), sds((N_REAL, 2 * N_REAL), dtype),
            sds((B_REAL, N_REAL), f32), sds((2 * N_REAL,), f32),
            sds((B_REAL, 2 * N_REAL), f32), sds((B_REAL, N_REAL), f32))  # fmt: skip

    def loss(s, w, z, bias, extra, mask):
        return jnp.sum(hw.highway_step(s, w, z, bias, extra, mask) ** 2)

    text = lower_for_cuda(jax.grad(loss, argnums=(0, 1, 2, 3, 4)), *args)
    # One forward and one backward kernel; the weight-side matmuls are XLA dots.
    assert count_triton_calls(text) == 2
    assert 'name = "highway_forward"' in text and 'name = "highway_backward"' in text


def test_lowering_catches_non_power_of_two_blocks(monkeypatch):
    """The guard: interpret mode runs a block_k=24 kernel, Triton lowering rejects it."""
    monkeypatch.setattr(hw, "_validate_config", lambda config, dot_dtype=None: None)
    bad = hw.HighwayConfig(block_b=16, block_n=16, block_k=24)
    u = make_unpadded(jax.random.key(3), 4, 48, "float32", False, False, False)
    args = (u["s"], u["w"], None, u["bias"], None, None)
    s_new, _ = hw.highway_forward(*args, config=bad, interpret=True)  # interpret: fine
    assert_close(s_new, hw.highway_forward_reference(*args)[0], 1e-5, 1e-5)
    sds = jax.ShapeDtypeStruct
    with pytest.raises(ValueError, match="power of 2"):
        lower_for_cuda(
            functools.partial(hw.highway_forward, config=bad),
            sds((B_REAL, N_REAL), jnp.float32),
            sds((N_REAL, 2 * N_REAL), jnp.bfloat16),
            None,
            sds((2 * N_REAL,), jnp.float32),
            None,
            None,
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
            compiler_params=hw._TritonCompilerParams(num_warps=4),
            interpret=interpret,
        )(x)

    x = jnp.arange(16 * 32, dtype=jnp.float32).reshape(16, 32)
    np.testing.assert_array_equal(call(x, interpret=True), x[:, :16] + x[:, 16:])
    with pytest.raises(Exception, match="slice"):
        lower_for_cuda(call, jax.ShapeDtypeStruct(x.shape, x.dtype))


# --- stacked variants: (t, layer) slices of [T, L, ...] arrays, traced t -----------------------

T_STACK, L_STACK = 3, 2
STACK_CASES = [CASES[0], CASES[1], CASES[2]]  # f32 zxm, f32 plain, bf16 zxm
FWD_SLOTS = [(1, 0), (2, 1)]  # layer 0 takes xproj
# (0, 0): the layer above is (0, 1); (1, 1): above is (2, 0); (2, 1): t + 1 == T, no GEMM term.
BWD_SLOTS = [(0, 0), (1, 1), (T_STACK - 1, 1)]
# Computed values of a stacked kernel against the padded kernel on the same slices: the same
# arithmetic, but in interpret mode XLA:CPU fuses the two kernel bodies differently (1-ulp
# differences in tanh/sigmoid, measured); copies and untouched entries are compared exactly.
SAME = (2e-6, 2e-6)


def make_stacked(case: Case, geo):
    """Random padded stacked operands of a [T_STACK, L_STACK] recurrence (the stacked outputs
    are random too, so that untouched entries are recognisable)."""
    ks = jax.random.split(case_key(case, salt=7), 12)
    normal = jax.random.normal
    tl, batch, n = (T_STACK, L_STACK), case.batch, case.n
    dtype = jnp.dtype(case.dtype)
    w = normal(ks[0], (L_STACK, n, 2 * n)) / np.sqrt(n)
    rows_all = (*tl, geo.b_pad, geo.n_pad)
    keep_draw = jax.random.uniform(ks[5], (*tl, batch, n)) < KEEP
    return dict(
        w3=geo.pad_weight(w, dtype),
        w_t=geo.pad_weight_t(w, dtype),
        bias2=geo.pad_bias(0.5 * normal(ks[1], (L_STACK, 2 * n))),
        s=geo.pad_rows(normal(ks[2], (batch, n))),
        z=geo.pad_rows(1.0 + 0.3 * normal(ks[3], (*tl, batch, n))) if case.has_z else None,
        xproj=geo.pad_halves(0.5 * normal(ks[4], (T_STACK, batch, 2 * n)))
        if case.has_xproj
        else None,
        keep8=geo.pad_rows(keep_draw.astype(jnp.int8)) if case.has_mask else None,
        g=geo.pad_rows(normal(ks[6], (*tl, batch, n))),
        ds_carry=geo.pad_rows(normal(ks[7], (batch, n))),
        packed=normal(ks[8], (*tl, geo.b_pad, 3, geo.n_pad)),
        d_all=normal(ks[9], (*tl, geo.b_pad, 2, geo.n_pad)),
        dz_all=normal(ks[10], rows_all) if case.has_z else None,
        dbias=normal(ks[11], (L_STACK, geo.grid[0], 2, geo.n_pad)),
    )


def at(x, t, layer):
    return None if x is None else x[t, layer]


def assert_equal_except(new, old, slot, what):
    """``new`` equals ``old`` everywhere but at leading index ``slot`` (a tuple)."""
    keep = np.ones(new.shape[: len(slot)], bool)
    keep[slot] = False
    np.testing.assert_array_equal(np.asarray(new)[keep], np.asarray(old)[keep], err_msg=what)


class StackedKernelTests:
    """The stacked kernels against the padded ones on the (t, layer) slices; equal values."""

    INTERPRET: bool

    def kw(self, geo):
        return dict(geo=geo, config=TEST_CONFIG, interpret=self.INTERPRET, keep=KEEP)

    @per_mode_cache
    def run_forward(self, case: Case):
        geo = hw.Geometry.make(TEST_CONFIG, case.batch, case.n)
        x, kw = make_stacked(case, geo), self.kw(geo)

        def stacked(x, ts):
            return [
                hw.forward_stacked(
                    t,
                    x["s"],
                    x["w3"][layer],
                    x["z"],
                    x["bias2"][layer],
                    x["xproj"] if layer == 0 else None,
                    x["keep8"],
                    x["packed"],
                    layer=layer,
                    **kw,
                )  # fmt: skip
                for t, (_, layer) in zip(ts, FWD_SLOTS, strict=True)
            ]

        def padded(x):
            return [
                hw.forward_padded(
                    x["s"],
                    x["w3"][layer],
                    at(x["z"], t, layer),
                    x["bias2"][layer],
                    x["xproj"][t] if layer == 0 and x["xproj"] is not None else None,
                    at(x["keep8"], t, layer),
                    **kw,
                )  # fmt: skip
                for t, layer in FWD_SLOTS
            ]

        ts = jnp.array([t for t, _ in FWD_SLOTS], jnp.int32)  # traced time indices
        return x, jax.jit(stacked)(x, ts), jax.jit(padded)(x)

    @pytest.mark.parametrize("case", STACK_CASES, ids=str)
    def test_forward_stacked_equals_padded(self, case):
        x, got, want = self.run_forward(case)
        for (t, layer), (s_new, packed), (s_want, pre_want) in zip(
            FWD_SLOTS, got, want, strict=True
        ):
            slot = f"(t, layer) = {(t, layer)}"
            assert_close(s_new, s_want, *SAME, err_msg=slot)
            np.testing.assert_array_equal(packed[t, layer, :, 0], x["s"], err_msg=slot)
            assert_close(packed[t, layer, :, 1:], pre_want, *SAME, err_msg=slot)
            assert_equal_except(packed, x["packed"], (t, layer), f"packed elsewhere, {slot}")

    @per_mode_cache
    def run_backward(self, case: Case):
        geo = hw.Geometry.make(TEST_CONFIG, case.batch, case.n)
        x, kw = make_stacked(case, geo), self.kw(geo)

        def above(t, layer):
            """(d_scaled_above, w_t_above) as the padded kernel gets them."""
            if layer + 1 < L_STACK:
                return x["d_all"][t, layer + 1], x["w_t"][layer + 1]
            if t + 1 < T_STACK:
                return x["d_all"][t + 1, 0], x["w_t"][0]
            return jnp.zeros_like(x["d_all"][0, 0]), x["w_t"][0]

        def stacked(x, ts):
            return [
                hw.backward_fused_stacked(
                    t,
                    x["d_all"],
                    above(0, layer)[1],
                    x["ds_carry"],
                    x["g"],
                    x["packed"],
                    x["z"],
                    x["bias2"][layer],
                    x["xproj"] if layer == 0 else None,
                    x["keep8"],
                    x["dz_all"],
                    x["dbias"],
                    layer=layer,
                    **kw,
                )  # fmt: skip
                for t, (_, layer) in zip(ts, BWD_SLOTS, strict=True)
            ]

        def padded(x):
            out = []
            for t, layer in BWD_SLOTS:
                xp = x["xproj"][t] if layer == 0 and x["xproj"] is not None else None
                out.append(
                    hw.backward_fused_padded(
                        *above(t, layer),
                        x["ds_carry"],
                        x["g"][t, layer],
                        x["packed"][t, layer, :, 0],
                        x["packed"][t, layer, :, 1:],
                        at(x["z"], t, layer),
                        x["bias2"][layer],
                        xp,
                        at(x["keep8"], t, layer),
                        **kw,
                    )  # fmt: skip
                )
            return out

        ts = jnp.array([t for t, _ in BWD_SLOTS], jnp.int32)
        return x, jax.jit(stacked)(x, ts), jax.jit(padded)(x)

    @pytest.mark.parametrize("case", STACK_CASES, ids=str)
    def test_backward_fused_stacked_equals_padded(self, case):
        x, got, want = self.run_backward(case)
        for (t, layer), g, w in zip(BWD_SLOTS, got, want, strict=True):
            slot = f"(t, layer) = {(t, layer)}"
            d_all, ds_carry, dz_all, dbias = g
            d_want, ds_want, dz_want, dbias_want = w
            assert_close(d_all[t, layer], d_want, *SAME, scale_atol=True, err_msg=slot)
            assert_close(ds_carry, ds_want, *SAME, scale_atol=True, err_msg=slot)
            assert_equal_except(d_all, x["d_all"], (t, layer), f"d_scaled_all, {slot}")
            if case.has_z:
                assert_close(dz_all[t, layer], dz_want, *SAME, scale_atol=True, err_msg=slot)
                assert_equal_except(dz_all, x["dz_all"], (t, layer), f"dz_all, {slot}")
            else:
                assert dz_all is None and dz_want is None
            # Accumulated in place: dbias[layer] += this call's partial sums.
            want_acc = x["dbias"][layer] + dbias_want
            assert_close(dbias[layer], want_acc, *SAME, scale_atol=True, err_msg=slot)
            assert_equal_except(dbias, x["dbias"], (layer,), f"dbias elsewhere, {slot}")

    @per_mode_cache
    def run_scans(self, case: Case):
        """Forward scan + reverse while loop of the stacked kernels (traced t, carried
        buffers, as the caller runs them) against Python loops of the padded kernels."""
        geo = hw.Geometry.make(TEST_CONFIG, case.batch, case.n)
        x, kw = make_stacked(case, geo), self.kw(geo)
        b_pad, n_pad, parts = geo.b_pad, geo.n_pad, geo.grid[0]
        xp_of = (lambda layer: x["xproj"] if layer == 0 else None) if case.has_xproj else (
            lambda layer: None)  # fmt: skip
        w_above = [x["w_t"][(layer + 1) % L_STACK] for layer in range(L_STACK)]

        def stacked(x):
            def fwd(carry, _):
                (s, packed), t = carry
                for layer in range(L_STACK):
                    s, packed = hw.forward_stacked(
                        t, s, x["w3"][layer], x["z"], x["bias2"][layer], xp_of(layer),
                        x["keep8"], packed, layer=layer, **kw)  # fmt: skip
                return ((s, packed), t + 1), None

            packed0 = jnp.zeros((T_STACK, L_STACK, b_pad, 3, n_pad))
            ((s_last, packed), _), _ = jax.lax.scan(
                fwd, ((x["s"], packed0), jnp.int32(0)), None, length=T_STACK
            )

            def bwd(carry):
                (ds_carry, d_all, dz_all, dbias), t = carry
                for layer in reversed(range(L_STACK)):
                    d_all, ds_carry, dz_all, dbias = hw.backward_fused_stacked(
                        t, d_all, w_above[layer], ds_carry, x["g"], packed, x["z"],
                        x["bias2"][layer], xp_of(layer), x["keep8"], dz_all, dbias,
                        layer=layer, **kw)  # fmt: skip
                return (ds_carry, d_all, dz_all, dbias), t - 1

            dz0 = jnp.zeros((T_STACK, L_STACK, b_pad, n_pad)) if case.has_z else None
            init = (jnp.zeros((b_pad, n_pad)), jnp.zeros((T_STACK, L_STACK, b_pad, 2, n_pad)),
                    dz0, jnp.zeros((L_STACK, parts, 2, n_pad)))  # fmt: skip
            grads, _ = jax.lax.while_loop(lambda c: c[1] >= 0, bwd, (init, jnp.int32(T_STACK - 1)))
            return s_last, packed, grads

        def padded(x):
            s, saved = x["s"], {}
            for t in range(T_STACK):
                for layer in range(L_STACK):
                    xp = None if xp_of(layer) is None else x["xproj"][t]
                    s_new, pre = hw.forward_padded(
                        s, x["w3"][layer], at(x["z"], t, layer), x["bias2"][layer], xp,
                        at(x["keep8"], t, layer), **kw)  # fmt: skip
                    saved[t, layer], s = (s, pre, xp), s_new
            d_above = jnp.zeros((b_pad, 2, n_pad))
            ds_carry = jnp.zeros((b_pad, n_pad))
            d_all, dz_all, dbias = {}, {}, {layer: 0.0 for layer in range(L_STACK)}
            for t in reversed(range(T_STACK)):
                for layer in reversed(range(L_STACK)):
                    s_in, pre, xp = saved[t, layer]
                    d_above, ds_carry, dz, parts_ = hw.backward_fused_padded(
                        d_above, w_above[layer], ds_carry, x["g"][t, layer], s_in, pre,
                        at(x["z"], t, layer), x["bias2"][layer], xp, at(x["keep8"], t, layer),
                        **kw)  # fmt: skip
                    d_all[t, layer], dz_all[t, layer] = d_above, dz
                    dbias[layer] = dbias[layer] + parts_
            return s, saved, (ds_carry, d_all, dz_all, dbias)

        return jax.jit(stacked)(x), jax.jit(padded)(x)

    @pytest.mark.parametrize("case", [CASES[0], CASES[2]], ids=str)
    def test_scan_of_stacked_kernels_equals_padded_loops(self, case):
        (s_last, packed, grads), (s_want, saved, grads_want) = self.run_scans(case)
        tol = TOL[case.dtype]["kernel"]
        assert_close(s_last, s_want, *tol, err_msg="s_last")
        ds_carry, d_all, dz_all, dbias = grads
        for (t, layer), (s_in, pre, _) in saved.items():
            slot = f"(t, layer) = {(t, layer)}"
            assert_close(packed[t, layer, :, 0], s_in, *tol, err_msg=f"s_in {slot}")
            assert_close(packed[t, layer, :, 1:], pre, *tol, err_msg=f"pre {slot}")
            assert_close(d_all[t, layer], grads_want[1][t, layer], *tol, scale_atol=True,
                         err_msg=f"d_scaled {slot}")  # fmt: skip
            assert_close(dz_all[t, layer], grads_want[2][t, layer], *tol, scale_atol=True,
                         err_msg=f"dz {slot}")  # fmt: skip
        assert_close(ds_carry, grads_want[0], *tol, scale_atol=True, err_msg="ds_carry")
        for layer in range(L_STACK):
            assert_close(dbias[layer], grads_want[3][layer], *tol, scale_atol=True,
                         err_msg=f"dbias {layer}")  # fmt: skip


class TestStackedInterpret(StackedKernelTests):
    INTERPRET = True


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU (compiled Triton)")
class TestStackedCompiled(StackedKernelTests):
    INTERPRET = False


def stacked_shapes(dtype, steps=100, depth=7):
    g, sds, f32 = GEO_REAL, jax.ShapeDtypeStruct, jnp.float32
    tl = (steps, depth)
    return dict(
        t=sds((), jnp.int32),
        rows=sds((g.b_pad, g.n_pad), f32),
        rows_all=sds((*tl, g.b_pad, g.n_pad), f32),
        mask_all=sds((*tl, g.b_pad, g.n_pad), jnp.int8),
        xproj_all=sds((steps, g.b_pad, 2, g.n_pad), f32),
        packed=sds((*tl, g.b_pad, 3, g.n_pad), f32),
        d_all=sds((*tl, g.b_pad, 2, g.n_pad), f32),
        dbias=sds((depth, g.grid[0], 2, g.n_pad), f32),
        bias2=sds((2, g.n_pad), f32),
        w3=sds((g.n_pad, 2, g.n_pad), dtype),
        w_t=sds((2, g.n_pad, g.n_pad), dtype),
    )


def aliases(text: str) -> set[tuple[int, int]]:
    """(output index, operand index) pairs of the lowered custom call's operand aliasing."""
    pattern = r"output_tuple_indices = \[(\d+)\], operand_index = (\d+)"
    return {(int(o), int(i)) for o, i in re.findall(pattern, text)}


@DTYPES
@OPTIONALS
def test_forward_stacked_lowers_to_triton(dtype, full):
    x = stacked_shapes(dtype)
    opt = (lambda v: v) if full else (lambda v: None)
    fn = functools.partial(hw.forward_stacked, layer=0, keep=KEEP, geo=GEO_REAL)
    text = lower_for_cuda(fn, x["t"], x["rows"], x["w3"], opt(x["rows_all"]), x["bias2"],
                          opt(x["xproj_all"]), opt(x["mask_all"]), x["packed"])  # fmt: skip
    assert_one_triton_kernel(text, "highway_forward_stacked")
    # Operands: t, s, w3 (twice), bias2, [z_all, xproj_all, keep_all], packed_all.
    assert aliases(text) == {(1, 8 if full else 5)}


@DTYPES
@OPTIONALS
def test_backward_fused_stacked_lowers_to_triton(dtype, full):
    x = stacked_shapes(dtype)
    opt = (lambda v: v) if full else (lambda v: None)
    fn = functools.partial(hw.backward_fused_stacked, layer=6, keep=KEEP, geo=GEO_REAL)
    text = lower_for_cuda(fn, x["t"], x["d_all"], x["w_t"], opt(x["rows"]), opt(x["rows_all"]),
                          x["packed"], opt(x["rows_all"]), x["bias2"], opt(x["xproj_all"]),
                          opt(x["mask_all"]), opt(x["rows_all"]), x["dbias"])  # fmt: skip
    assert_one_triton_kernel(text, "highway_backward_fused_stacked")
    # Operands: t, d_scaled_all, w_t (twice), [ds_carry, g_all], packed_all, bias2, [z_all,
    # xproj_all, keep_all, dz_all], dbias_acc.
    assert aliases(text) == ({(0, 1), (2, 11), (3, 12)} if full else {(0, 1), (2, 6)})


def test_stacked_input_errors():
    x = stacked_shapes(jnp.float32, steps=4, depth=2)
    fwd = functools.partial(hw.forward_stacked, geo=GEO_REAL)
    args = (x["rows"], x["w3"], None, x["bias2"], None, None, x["packed"])
    with pytest.raises(ValueError, match="layer must be in"):
        jax.eval_shape(functools.partial(fwd, layer=2), x["t"], *args)
    with pytest.raises(ValueError, match="t must be an integer scalar"):
        jax.eval_shape(functools.partial(fwd, layer=0), jax.ShapeDtypeStruct((2,), jnp.int32),
                       *args)  # fmt: skip
    bwd = functools.partial(hw.backward_fused_stacked, layer=0, geo=GEO_REAL)
    with pytest.raises(ValueError, match="dz_all must be given exactly when z_all is"):
        jax.eval_shape(bwd, x["t"], x["d_all"], x["w_t"], None, None, x["packed"],
                       x["rows_all"], x["bias2"], None, None, None, x["dbias"])  # fmt: skip
    one_layer = jax.ShapeDtypeStruct((1, *x["dbias"].shape[1:]), jnp.float32)
    with pytest.raises(ValueError, match="dbias_acc must have padded shape"):
        jax.eval_shape(bwd, x["t"], x["d_all"], x["w_t"], None, None, x["packed"], None,
                       x["bias2"], None, None, None, one_layer)  # fmt: skip
