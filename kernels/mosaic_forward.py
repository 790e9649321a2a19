"""One highway micro-layer forward as a Mosaic GPU Pallas kernel (Hopper: wgmma, TMA).

A first step towards the persistent kernel of issue 20 (`kernels/persistent_plan.py`): the
same column ownership as one of its phases, as a standalone launch. Program ``(m, g)`` owns
rows ``m * tile_m ..`` and units ``g * u ..`` (both the h- and the t-columns of its units)::

    acc          = s[rows, :] @ W_blocks[:, g]   [tile_m, 2u]: the h- then the t-columns of
                   its units (one wgmma N of 2u; K in ``tile_k`` chunks through a TMA
                   pipeline, chunk 0 first, f32 accumulation)
    a_h, a_t     = acc[:, :u] * z + b_h, acc[:, u:] * z + b_t
    s_new        = tanh(a_h) * sigmoid(a_t) + s * (1 - sigmoid(a_t))

No input projection, no dropout (a middle micro-layer in evaluation). Operands, padded
(``n_pad`` a multiple of ``u``, ``k_pad`` of ``tile_k``, ``b_pad`` of ``tile_m``):

    s_mm  [b_pad, k_pad]  bf16   the state as the matmul input
    w_blk [2 * n_pad, k_pad] bf16  W^T in block-major order: rows g * 2u .. hold the
                                 h-columns then the t-columns of W for units g * u ..
                                 (K minor, so that its tiles swizzle like the state's)
    z     [b_pad, n_pad]  f32    hyper scales
    s     [b_pad, n_pad]  f32    the carried state
    bias  [b_pad, 2, n_pad] f32  b broadcast over rows (the epilogue reads tiles only)
    ->    [b_pad, n_pad]  f32    the new state

`highway_forward_reference` is the same math in plain JAX. The kernel needs an H100 to run;
it lowers for one on a CPU host with the CUDA plugin (tests/test_mosaic_forward.py).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class MosaicForwardConfig:
    """Tile sizes: ``tile_m`` rows (a multiple of 64: one warpgroup's wgmma M), ``units``
    per program (wgmma N = 2 * units), ``tile_k`` K per pipeline step (both operand tiles
    have K minor: wgmma needs their swizzles equal), ``stages`` concurrent pipeline steps."""

    tile_m: int = 64
    units: int = 8
    tile_k: int = 64
    stages: int = 4

    def check(self, b_pad: int, n_pad: int, k_pad: int) -> None:
        """One-line ValueError unless the padded extents tile exactly."""
        if self.tile_m % 64 or self.units % 8 or self.tile_k % 16:
            raise ValueError(f"{self}: tile_m % 64, units % 8 and tile_k % 16 must be 0.")
        for name, size, tile in (("b_pad", b_pad, self.tile_m), ("n_pad", n_pad, self.units)):
            if size % tile:
                raise ValueError(f"{name} {size} is not a multiple of {tile} ({self}).")
        if k_pad % self.tile_k:
            raise ValueError(f"k_pad {k_pad} is not a multiple of tile_k {self.tile_k}.")


def _transforms(cols: int, dtype) -> tuple:
    """wgmma shared-memory layout of a tile whose minor dim has ``cols`` elements."""
    swizzle = plgpu.find_swizzle(cols * jnp.dtype(dtype).itemsize * 8)
    elems = swizzle // jnp.dtype(dtype).itemsize
    return (plgpu.TilingTransform((8, elems)), plgpu.SwizzleTransform(swizzle))


def highway_forward(s_mm, w_blk, z, s, bias, config: MosaicForwardConfig | None = None):
    """The micro-layer forward as one Mosaic GPU kernel; shapes in the module docstring.

    Runs on a Hopper GPU only. (JAX 0.10.2's private Mosaic GPU interpreter cannot run it on
    a CPU: it rejects the accumulator beside shared memory in one scope, and the transposed
    weight tile, tried 2026-11-24.)"""
    config = config or MosaicForwardConfig()
    b_pad, k_pad = s_mm.shape
    n_pad = w_blk.shape[0] // 2
    config.check(b_pad, n_pad, k_pad)
    tm, u, tk = config.tile_m, config.units, config.tile_k
    mm_dtype = s_mm.dtype

    def kernel(s_mm_g, w_g, z_g, s_g, bias_g, out_g, epi, pre, bar):
        m, g = pl.program_id(0), pl.program_id(1)
        rows, units = pl.ds(m * tm, tm), pl.ds(g * u, u)

        def step(acc):
            def k_step(_, a_smem, b_smem):
                plgpu.wgmma(acc, a_smem, plgpu.transpose_ref(b_smem, (1, 0)))
                plgpu.wgmma_wait(0)

            pipeline = _pipeline(k_step, m, g)
            pipeline(s_mm_g, w_g)
            pre[...] = acc[...]

        # Epilogue operands by TMA while the K loop runs.
        sources = (z_g.at[rows, units], s_g.at[rows, units])
        sources += (bias_g.at[rows, 0, units], bias_g.at[rows, 1, units])
        for slot, src in enumerate(sources):
            plgpu.copy_gmem_to_smem(src, epi.at[slot], bar.at[slot])
        # The accumulator in its own scope (registers), apart from the shared memory.
        pl.run_scoped(step, plgpu.ACC((tm, 2 * u), F32))
        for slot in range(len(sources)):
            plgpu.barrier_wait(bar.at[slot])
        a_h = pre[:, pl.ds(0, u)] * epi[0] + epi[2]
        a_t = pre[:, pl.ds(u, u)] * epi[0] + epi[3]
        t = jax.nn.sigmoid(a_t)
        epi[4] = jnp.tanh(a_h) * t + epi[1] * (1.0 - t)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(epi.at[4], out_g.at[rows, units])
        plgpu.wait_smem_to_gmem(0)

    def _pipeline(k_step, m, g):
        """The K loop: state tile [tile_m, tile_k] and weight tile [2u, tile_k] per step."""
        return plgpu.emit_pipeline(
            k_step,
            grid=(k_pad // tk,),
            in_specs=[
                plgpu.BlockSpec((tm, tk), lambda k: (m, k), transforms=_transforms(tk, mm_dtype)),
                plgpu.BlockSpec(
                    (2 * u, tk), lambda k: (g, k), transforms=_transforms(tk, mm_dtype)
                ),
            ],
            max_concurrent_steps=config.stages,
        )

    return plgpu.kernel(
        kernel,
        out_shape=jax.ShapeDtypeStruct((b_pad, n_pad), F32),
        scratch_shapes=dict(
            epi=plgpu.SMEM((5, tm, u), F32),
            pre=plgpu.SMEM((tm, 2 * u), F32),
            bar=plgpu.Barrier(num_barriers=4),
        ),
        grid=(b_pad // tm, n_pad // u),
        grid_names=("m", "g"),
    )(s_mm, w_blk, z, s, bias)


def highway_forward_reference(s_mm, w_blk, z, s, bias, units: int):
    """Pure-JAX `highway_forward` for ``units`` per program: f32 accumulation of the matmul
    dtype's products, the block-major columns put back in (h, t) order."""
    b_pad, n_pad = s.shape
    acc = jnp.matmul(s_mm, w_blk.T, preferred_element_type=F32)
    acc = acc.reshape(b_pad, n_pad // units, 2, units).transpose(0, 2, 1, 3)
    a = acc.reshape(b_pad, 2, n_pad) * z[:, None] + bias
    t = jax.nn.sigmoid(a[:, 1])
    return jnp.tanh(a[:, 0]) * t + s * (1.0 - t)


def operands(w: jax.Array, s: jax.Array, z: jax.Array, b: jax.Array, dtype, units: int, k_pad):
    """(W_l [n, 2n], s [B, n], z [B, n], b_l [2n]) with B a multiple of the row tile and n of
    ``units`` (callers pad) -> the kernel's (s_mm, w_blk, z, s, bias) for ``k_pad >= n``."""
    batch, n = s.shape
    s_mm = jnp.pad(s, [(0, 0), (0, k_pad - n)]).astype(dtype)
    w3 = jnp.pad(w, [(0, k_pad - n), (0, 0)]).reshape(k_pad, 2, n // units, units)
    w_blk = w3.transpose(2, 1, 3, 0).reshape(2 * n, k_pad).astype(dtype)
    bias = jnp.broadcast_to(b.reshape(1, 2, n), (batch, 2, n)).astype(F32)
    return s_mm, w_blk, z.astype(F32), s.astype(F32), bias
