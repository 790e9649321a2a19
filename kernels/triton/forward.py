"""Forward kernel of one highway micro-layer, padded layout, with its wrapper and reference:
pre = s @ w, a = (pre + xproj) * [z, z] + bias, s_new = tanh(a_h) * sigmoid(a_t) * mask
+ s * (1 - sigmoid(a_t)), one launch per micro-layer."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from rhhjax.kernels.layout import Geometry
from rhhjax.kernels.triton.common import (
    F32,
    MASK_DTYPES,
    Operand,
    OptionalOperands,
    bias_spec,
    check_operand,
    gates_in_kernel,
    halves_spec,
    k_loop,
    kernel_params,
    launch,
    load_mask,
    pop_optional,
    reference_combine,
    reference_dot,
    reference_mask,
    reference_preactivation,
    rows_spec,
    weight_specs,
    whole_rows_spec,
)
from rhhjax.kernels.triton.config import DEFAULT_CONFIG, HighwayConfig


def forward_refs(refs: Sequence, has: OptionalOperands) -> tuple[tuple, list]:
    """The input refs of `forward_kernel` in order (None where absent), and the rest."""
    refs = list(refs)
    inputs = refs[:4]
    del refs[:4]
    optional = [pop_optional(refs, present) for present in (has.z, has.xproj, has.mask)]
    return (*inputs, *optional), refs


def forward_kernel(*refs, has: OptionalOperands, block_k: int, precision, mask_scale: float):
    """One (batch block i, unit block j) program of the forward: s_ref [block_b, n_pad]
    whole rows, w_h_ref, w_t_ref [n_pad, block_n], bias, optional z, xproj, mask; outputs
    s_new [block_b, block_n] and pre [block_b, 2, block_n]."""
    (s_ref, w_h_ref, w_t_ref, bias_ref, z_ref, xproj_ref, mask_ref), outputs = forward_refs(
        refs, has
    )
    s_new_ref, pre_ref = outputs

    block_b, block_n = s_new_ref.shape
    dot_dtype = w_h_ref.dtype

    def k_step(k, acc):
        acc_h, acc_t = acc
        s_blk = s_ref[:, k].astype(dot_dtype)
        acc_h += jnp.dot(s_blk, w_h_ref[k, :], precision=precision, preferred_element_type=F32)
        acc_t += jnp.dot(s_blk, w_t_ref[k, :], precision=precision, preferred_element_type=F32)
        return acc_h, acc_t

    zeros = jnp.zeros((block_b, block_n), F32)
    pre_h, pre_t = k_loop(s_ref.shape[1] // block_k, block_k, k_step, (zeros, zeros))

    z = z_ref[...] if has.z else None
    _, _, h, t = gates_in_kernel(pre_h, pre_t, z, bias_ref, xproj_ref)
    m = load_mask(mask_ref, mask_scale)
    gate = t if m is None else t * m
    col = pl.ds(pl.multiple_of(pl.program_id(1) * block_n, block_n), block_n)
    s_new_ref[...] = h * gate + s_ref[:, col] * (1.0 - t)
    pre_ref[:, 0, :] = pre_h
    pre_ref[:, 1, :] = pre_t


def forward_operands(
    geo: Geometry, *arrays: jax.Array | None, lead: tuple[int, ...] = (),
    xproj_lead: tuple[int, ...] = (), names: tuple[str, ...] = (),
) -> tuple[OptionalOperands, list[Operand]]:  # fmt: skip
    """(present optional operands, `forward_kernel`'s operands for `launch`), each checked;
    z and keep_mask with leading dims ``lead``, xproj with ``xproj_lead``."""
    s, w3, z, bias2, xproj, keep_mask = arrays
    z_name, xproj_name, mask_name = names or ("z", "xproj", "keep_mask")
    rows = (geo.b_pad, geo.n_pad)
    check_operand("s", s, rows, (F32,))
    check_operand("w3", w3, (geo.n_pad, 2, geo.n_pad))
    check_operand(z_name, z, (*lead, *rows), (F32,))
    check_operand("bias2", bias2, (2, geo.n_pad), (F32,))
    check_operand(xproj_name, xproj, (*xproj_lead, geo.b_pad, 2, geo.n_pad), (F32,))
    check_operand(mask_name, keep_mask, (*lead, *rows), MASK_DTYPES)
    has = OptionalOperands(z=z is not None, xproj=xproj is not None, mask=keep_mask is not None)
    w_h, w_t = weight_specs(geo)
    return has, [
        (s, whole_rows_spec(geo)),
        (w3, w_h),
        (w3, w_t),
        (bias2, bias_spec(geo)),
        (z, rows_spec(geo, lead)),
        (xproj, halves_spec(geo, xproj_lead)),
        (keep_mask, rows_spec(geo, lead)),
    ]


def forward_padded(
    s: jax.Array,
    w3: jax.Array,
    z: jax.Array | None,
    bias2: jax.Array,
    xproj: jax.Array | None,
    keep_mask: jax.Array | None,
    *,
    keep: float = 1.0,
    geo: Geometry,
    config: HighwayConfig = DEFAULT_CONFIG,
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """Forward of one micro-layer in the padded layout, one launch.

    s [b_pad, n_pad]; w3 [n_pad, 2, n_pad] dot dtype; z [b_pad, n_pad] or None; bias2
    [2, n_pad] (b_0 + b_U at layer 0); xproj [b_pad, 2, n_pad] or None; keep_mask
    [b_pad, n_pad] int8 or None. Returns (s_new [b_pad, n_pad], pre [b_pad, 2, n_pad]).
    """
    config.validate(w3.dtype)
    has, operands = forward_operands(geo, s, w3, z, bias2, xproj, keep_mask)
    kernel = functools.partial(
        forward_kernel, has=has, **kernel_params(geo, config, w3.dtype, keep_mask, keep)
    )
    rows, rows2 = (geo.b_pad, geo.n_pad), (geo.b_pad, 2, geo.n_pad)
    outputs = [
        (jax.ShapeDtypeStruct(rows, F32), rows_spec(geo)),
        (jax.ShapeDtypeStruct(rows2, F32), halves_spec(geo)),
    ]
    s_new, pre = launch(
        kernel, operands, outputs, geo=geo, config=config, interpret=interpret,
        name="highway_forward",
    )  # fmt: skip
    return s_new, pre


def forward_padded_reference(s, w3, z, bias2, xproj, keep_mask, *, keep=1.0):
    """Pure-jnp :func:`forward_padded` on the same padded operands: ``(s_new, pre)``."""
    pre = reference_dot(s, w3, "bk,khj->bhj")
    u = pre if xproj is None else pre + xproj
    return reference_combine(
        reference_preactivation(u, z, bias2), s, reference_mask(keep_mask, keep)
    ), pre
