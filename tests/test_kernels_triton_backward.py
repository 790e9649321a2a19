"""The backward kernel (`kernels/triton/backward.py`) on unstacked padded operands: the gate
backward alone, fused with the state-gradient GEMM and the GEMM alone, against their
references, and a two-layer chain against autodiff.

`BackwardKernelTests` runs once per mode: `TestBackwardInterpret` (Pallas interpret mode, runs
anywhere) and `TestBackwardCompiled` (the real Triton kernels; skipped unless
`jax.default_backend() == "gpu"`), so the same odd-size cases run compiled on a GPU.
Interpret mode accepts things Triton rejects, so the CUDA lowering tests -- which need no GPU
-- guard that every launch lowers to Triton. The gate backward alone and fused with the GEMM
are test-only launches (tests/triton_launches.py) of the kernel body the model runs stacked."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_cases import (
    CASES,
    DTYPES,
    GEO_REAL,
    KEEP,
    NEEDS_GPU,
    OPTIONALS,
    TEST_CONFIG,
    TOL,
    Case,
    assert_close,
    assert_one_triton_kernel,
    case_key,
    lower_for_cuda,
    make_unpadded,
    pad_layer,
    padded_shapes,
    per_mode_cache,
    unpadded_layer,
)
from rhhjax.kernels import triton
from rhhjax.kernels.triton.common import dot_precision
from triton_launches import backward_fused_padded, backward_padded


class BackwardKernelTests:
    """The backward launches against their references and autodiff; `INTERPRET` picks the
    mode (set by subclasses)."""

    INTERPRET: bool

    def kw(self, geo):
        return dict(geo=geo, config=TEST_CONFIG, interpret=self.INTERPRET)

    @per_mode_cache
    def run_padded(self, case: Case):
        """The backward launches and their references on one case's random inputs, one jit
        each (``pre`` from the forward reference)."""
        geo = triton.Geometry.make(TEST_CONFIG, case.batch, case.n)
        flags = (case.has_z, case.has_xproj, case.has_mask)
        u = make_unpadded(case_key(case), case.batch, case.n, case.dtype, *flags)
        p = pad_layer(u, geo, jnp.dtype(case.dtype))
        kw = self.kw(geo)

        def kernels(p, pre):
            elem = (p["s"], pre, p["z"], p["bias2"], p["xproj"], p["keep8"])
            bwd = backward_padded(p["ds"], *elem, g=p["g"], keep=KEEP, **kw)
            above = (p["d_above"], p["w_t"], p["ds"])
            fused = backward_fused_padded(*above, p["g"], *elem, keep=KEEP, **kw)
            grad = triton.state_grad_padded(*above, p["g"], **kw)
            # "GEMM then elementwise" with the two non-fused kernels.
            two = backward_padded(grad, *elem, keep=KEEP, **kw)
            return bwd, fused, grad, two

        def references(p, pre):
            elem = (p["s"], pre, p["z"], p["bias2"], p["xproj"], p["keep8"])
            bwd = triton.backward_padded_reference(p["ds"], *elem, g=p["g"], keep=KEEP)
            above = (p["d_above"], p["w_t"], p["ds"])
            fused = triton.backward_fused_reference(*above, p["g"], *elem, keep=KEEP)
            grad = triton.state_grad_reference(*above, p["g"])
            return bwd, fused, grad

        pre = triton.forward_padded_reference(
            p["s"], p["w3"], p["z"], p["bias2"], p["xproj"], p["keep8"], keep=KEEP
        )[1]
        return geo, u, p, jax.jit(kernels)(p, pre), jax.jit(references)(p, pre)

    def tol(self, case):
        return TOL[case.dtype]["kernel"]

    # --- padded kernels vs references ----------------------------------------------------

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
        geo, _, _, (bwd, *_), (bwd_ref, *_) = self.run_padded(case)
        self.check_backward(geo, case, bwd, bwd_ref, "backward")

    @pytest.mark.parametrize("case", CASES, ids=str)
    def test_backward_fused_equals_gemm_then_elementwise(self, case):
        geo, _, _, (_, fused, _, two), (_, fused_ref, _) = self.run_padded(case)
        self.check_backward(geo, case, fused, fused_ref, "fused vs reference")
        # And the fused kernel equals the two separate kernels (state_grad, then backward).
        self.check_backward(geo, case, fused, two[:3] + (two[3].sum(0, keepdims=True),), "2k")

    @pytest.mark.parametrize("case", CASES, ids=str)
    def test_state_grad_padded(self, case):
        _, _, _, (*_, grad, _), (*_, grad_ref) = self.run_padded(case)
        assert_close(grad, grad_ref, *self.tol(case), err_msg="state grad")

    @pytest.mark.parametrize("case", CASES, ids=str)
    def test_padded_units_and_rows_zero(self, case):
        geo, _, p, (bwd, fused, grad, _), _ = self.run_padded(case)
        b, n = case.batch, case.n
        assert np.all(np.isfinite(np.asarray(grad))), "grad"
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
        geo = triton.Geometry.make(TEST_CONFIG, batch, n)
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
            s1, pre0 = triton.forward_padded(sp, geo.pad_weight(w0, dt), z0p, b0p, xp, m0,
                                         keep=KEEP, **kw)  # fmt: skip
            s2, pre1 = triton.forward_padded(s1, geo.pad_weight(w1, dt), z1p, b1p, None, m1,
                                         keep=KEEP, **kw)  # fmt: skip
            gp0, gp1 = geo.pad_rows(g0), geo.pad_rows(g1)
            d1, c1, dz1, db1 = backward_padded(gp1, s1, pre1, z1p, b1p, None, m1,
                                                  keep=KEEP, **kw)  # fmt: skip
            d0, c0, dz0, db0 = backward_fused_padded(
                d1, geo.pad_weight_t(w1, dt), c1, gp0, sp, pre0, z0p, b0p, xp, m0, keep=KEEP, **kw
            )
            ds0 = triton.state_grad_padded(d0, geo.pad_weight_t(w0, dt), c0, **kw)
            dw = [
                jnp.dot(
                    x.T.astype(dt),
                    d.reshape(geo.b_pad, -1).astype(dt),
                    precision=dot_precision(dt, False),
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


class TestBackwardInterpret(BackwardKernelTests):
    INTERPRET = True


@NEEDS_GPU
class TestBackwardCompiled(BackwardKernelTests):
    INTERPRET = False


@OPTIONALS
def test_backward_padded_lowers_to_triton(full):
    x = padded_shapes(jnp.float32)
    opt = (lambda v: v) if full else (lambda v: None)

    def fn(*args):
        return backward_padded(*args[:-1], g=args[-1], keep=KEEP, geo=GEO_REAL)

    args = (x["rows"], x["rows"], x["rows2"], opt(x["rows"]), x["bias2"], opt(x["rows2"]),
            opt(x["mask"]), opt(x["rows"]))  # fmt: skip
    text = lower_for_cuda(fn, *args)
    assert_one_triton_kernel(text, "highway_backward")


@DTYPES
@OPTIONALS
def test_backward_fused_lowers_to_triton(dtype, full):
    x = padded_shapes(dtype)
    opt = (lambda v: v) if full else (lambda v: None)
    fn = functools.partial(backward_fused_padded, keep=KEEP, geo=GEO_REAL)
    text = lower_for_cuda(fn, x["rows2"], x["w_t"], opt(x["rows"]), opt(x["rows"]), x["rows"],
                          x["rows2"], opt(x["rows"]), x["bias2"], opt(x["rows2"]),
                          opt(x["mask"]))  # fmt: skip
    assert_one_triton_kernel(text, "highway_backward_fused")


@DTYPES
def test_state_grad_lowers_to_triton(dtype):
    x = padded_shapes(dtype)
    fn = functools.partial(triton.state_grad_padded, geo=GEO_REAL)
    text = lower_for_cuda(fn, x["rows2"], x["w_t"], x["rows"], None)
    assert_one_triton_kernel(text, "highway_state_grad")
