"""The K loop every Mosaic GPU kernel here shares: one block's f32 tile of ``A @ B^T``
through a ``stages``-deep TMA pipeline into a wgmma accumulator, stored to shared memory."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from rhhjax.kernels.layout import F32


def wgmma_transforms(cols: int, dtype) -> tuple:
    """wgmma shared-memory transforms of a tile with ``cols`` minor elements."""
    swizzle = plgpu.find_swizzle(cols * jnp.dtype(dtype).itemsize * 8)
    elems = swizzle // jnp.dtype(dtype).itemsize
    return (plgpu.TilingTransform((8, elems)), plgpu.SwizzleTransform(swizzle))


def gemm_nt_to_smem(
    out,
    a_gmem,
    b_gmem,
    a_block: jax.Array | int,
    b_block: jax.Array | int,
    *,
    tile_k: int,
    k_steps: int,
    stages: int,
) -> None:
    """``out [rows, cols] f32 (shared memory) = A[a_block] @ B[b_block]^T``, K =
    ``k_steps * tile_k``; A and B are K minor."""
    rows, cols = out.shape
    layout = wgmma_transforms(tile_k, a_gmem.dtype)

    def accumulate(acc):
        def k_step(_, a_smem, b_smem):
            plgpu.wgmma(acc, a_smem, b_smem.transpose((1, 0)))
            plgpu.wgmma_wait(0)

        plgpu.emit_pipeline(
            k_step,
            grid=(k_steps,),
            in_specs=[
                plgpu.BlockSpec((rows, tile_k), lambda k: (a_block, k), transforms=layout),
                plgpu.BlockSpec((cols, tile_k), lambda k: (b_block, k), transforms=layout),
            ],
            max_concurrent_steps=stages,
        )(a_gmem, b_gmem)
        out[...] = acc[...]

    pl.run_scoped(accumulate, plgpu.ACC((rows, cols), F32))
    plgpu.commit_smem()  # a warpgroup barrier: others read `out` in another layout
