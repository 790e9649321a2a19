"""The forward kernel (`kernels/triton/forward.py`): against its reference per mode
(`TestForwardInterpret` anywhere, `TestForwardCompiled` on a GPU), its CUDA lowering (no GPU
needed) and its one-line operand errors."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import kernel_cases as kc
import numpy as np
import pytest
from rhhjax.kernels import triton


class ForwardKernelTests:
    """`forward_padded` against `forward_padded_reference`; `INTERPRET` picks the mode."""

    INTERPRET: bool

    @kc.per_mode_cache
    def run_forward(self, case: kc.Case):
        """The kernel and its reference on one case's random inputs, one jit each."""
        geo = triton.Geometry.make(kc.TEST_CONFIG, case.batch, case.n)
        flags = (case.has_z, case.has_xproj, case.has_mask)
        u = kc.make_unpadded(kc.case_key(case), case.batch, case.n, case.dtype, *flags)
        p = kc.pad_layer(u, geo, jnp.dtype(case.dtype))
        kw = dict(geo=geo, config=kc.TEST_CONFIG, interpret=self.INTERPRET)

        def operands(p):
            return p["s"], p["w3"], p["z"], p["bias2"], p["xproj"], p["keep8"]

        kernel = jax.jit(lambda p: triton.forward_padded(*operands(p), keep=kc.KEEP, **kw))
        reference = jax.jit(lambda p: triton.forward_padded_reference(*operands(p), keep=kc.KEEP))
        return geo, kernel(p), reference(p)

    @pytest.mark.parametrize("case", kc.CASES, ids=str)
    def test_forward_padded(self, case):
        geo, (s_new, pre), (s_ref, pre_ref) = self.run_forward(case)
        assert s_new.shape == (geo.b_pad, geo.n_pad) and pre.shape == (geo.b_pad, 2, geo.n_pad)
        assert s_new.dtype == jnp.float32 and pre.dtype == jnp.float32
        tol = kc.TOL[case.dtype]["kernel"]
        kc.assert_close(pre, pre_ref, *tol, err_msg="pre")
        kc.assert_close(s_new, s_ref, *tol, err_msg="s_new")

    @pytest.mark.parametrize("case", kc.CASES, ids=str)
    def test_padded_units_zero_and_rows_finite(self, case):
        _, (s_new, pre), _ = self.run_forward(case)
        b, n = case.batch, case.n
        for name, x in [("s_new", s_new), ("pre", pre[:, :, n:])]:
            assert np.all(np.isfinite(np.asarray(x))), name
        np.testing.assert_array_equal(np.asarray(s_new[:, n:]), 0.0)
        np.testing.assert_array_equal(np.asarray(pre[:, :, n:]), 0.0)
        np.testing.assert_array_equal(np.asarray(pre[b:]), 0.0)  # padded rows: s = 0


class TestForwardInterpret(ForwardKernelTests):
    INTERPRET = True


@kc.NEEDS_GPU
class TestForwardCompiled(ForwardKernelTests):
    INTERPRET = False


@kc.DTYPES
@kc.OPTIONALS
def test_forward_padded_lowers_to_triton(dtype, full):
    x = kc.padded_shapes(dtype)
    opt = (lambda v: v) if full else (lambda v: None)
    fn = functools.partial(triton.forward_padded, keep=kc.KEEP, geo=kc.GEO_REAL)
    text = kc.lower_for_cuda(fn, x["rows"], x["w3"], opt(x["rows"]), x["bias2"], opt(x["rows2"]),
                          opt(x["mask"]))  # fmt: skip
    kc.assert_one_triton_kernel(text, "highway_forward")


def test_shape_errors():
    geo = triton.Geometry.make(kc.TEST_CONFIG, 4, 20)
    p = kc.pad_layer(kc.make_unpadded(jax.random.key(0), 4, 20, "float32", True, True, True),
                  geo, jnp.float32)  # fmt: skip
    with pytest.raises(ValueError, match="w3 must have padded shape"):
        triton.forward_padded(p["s"], p["w3"][:16], None, p["bias2"], None, None, geo=geo)
    with pytest.raises(ValueError, match="z must have padded shape"):
        triton.forward_padded(p["s"], p["w3"], p["z"][:4], p["bias2"], None, None, geo=geo)
    with pytest.raises(ValueError, match="xproj must have dtype float32"):
        triton.forward_padded(p["s"], p["w3"], None, p["bias2"], p["xproj"].astype(jnp.bfloat16),
                          None, geo=geo)  # fmt: skip
    with pytest.raises(ValueError, match="keep_mask must have dtype int8"):
        triton.forward_padded(p["s"], p["w3"], None, p["bias2"], None, p["keep8"] > 0, geo=geo)
    with pytest.raises(ValueError, match="Geometry needs batch >= 1"):
        triton.Geometry.make(kc.TEST_CONFIG, 0, 20)
    with pytest.raises(ValueError, match="keep must be in"):
        triton.forward_padded(
            p["s"], p["w3"], None, p["bias2"], None, p["keep8"], keep=0.0, geo=geo
        )
    with pytest.raises(ValueError, match="keep_mask must have dtype int8"):  # no float masks
        triton.forward_padded(p["s"], p["w3"], None, p["bias2"], None,
                          p["keep8"].astype(jnp.float32), geo=geo)  # fmt: skip
