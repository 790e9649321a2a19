"""One highway micro-layer forward as a Mosaic GPU kernel; program (m, g) owns rows
``m * tile_m ..`` and the h- and t-columns of units ``g * u ..``. The math and shapes:
`highway_forward_reference`, the same in JAX."""

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
class MosaicForwardConfig:
    """Tiles: ``tile_m`` rows (a multiple of 64), ``units`` per program (wgmma N = 2 *
    units), ``tile_k`` K per pipeline step, ``stages`` in flight."""

    tile_m: int = 64
    units: int = 8
    tile_k: int = 64
    stages: int = 4

    def check(self, b_pad: int, n_pad: int, k_pad: int) -> None:
        if self.tile_m % 64 or self.units % 8 or self.tile_k % 16:
            raise ValueError(f"{self}: tile_m % 64, units % 8 and tile_k % 16 must be 0.")
        for name, size, tile in (("b_pad", b_pad, self.tile_m), ("n_pad", n_pad, self.units)):
            if size % tile:
                raise ValueError(f"{name} {size} is not a multiple of {tile} ({self}).")
        if k_pad % self.tile_k:
            raise ValueError(f"k_pad {k_pad} is not a multiple of tile_k {self.tile_k}.")


def _epilogue(pre_h, pre_t, ins: dict) -> dict:
    """The gate math on one tile, shared by the kernel and the reference: pre_h, pre_t
    [tm, u] and ``ins`` -> (s_new, h, t, full_h, full_t)."""
    full_h, full_t = pre_h, pre_t
    if "x_h" in ins:
        full_h, full_t = full_h + ins["x_h"], full_t + ins["x_t"]
    h, t = gates(full_h, full_t, ins)
    gate = t if "mask" not in ins else t * ins["mask"]
    s_new = h * gate + ins["s"] * (1.0 - t)
    return dict(s_new=s_new, h=h, t=t, full_h=full_h, full_t=full_t)


def gates(full_h, full_t, ins: dict):
    """h, tg [tm, u] from ``full``'s halves and ``ins`` (b_h, b_t, optional z); the
    persistent backward recomputes the gates with it."""
    a_h, a_t = full_h, full_t
    if "z" in ins:
        a_h, a_t = a_h * ins["z"], a_t * ins["z"]
    return jnp.tanh(a_h + ins["b_h"]), jax.nn.sigmoid(a_t + ins["b_t"])


def _output_names(save: bool, has_z: bool) -> tuple[str, ...]:
    if not save:
        return ("s_new",)
    return ("s_new", "h", "t", "full_h", "full_t") if has_z else ("s_new", "h", "t")


def _assemble(tiles: dict, names: tuple[str, ...]):
    if len(names) == 1:
        return tiles["s_new"]
    out = (tiles["s_new"], tiles["h"], tiles["t"])
    if "full_h" in names:
        out += (jnp.stack([tiles["full_h"], tiles["full_t"]], axis=-2),)
    return out


