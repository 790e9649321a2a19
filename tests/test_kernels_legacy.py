"""The legacy unpadded API (`kernels/legacy.py`): values and custom-VJP gradients against the
references, per mode (`TestLegacyInterpret`, `TestLegacyCompiled` on a GPU), its CUDA lowering,
and the guard that the lowering rejects what interpret mode runs."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest
from kernel_cases import (
    B_REAL,
    DTYPES,
    KEEP,
    N_REAL,
    NEEDS_GPU,
    TEST_CONFIG,
    TOL,
    assert_close,
    count_triton_calls,
    lower_for_cuda,
    make_unpadded,
    per_mode_cache,
)
from rhhjax.kernels import highway as hw


class LegacyKernelTests:
    """The legacy unpadded API against its references; `INTERPRET` picks the mode."""

    INTERPRET: bool

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


class TestLegacyInterpret(LegacyKernelTests):
    INTERPRET = True


@NEEDS_GPU
class TestLegacyCompiled(LegacyKernelTests):
    INTERPRET = False


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
    """The guard: interpret mode runs a block_k=24 kernel, Triton lowering rejects it.

    The config check is switched off through `HighwayConfig.validate`, the one method every
    wrapper calls: `monkeypatch.setattr` raises if it is gone, and the check below that it is
    really off fails if a wrapper validates some other way."""
    bad = hw.HighwayConfig(block_b=16, block_n=16, block_k=24)
    with pytest.raises(hw.KernelConfigError, match="block_k must be a power of two"):
        hw.Geometry.make(bad, 4, 48)
    monkeypatch.setattr(hw.HighwayConfig, "validate", lambda self, dot_dtype=None: None)
    assert hw.Geometry.make(bad, 4, 48).block_k == 24  # the check is off
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
