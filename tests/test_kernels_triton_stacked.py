"""The stacked kernels (`kernels/triton/stacked.py`): (t, layer) slices of [T, L, ...] arrays at a
traced t, against the unstacked launches per mode (`TestStackedInterpret`, `TestStackedCompiled`
on a GPU); their CUDA lowering with in-place aliasing; input errors."""

from __future__ import annotations

import functools
import re

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
    per_mode_cache,
)
from rhhjax.kernels import triton
from triton_launches import backward_fused_padded

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
        geo = triton.Geometry.make(TEST_CONFIG, case.batch, case.n)
        x, kw = make_stacked(case, geo), self.kw(geo)

        def stacked(x, ts):
            return [
                triton.forward_stacked(
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
                triton.forward_padded(
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
        geo = triton.Geometry.make(TEST_CONFIG, case.batch, case.n)
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
                triton.backward_fused_stacked(
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
                    backward_fused_padded(
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
        geo = triton.Geometry.make(TEST_CONFIG, case.batch, case.n)
        x, kw = make_stacked(case, geo), self.kw(geo)
        b_pad, n_pad, parts = geo.b_pad, geo.n_pad, geo.grid[0]
        xp_of = (lambda layer: x["xproj"] if layer == 0 else None) if case.has_xproj else (
            lambda layer: None)  # fmt: skip
        w_above = [x["w_t"][(layer + 1) % L_STACK] for layer in range(L_STACK)]

        def stacked(x):
            def fwd(carry, _):
                (s, packed), t = carry
                for layer in range(L_STACK):
                    s, packed = triton.forward_stacked(
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
                    d_all, ds_carry, dz_all, dbias = triton.backward_fused_stacked(
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
                    s_new, pre = triton.forward_padded(
                        s, x["w3"][layer], at(x["z"], t, layer), x["bias2"][layer], xp,
                        at(x["keep8"], t, layer), **kw)  # fmt: skip
                    saved[t, layer], s = (s, pre, xp), s_new
            d_above = jnp.zeros((b_pad, 2, n_pad))
            ds_carry = jnp.zeros((b_pad, n_pad))
            d_all, dz_all, dbias = {}, {}, {layer: 0.0 for layer in range(L_STACK)}
            for t in reversed(range(T_STACK)):
                for layer in reversed(range(L_STACK)):
                    s_in, pre, xp = saved[t, layer]
                    d_above, ds_carry, dz, parts_ = backward_fused_padded(
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


@NEEDS_GPU
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
    fn = functools.partial(triton.forward_stacked, layer=0, keep=KEEP, geo=GEO_REAL)
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
    fn = functools.partial(triton.backward_fused_stacked, layer=6, keep=KEEP, geo=GEO_REAL)
    text = lower_for_cuda(fn, x["t"], x["d_all"], x["w_t"], opt(x["rows"]), opt(x["rows_all"]),
                          x["packed"], opt(x["rows_all"]), x["bias2"], opt(x["xproj_all"]),
                          opt(x["mask_all"]), opt(x["rows_all"]), x["dbias"])  # fmt: skip
    assert_one_triton_kernel(text, "highway_backward_fused_stacked")
    # Operands: t, d_scaled_all, w_t (twice), [ds_carry, g_all], packed_all, bias2, [z_all,
    # xproj_all, keep_all, dz_all], dbias_acc.
    assert aliases(text) == ({(0, 1), (2, 11), (3, 12)} if full else {(0, 1), (2, 6)})


def test_stacked_input_errors():
    x = stacked_shapes(jnp.float32, steps=4, depth=2)
    fwd = functools.partial(triton.forward_stacked, geo=GEO_REAL)
    args = (x["rows"], x["w3"], None, x["bias2"], None, None, x["packed"])
    with pytest.raises(ValueError, match="layer must be in"):
        jax.eval_shape(functools.partial(fwd, layer=2), x["t"], *args)
    with pytest.raises(ValueError, match="t must be an integer scalar"):
        jax.eval_shape(functools.partial(fwd, layer=0), jax.ShapeDtypeStruct((2,), jnp.int32),
                       *args)  # fmt: skip
    bwd = functools.partial(triton.backward_fused_stacked, layer=0, geo=GEO_REAL)
    with pytest.raises(ValueError, match="dz_all must be given exactly when z_all is"):
        jax.eval_shape(bwd, x["t"], x["d_all"], x["w_t"], None, None, x["packed"],
                       x["rows_all"], x["bias2"], None, None, None, x["dbias"])  # fmt: skip
    one_layer = jax.ShapeDtypeStruct((1, *x["dbias"].shape[1:]), jnp.float32)
    with pytest.raises(ValueError, match="dbias_acc must have padded shape"):
        jax.eval_shape(bwd, x["t"], x["d_all"], x["w_t"], None, None, x["packed"], None,
                       x["bias2"], None, None, None, one_layer)  # fmt: skip
