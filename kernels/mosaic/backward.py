"""One highway micro-layer backward as a Mosaic GPU kernel: the layer above's state-gradient
GEMM fused with this layer's gate backward. The math and shapes: `highway_backward_reference`,
the same in JAX."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from rhhjax.kernels.layout import F32
from rhhjax.kernels.mosaic.gemm import gemm_nt_to_smem

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class MosaicBackwardConfig:
    """Tiles: ``tile_m`` rows (a multiple of 64), ``units`` per program (a multiple of 8),
    ``tile_k`` K per pipeline step, ``stages`` in flight."""

    tile_m: int = 64
    units: int = 16
    tile_k: int = 64
    stages: int = 4

    def check(self, b_pad: int, n_pad: int) -> None:
        if self.tile_m % 64 or self.units % 8 or self.tile_k % 16:
            raise ValueError(f"{self}: tile_m % 64, units % 8 and tile_k % 16 must be 0.")
        for name, size, tile in (
            ("b_pad", b_pad, self.tile_m),
            ("n_pad", n_pad, self.units),
            ("2 * n_pad", 2 * n_pad, self.tile_k),
        ):
            if size % tile:
                raise ValueError(f"{name} {size} is not a multiple of {tile} ({self}).")


def _gate_backward(acc, ins: dict) -> dict:
    """The epilogue on one tile: acc, inputs -> da_h, da_t, ds_carry, d_h, d_t."""
    ds = acc + ins["ds_carry"] + ins["g_out"]
    h, t = ins["h"], ins["t"]
    t_used, h_used = (t, h) if "mask" not in ins else (t * ins["mask"], h * ins["mask"])
    da_h = ds * t_used * (1.0 - h * h)
    da_t = ds * (h_used - ins["s_prev"]) * t * (1.0 - t)
    d_h, d_t = (da_h, da_t) if "z" not in ins else (da_h * ins["z"], da_t * ins["z"])
    return dict(da_h=da_h, da_t=da_t, ds_carry=ds * (1.0 - t), d_h=d_h, d_t=d_t)


_ROWS = ("ds_carry", "g_out", "s_prev", "h", "t")


def highway_backward(
    d_above: Array,
    w_above: Array,
    ds_carry: Array,
    g_out: Array,
    s_prev: Array,
    h: Array,
    t: Array,
    z: Array | None = None,
    mask: Array | None = None,
    *,
    config: MosaicBackwardConfig | None = None,
    interpret: Any = None,
):
    """``ds = d_above @ w_above^T + ds_carry + g_out``, then the gate backward. d_above
    [b_pad, 2 * n_pad], w_above [n_pad, 2 * n_pad]; the rest [b_pad, n_pad] f32. Returns
    (d_scaled [b_pad, 2, n_pad], ds_carry [b_pad, n_pad], da [b_pad, 2, n_pad]); ``interpret``:
    GPU interpret mode."""
    config = config or MosaicBackwardConfig()
    b_pad, k_pad = d_above.shape
    n_pad = w_above.shape[0]
    config.check(b_pad, n_pad)
    if k_pad != 2 * n_pad or w_above.shape[1] != k_pad:
        raise ValueError(f"d_above {d_above.shape} and w_above {w_above.shape} do not match.")
    tm, u, tk = config.tile_m, config.units, config.tile_k
    mm_dtype = d_above.dtype
    inputs = dict(ds_carry=ds_carry, g_out=g_out, s_prev=s_prev, h=h, t=t, z=z, mask=mask)
    given = [name for name, array in inputs.items() if array is not None]
    n_in = len(given)
    f32_outs = ("ds_carry", "da_h", "da_t")

    def kernel(*refs, epi, dsc, acc_smem, bar):
        d_g, w_g = refs[:2]
        in_refs = dict(zip(given, refs[2 : 2 + n_in], strict=True))
        d_scaled_g, ds_carry_g, da_g = refs[2 + n_in :]
        m, g = jax.lax.axis_index("m"), jax.lax.axis_index("g")
        rows, units = pl.ds(m * tm, tm), pl.ds(g * u, u)

        for slot, name in enumerate(given):
            plgpu.copy_gmem_to_smem(in_refs[name].at[rows, units], epi.at[slot], bar.at[slot])
        gemm_nt_to_smem(
            acc_smem, d_g, w_g, m, g, tile_k=tk, k_steps=k_pad // tk, stages=config.stages
        )
        for slot in range(n_in):
            plgpu.barrier_wait(bar.at[slot])
        tiles = _gate_backward(acc_smem[...], {name: epi[slot] for slot, name in enumerate(given)})
        for i, name in enumerate(f32_outs):
            epi[n_in + i] = tiles[name]
        dsc[0] = tiles["d_h"].astype(mm_dtype)
        dsc[1] = tiles["d_t"].astype(mm_dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(epi.at[n_in], ds_carry_g.at[rows, units])
        plgpu.copy_smem_to_gmem(epi.at[n_in + 1], da_g.at[rows, 0, units])
        plgpu.copy_smem_to_gmem(epi.at[n_in + 2], da_g.at[rows, 1, units])
        plgpu.copy_smem_to_gmem(dsc.at[0], d_scaled_g.at[rows, 0, units])
        plgpu.copy_smem_to_gmem(dsc.at[1], d_scaled_g.at[rows, 1, units])
        plgpu.wait_smem_to_gmem(0)

    halves = (b_pad, 2, n_pad)
    out_type = (
        jax.ShapeDtypeStruct(halves, mm_dtype),
        jax.ShapeDtypeStruct((b_pad, n_pad), F32),
        jax.ShapeDtypeStruct(halves, F32),
    )
    return plgpu.kernel(
        kernel,
        out_type=out_type,
        scratch_types=dict(
            epi=plgpu.SMEM((n_in + len(f32_outs), tm, u), F32),
            dsc=plgpu.SMEM((2, tm, u), mm_dtype),
            acc_smem=plgpu.SMEM((tm, u), F32),
            bar=plgpu.Barrier(num_barriers=n_in),
        ),
        grid=(b_pad // tm, n_pad // u),
        grid_names=("m", "g"),
        kernel_name="mosaic_highway_backward",
        interpret=interpret,
    )(d_above, w_above, *(inputs[name] for name in given))


def highway_backward_reference(
    d_above: Array,
    w_above: Array,
    ds_carry: Array,
    g_out: Array,
    s_prev: Array,
    h: Array,
    t: Array,
    z: Array | None = None,
    mask: Array | None = None,
):
    """Pure-JAX `highway_backward` with the kernel's own epilogue math."""
    acc = jnp.matmul(d_above, w_above.T, preferred_element_type=F32)
    ins = dict(ds_carry=ds_carry, g_out=g_out, s_prev=s_prev, h=h, t=t)
    if z is not None:
        ins["z"] = z
    if mask is not None:
        ins["mask"] = mask
    tiles = _gate_backward(acc, ins)
    d_scaled = jnp.stack([tiles["d_h"], tiles["d_t"]], axis=-2).astype(d_above.dtype)
    da = jnp.stack([tiles["da_h"], tiles["da_t"]], axis=-2)
    return d_scaled, tiles["ds_carry"], da
