"""What the Triton kernels share: launch parameters, operand checks, the BlockSpecs of the
padded layout and the one ``pallas_call`` (`launch`), the in-kernel gate math, the
references' helpers and `cuda_lowering_device`. Passing the Triton ``CompilerParams`` picks
the Triton backend (recent JAX otherwise lowers through Mosaic GPU)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from rhhjax.kernels.hardware import H100
from rhhjax.kernels.layout import F32, Geometry
from rhhjax.kernels.triton.config import HighwayConfig

# `TritonCompilerParams` in older JAX.
TritonCompilerParams = getattr(plgpu, "CompilerParams", None) or plgpu.TritonCompilerParams
# A squeezed block dimension: `pl.squeezed`, or None in older JAX.
SQUEEZED = getattr(pl, "squeezed", None)

MASK_DTYPES = (jnp.int8,)  # keep decisions 0/1

__all__ = ["F32"]


def compiler_params(config: HighwayConfig):
    """Triton launch parameters of ``config``."""
    return TritonCompilerParams(num_warps=config.num_warps, num_stages=config.num_stages)


def dot_precision(dtype, allow_tf32: bool):
    """``HIGHEST`` for f32 dots unless ``allow_tf32``, else None."""
    if jnp.dtype(dtype) == jnp.float32 and not allow_tf32:
        return lax.Precision.HIGHEST
    return None


def check_operand(name: str, x: jax.Array | None, shape: tuple[int, ...], dtypes=None) -> None:
    if x is None:
        return
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must have padded shape {tuple(shape)}, got {tuple(x.shape)}.")
    if dtypes is not None and jnp.dtype(x.dtype) not in [jnp.dtype(d) for d in dtypes]:
        names = ", ".join(jnp.dtype(d).name for d in dtypes)
        raise ValueError(f"{name} must have dtype {names}, got {jnp.dtype(x.dtype).name}.")


def dropout_scale(keep_mask: jax.Array | None, keep: float) -> float:
    if keep_mask is None:
        return 1.0
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"keep must be in (0, 1] with an int8 keep_mask, got {keep}.")
    return 1.0 / keep


def kernel_params(
    geo: Geometry, config: HighwayConfig, dot_dtype, keep_mask: jax.Array | None, keep: float
) -> dict:
    """Static keyword arguments of a kernel body: K chunk, dot precision, dropout scale."""
    return dict(
        block_k=geo.block_k,
        precision=dot_precision(dot_dtype, config.allow_tf32),
        mask_scale=dropout_scale(keep_mask, keep),
    )


# (array or None, BlockSpec[, aliased output]).
Operand = tuple


def lead_spec(lead: tuple[int, ...], block: tuple, index) -> pl.BlockSpec:
    zeros = (0,) * len(lead)
    return pl.BlockSpec((*lead, *block), lambda i, j: (*zeros, *index(i, j)))


def rows_spec(geo: Geometry, lead: tuple[int, ...] = ()) -> pl.BlockSpec:
    """Program (i, j)'s [block_b, block_n] tile."""
    return lead_spec(lead, (geo.block_b, geo.block_n), lambda i, j: (i, j))


def halves_spec(geo: Geometry, lead: tuple[int, ...] = ()) -> pl.BlockSpec:
    """Program (i, j)'s [block_b, 2, block_n] tile."""
    return lead_spec(lead, (geo.block_b, 2, geo.block_n), lambda i, j: (i, 0, j))


def whole_rows_spec(geo: Geometry) -> pl.BlockSpec:
    """Program (i, j)'s whole rows [block_b, n_pad] (a K operand)."""
    return pl.BlockSpec((geo.block_b, geo.n_pad), lambda i, j: (i, 0))


def bias_spec(geo: Geometry) -> pl.BlockSpec:
    return pl.BlockSpec((2, geo.block_n), lambda i, j: (0, j))


def weight_specs(geo: Geometry) -> tuple[pl.BlockSpec, pl.BlockSpec]:
    """Column block j [n_pad, block_n] of each half of ``w3`` [n_pad, 2, n_pad]."""
    shape = (geo.n_pad, SQUEEZED, geo.block_n)
    return (
        pl.BlockSpec(shape, lambda i, j: (0, 0, j)),
        pl.BlockSpec(shape, lambda i, j: (0, 1, j)),
    )