def highway_forward(
    s_mm: Array,
    w_blk: Array,
    s: Array,
    bias: Array,
    z: Array | None = None,
    xproj: Array | None = None,
    mask: Array | None = None,
    *,
    save: bool = False,
    config: MosaicForwardConfig | None = None,
    interpret: Any = None,
):
    """``s_new = tanh(a_h) * sigmoid(a_t) (* mask) + s * (1 - sigmoid(a_t))`` with ``a = (s_mm @
    w_blk^T (+ xproj)) (* z) + bias``. s_mm [b_pad, k_pad]; w_blk [2 * n_pad, k_pad] (W^T
    block-major); s, z, mask [b_pad, n_pad]; bias, xproj [b_pad, 2, n_pad]. Returns s_new, or
    with ``save`` (s_new, h, t[, full]); ``interpret``: GPU interpret mode."""
    config = config or MosaicForwardConfig()
    b_pad, k_pad = s_mm.shape
    n_pad = w_blk.shape[0] // 2
    config.check(b_pad, n_pad, k_pad)
    tm, u, tk = config.tile_m, config.units, config.tile_k
    # Inputs beside the matmul operands: (name, array, half or None).
    extras = [("s", s, None), ("b_h", bias, 0), ("b_t", bias, 1)]
    if z is not None:
        extras.append(("z", z, None))
    if xproj is not None:
        extras += [("x_h", xproj, 0), ("x_t", xproj, 1)]
    if mask is not None:
        extras.append(("mask", mask, None))
    inputs = dict(s=s, bias=bias, z=z, xproj=xproj, mask=mask)
    given = [name for name, array in inputs.items() if array is not None]
    names = _output_names(save, z is not None)
    n_in, n_out = len(given), len(names)

    def kernel(*refs, epi, pre, bar):
        s_mm_g, w_g = refs[:2]
        in_refs = dict(zip(given, refs[2 : 2 + n_in], strict=True))
        out_refs = refs[2 + n_in :]
        m, g = jax.lax.axis_index("m"), jax.lax.axis_index("g")
        rows, units = pl.ds(m * tm, tm), pl.ds(g * u, u)

        # Epilogue operands by TMA while the K loop runs.
        source = dict(s="s", b_h="bias", b_t="bias", z="z", x_h="xproj", x_t="xproj", mask="mask")
        for slot, (name, _, half) in enumerate(extras):
            ref = in_refs[source[name]]
            src = ref.at[rows, units] if half is None else ref.at[rows, half, units]
            plgpu.copy_gmem_to_smem(src, epi.at[slot], bar.at[slot])
        gemm_nt_to_smem(
            pre, s_mm_g, w_g, m, g, tile_k=tk, k_steps=k_pad // tk, stages=config.stages
        )
        for slot in range(len(extras)):
            plgpu.barrier_wait(bar.at[slot])
        ins = {name: epi[slot] for slot, (name, _, _) in enumerate(extras)}
        tiles = _epilogue(pre[:, pl.ds(0, u)], pre[:, pl.ds(u, u)], ins)
        base = len(extras)
        for i, name in enumerate(names):
            epi[base + i] = tiles[name]
        plgpu.commit_smem()
        for i, name in enumerate(names):
            if name in ("full_h", "full_t"):
                dst = out_refs[3].at[rows, 0 if name == "full_h" else 1, units]
            else:
                dst = out_refs[i].at[rows, units]
            plgpu.copy_smem_to_gmem(epi.at[base + i], dst)
        plgpu.wait_smem_to_gmem(0)

    rows_out = jax.ShapeDtypeStruct((b_pad, n_pad), F32)
    out_type = [rows_out] * min(n_out, 3)
    if n_out == 5:
        out_type.append(jax.ShapeDtypeStruct((b_pad, 2, n_pad), F32))
    outs = plgpu.kernel(
        kernel,
        out_type=tuple(out_type),
        scratch_types=dict(
            epi=plgpu.SMEM((len(extras) + n_out, tm, u), F32),
            pre=plgpu.SMEM((tm, 2 * u), F32),
            bar=plgpu.Barrier(num_barriers=len(extras)),
        ),
        grid=(b_pad // tm, n_pad // u),
        grid_names=("m", "g"),
        kernel_name="mosaic_highway_forward",
        interpret=interpret,
    )(s_mm, w_blk, *(inputs[name] for name in given))
    return outs[0] if n_out == 1 else tuple(outs)


def highway_forward_reference(
    s_mm: Array,
    w_blk: Array,
    s: Array,
    bias: Array,
    z: Array | None = None,
    xproj: Array | None = None,
    mask: Array | None = None,
    *,
    save: bool = False,
    units: int = 8,
):
    """Pure-JAX `highway_forward` with the kernel's own epilogue math."""
    b_pad, n_pad = s.shape
    acc = jnp.matmul(s_mm, w_blk.T, preferred_element_type=F32)
    acc = acc.reshape(b_pad, n_pad // units, 2, units).transpose(0, 2, 1, 3)
    ins = dict(s=s, b_h=bias[:, 0], b_t=bias[:, 1])
    if z is not None:
        ins["z"] = z
    if xproj is not None:
        ins["x_h"], ins["x_t"] = xproj[:, 0], xproj[:, 1]
    if mask is not None:
        ins["mask"] = mask
    tiles = _epilogue(acc[:, 0].reshape(b_pad, n_pad), acc[:, 1].reshape(b_pad, n_pad), ins)
    return _assemble(tiles, _output_names(save, z is not None))


def block_weight(w: Array, dtype, units: int, k_pad: int) -> Array:
    """W [n_in, 2 * n] -> w_blk [2n, k_pad]: W^T in block-major order."""
    n_in, n = w.shape[0], w.shape[1] // 2
    w3 = jnp.pad(w, [(0, k_pad - n_in), (0, 0)]).reshape(k_pad, 2, n // units, units)
    return w3.transpose(2, 1, 3, 0).reshape(2 * n, k_pad).astype(dtype)


def operands(w: Array, s: Array, z: Array, b: Array, dtype, units: int, k_pad):
    """(W_l [n, 2n], s [B, n], z [B, n], b_l [2n]), padded -> (s_mm, w_blk, s, bias, z)."""
    batch, n = s.shape
    s_mm = jnp.pad(s, [(0, 0), (0, k_pad - n)]).astype(dtype)
    w_blk = block_weight(w, dtype, units, k_pad)
    bias = jnp.broadcast_to(b.reshape(1, 2, n), (batch, 2, n)).astype(F32)
    return s_mm, w_blk, s.astype(F32), bias, z.astype(F32)
