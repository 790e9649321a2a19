"""The K loop every Mosaic GPU kernel here shares: one block's f32 tile of ``A @ B^T``
through a ``stages``-deep TMA pipeline into a wgmma accumulator, stored to shared memory.
``in_flight`` 1 keeps one K chunk's wgmma running under the next one's issue."""

from __future__ import annotations

import functools

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
    in_flight: int = 0,
) -> None:
    """``out [rows, cols] f32 (shared memory) = A[a_block] @ B[b_block]^T``, K =
    ``k_steps * tile_k``; A and B are K minor. ``in_flight`` (0 or 1, below ``stages``):
    wgmma groups left running at each step; a slot is refilled only once its wgmma is done
    (``delay_release``)."""
    if in_flight not in (0, 1) or stages <= in_flight:
        raise ValueError(f"in_flight must be 0 or 1 and below stages {stages}, got {in_flight}.")
    rows, cols = out.shape
    layout = wgmma_transforms(tile_k, a_gmem.dtype)
    spec = functools.partial(plgpu.BlockSpec, transforms=layout, delay_release=in_flight)

    def accumulate(acc):
        def k_step(_, a_smem, b_smem):
            plgpu.wgmma(acc, a_smem, b_smem.transpose((1, 0)))
            plgpu.wgmma_wait(in_flight)

        plgpu.emit_pipeline(
            k_step,
            grid=(k_steps,),
            in_specs=[
                spec((rows, tile_k), lambda k: (a_block, k)),
                spec((cols, tile_k), lambda k: (b_block, k)),
            ],
            max_concurrent_steps=stages,
        )(a_gmem, b_gmem)
        if in_flight:
            plgpu.wgmma_wait(0)
        out[...] = acc[...]

    pl.run_scoped(accumulate, plgpu.ACC((rows, cols), F32))
    plgpu.commit_smem()  # a warpgroup barrier: others read `out` in another layout