def weight_t_specs(geo: Geometry) -> tuple[pl.BlockSpec, pl.BlockSpec]:
    """Column block j [n_pad, block_n] of each half of ``w_t`` [2, n_pad, n_pad]."""
    shape = (SQUEEZED, geo.n_pad, geo.block_n)
    return (
        pl.BlockSpec(shape, lambda i, j: (0, 0, j)),
        pl.BlockSpec(shape, lambda i, j: (1, 0, j)),
    )


def launch(
    kernel: Callable,
    operands: Sequence[Operand],
    outputs: Sequence[tuple[jax.ShapeDtypeStruct, pl.BlockSpec]],
    *,
    geo: Geometry,
    config: HighwayConfig,
    interpret: bool,
    name: str,
) -> list[jax.Array]:
    """The one ``pallas_call`` on ``geo.grid``: absent (None) operands left out, aliased
    operands updated in place."""
    present = [op for op in operands if op[0] is not None]
    aliases = {position: op[2] for position, op in enumerate(present) if len(op) > 2}
    return pl.pallas_call(
        kernel,
        grid=geo.grid,
        in_specs=[op[1] for op in present],
        out_specs=[spec for _, spec in outputs],
        out_shape=[shape for shape, _ in outputs],
        input_output_aliases=aliases,
        compiler_params=compiler_params(config),
        interpret=interpret,
        name=name,
    )(*[op[0] for op in present])


@dataclasses.dataclass(frozen=True)
class OptionalOperands:
    z: bool = False
    xproj: bool = False
    mask: bool = False
    g: bool = False
    ds_carry_above: bool = False


def pop_optional(refs: list, present: bool):
    return refs.pop(0) if present else None


def gates_in_kernel(pre_h, pre_t, z, bias_ref, xproj_ref):
    """(u_h, u_t, h, t) [block_b, block_n]: u = pre + xproj, a = u * [z, z] + bias."""
    u_h, u_t = pre_h, pre_t
    if xproj_ref is not None:
        u_h = u_h + xproj_ref[:, 0, :]
        u_t = u_t + xproj_ref[:, 1, :]
    a_h, a_t = (u_h * z, u_t * z) if z is not None else (u_h, u_t)
    a_h = a_h + bias_ref[0, :][None, :]
    a_t = a_t + bias_ref[1, :][None, :]
    return u_h, u_t, jnp.tanh(a_h), jax.nn.sigmoid(a_t)


def load_mask(mask_ref, mask_scale: float):
    """f32 dropout multiplier (0 or 1/keep) [block_b, block_n], or None."""
    if mask_ref is None:
        return None
    m = mask_ref[...].astype(F32)
    return m * mask_scale if mask_scale != 1.0 else m


def k_loop(n_k: int, block_k: int, step, init):

    def body(kk, acc):
        return step(pl.ds(pl.multiple_of(kk * block_k, block_k), block_k), acc)

    return lax.fori_loop(0, n_k, body, init)


def reference_dot(x, w, dims):
    precision = dot_precision(w.dtype, allow_tf32=False)
    return jnp.einsum(dims, x.astype(w.dtype), w, precision=precision, preferred_element_type=F32)


def reference_mask(keep_mask, keep):
    if keep_mask is None:
        return None
    return keep_mask.astype(F32) * dropout_scale(keep_mask, keep)


def reference_combine(a, s, m):
    """s_new from a [b, 2, n] and s [b, n]."""
    h, t = jnp.tanh(a[:, 0]), jax.nn.sigmoid(a[:, 1])
    gate = t if m is None else t * m
    return h * gate + s * (1.0 - t)


def reference_preactivation(u, z, bias2):
    """a [b, 2, n] = u * [z, z] + bias2."""
    a = u if z is None else u * z[:, None, :]
    return a + bias2[None]


def cuda_lowering_device(
    device_kind: str = H100.device_kind,
    num_cores: int = H100.sms,
    mesh: jax.sharding.Mesh | None = None,
):
    """Context naming a GPU as the abstract device, to trace and lower Triton kernels for
    CUDA without a GPU (jax >= 0.11 asks the abstract mesh's device for the compute
    capability). Wrap the trace as well as the lowering."""
    device = jax.sharding.AbstractDevice(
        device_kind=device_kind, num_cores=num_cores, platform="gpu"
    )
    if mesh is None:
        abstract = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)
    else:
        abstract = jax.sharding.AbstractMesh(
            mesh.axis_sizes, mesh.axis_names, axis_types=mesh.axis_types, abstract_device=device
        )
    return jax.sharding.use_abstract_mesh(abstract)
