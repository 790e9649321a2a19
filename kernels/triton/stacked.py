"""Stacked highway kernels: one micro-layer (t, layer) on whole-sequence [T, L, ...] arrays.

In a `lax.scan`, slicing each step's operands and storing its outputs costs one XLA launch
each. These kernels take the whole stacked arrays, a traced time index ``t`` and a static
``layer``, read and write the (t, layer) slice inside the kernel (`View`), and update
stacked outputs in place (``input_output_aliases``). The BlockSpecs keep (T, L) whole:
Triton's power-of-two rule applies to loaded tensors, not block shapes.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from rhhjax.kernels.layout import Geometry
from rhhjax.kernels.triton.backward import backward_kernel, state_grad_in_kernel
from rhhjax.kernels.triton.common import (
    F32,
    MASK_DTYPES,
    SQUEEZED,
    OptionalOperands,
    bias_spec,
    check_operand,
    halves_spec,
    kernel_params,
    launch,
    lead_spec,
    pop_optional,
    rows_spec,
    weight_t_specs,
)
from rhhjax.kernels.triton.config import DEFAULT_CONFIG, HighwayConfig
from rhhjax.kernels.triton.forward import (
    forward_kernel,
    forward_operands,
    forward_refs,
)

FREE = object()  # a free position of a `View` template


class View:
    """A kernel ref at fixed indices: ``template`` has an index or ``FREE`` per axis;
    ``shift`` offsets a view axis; with ``acc_from`` a store adds the value read there."""

    def __init__(self, ref, template, shift=None, acc_from=None):
        self.ref, self.template, self.shift, self.acc_from = ref, template, shift or {}, acc_from
        free = [d for d, x in zip(ref.shape, template, strict=True) if x is FREE]
        for axis, offset in self.shift.items():
            free[axis] -= offset
        self.shape = tuple(free)
        self.dtype = ref.dtype

    def _index(self, idx):
        if idx is Ellipsis:
            idx = ()
        elif not isinstance(idx, tuple):
            idx = (idx,)
        idx = list(idx) + [slice(None)] * (len(self.shape) - len(idx))
        for axis, offset in self.shift.items():
            if not isinstance(idx[axis], int):
                raise NotImplementedError("a shifted view axis takes integer indices only")
            idx[axis] += offset
        it = iter(idx)
        return tuple(next(it) if x is FREE else x for x in self.template)

    def __getitem__(self, idx):
        return self.ref[self._index(idx)]

    def __setitem__(self, idx, value):
        full = self._index(idx)
        if self.acc_from is not None:
            value = self.acc_from[full] + value
        self.ref[full] = value


def time_spec():
    """BlockSpec of the time index ``t`` [1], the same for every program."""
    return pl.BlockSpec((1,), lambda i, j: (0,))


def check_time(t: jax.Array) -> jax.Array:
    """A scalar or [1] time index as the kernels' int32 [1] operand."""
    t = jnp.asarray(t)
    if t.shape not in ((), (1,)) or not jnp.issubdtype(t.dtype, jnp.integer):
        raise ValueError(f"t must be an integer scalar, got {t.dtype} {t.shape}.")
    return t.astype(jnp.int32).reshape(1)


class Value:
    """A computed value posing as a ref for ``ref[...]``."""

    def __init__(self, value):
        self.value = value

    def __getitem__(self, idx):
        if idx is not Ellipsis:
            raise NotImplementedError("Value supports [...] only")
        return self.value


def _forward_stacked_kernel(t_ref, *refs, has: OptionalOperands, layer: int, **kernel_kw):
    """`forward_kernel` on the (t, layer) slices of the stacked operands."""
    t = t_ref[0]
    (s_ref, w_h_ref, w_t_ref, bias_ref, z_ref, xproj_ref, mask_ref), outputs = forward_refs(
        refs, has
    )
    _, s_new_ref, packed_ref = outputs
    tl4 = (t, layer, FREE, FREE)
    views = [s_ref, w_h_ref, w_t_ref, bias_ref]
    if has.z:
        views.append(View(z_ref, tl4))
    if has.xproj:
        views.append(View(xproj_ref, (t, FREE, FREE, FREE)))
    if has.mask:
        views.append(View(mask_ref, tl4))
    # The input state's block first: stored before the K loop, it holds no registers.
    block_n = s_new_ref.shape[1]
    col = pl.ds(pl.multiple_of(pl.program_id(1) * block_n, block_n), block_n)
    packed_ref[t, layer, :, 0, :] = s_ref[:, col]
    pre = View(packed_ref, (t, layer, FREE, FREE, FREE), shift={1: 1})
    forward_kernel(*views, s_new_ref, pre, has=has, **kernel_kw)


def forward_stacked(
    t: jax.Array,
    s: jax.Array,
    w3: jax.Array,
    z_all: jax.Array | None,
    bias2: jax.Array,
    xproj_all: jax.Array | None,
    keep_all: jax.Array | None,
    packed_all: jax.Array,
    *,
    layer: int,
    keep: float = 1.0,
    geo: Geometry,
    config: HighwayConfig = DEFAULT_CONFIG,
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """`forward_padded` of micro-layer (t, layer) on stacked operands, in one launch.

    s [b_pad, n_pad]; z_all, keep_all [T, L, b_pad, n_pad] or None; xproj_all
    [T, b_pad, 2, n_pad] or None (layer 0 only); packed_all [T, L, b_pad, 3, n_pad],
    aliased to the second output (donate it). Returns (s_new [b_pad, n_pad], packed_all
    with [t, layer] = (s, pre_h, pre_t)).
    """
    config.validate(w3.dtype)
    if packed_all.ndim != 5:
        raise ValueError(f"packed_all must be [T, L, b_pad, 3, n_pad], got {packed_all.shape}.")
    steps, depth = packed_all.shape[:2]
    if not 0 <= layer < depth:
        raise ValueError(f"layer must be in [0, {depth}), got {layer}.")
    tl, packed_block = (steps, depth), (geo.block_b, 3, geo.block_n)
    check_operand("packed_all", packed_all, (*tl, geo.b_pad, 3, geo.n_pad), (F32,))
    names = ("z_all", "xproj_all", "keep_all")
    has, operands = forward_operands(
        geo, s, w3, z_all, bias2, xproj_all, keep_all, lead=tl, xproj_lead=(steps,), names=names
    )
    time = check_time(t)
    kernel = functools.partial(
        _forward_stacked_kernel, has=has, layer=layer,
        **kernel_params(geo, config, w3.dtype, keep_all, keep),
    )  # fmt: skip
    packed_spec = lead_spec(tl, packed_block, lambda i, j: (i, 0, j))
    operands = [(time, time_spec()), *operands, (packed_all, packed_spec, 1)]
    outputs = [
        (jax.ShapeDtypeStruct((geo.b_pad, geo.n_pad), F32), rows_spec(geo)),
        (jax.ShapeDtypeStruct(packed_all.shape, F32), packed_spec),
    ]
    s_new, packed_all = launch(
        kernel, operands, outputs, geo=geo, config=config, interpret=interpret,
        name="highway_forward_stacked",
    )  # fmt: skip
    return s_new, packed_all


def _backward_stacked_kernel(
    t_ref, *refs, has: OptionalOperands, layer: int, steps: int, depth: int, **kernel_kw
):
    """`backward_kernel` on the (t, layer) slices; d_scaled of the layer above is read from
    the aliased stacked buffer at (t, layer + 1), or (t + 1, 0) for the last layer."""
    t = t_ref[0]
    refs = list(refs)
    d_all_in, wt_h_ref, wt_t_ref = refs[:3]
    del refs[:3]
    carry_ref = pop_optional(refs, has.ds_carry_above)
    g_ref = pop_optional(refs, has.g)
    packed_ref, bias_ref = refs[:2]
    del refs[:2]
    z_ref = pop_optional(refs, has.z)
    xproj_ref = pop_optional(refs, has.xproj)
    mask_ref = pop_optional(refs, has.mask)
    _ = pop_optional(refs, has.z)  # dz_in: aliased, unread
    dbias_in = refs.pop(0)
    d_all_out, ds_carry_ref = refs[:2]
    del refs[:2]
    dz_out = pop_optional(refs, has.z)
    (dbias_out,) = refs

    if layer + 1 < depth:
        t_above, l_above, valid = t, layer + 1, None
    else:
        t_above, l_above, valid = jnp.minimum(t + 1, steps - 1), 0, t + 1 < steps
    d_h = View(d_all_in, (t_above, l_above, FREE, 0, FREE))
    d_t = View(d_all_in, (t_above, l_above, FREE, 1, FREE))
    ds = state_grad_in_kernel(d_h, d_t, wt_h_ref, wt_t_ref, kernel_kw["block_k"],
                               kernel_kw["precision"])  # fmt: skip
    if valid is not None:
        ds = jnp.where(valid, ds, 0.0)
    if carry_ref is not None:
        ds = ds + carry_ref[...]
    tl4 = (t, layer, FREE, FREE)
    views = [Value(ds)]  # the state gradient posing as a ref
    if has.g:
        views.append(View(g_ref, tl4))
    views += [
        View(packed_ref, (t, layer, FREE, 0, FREE)),
        View(packed_ref, (t, layer, FREE, FREE, FREE), shift={1: 1}),
        bias_ref,
    ]
    if has.z:
        views.append(View(z_ref, tl4))
    if has.xproj:
        views.append(View(xproj_ref, (t, FREE, FREE, FREE)))
    if has.mask:
        views.append(View(mask_ref, tl4))
    views += [View(d_all_out, (t, layer, FREE, FREE, FREE)), ds_carry_ref]
    if has.z:
        views.append(View(dz_out, tl4))
    views.append(View(dbias_out, (layer, FREE, FREE), acc_from=dbias_in))
    backward_kernel(*views, has=has, gemm=False, elementwise=True, **kernel_kw)


def backward_fused_stacked(
    t: jax.Array,
    d_scaled_all: jax.Array,
    w_t_above: jax.Array,
    ds_carry_above: jax.Array | None,
    g_all: jax.Array | None,
    packed_all: jax.Array,
    z_all: jax.Array | None,
    bias2: jax.Array,
    xproj_all: jax.Array | None,
    keep_all: jax.Array | None,
    dz_all: jax.Array | None,
    dbias_acc: jax.Array,
    *,
    layer: int,
    keep: float = 1.0,
    geo: Geometry,
    config: HighwayConfig = DEFAULT_CONFIG,
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array, jax.Array | None, jax.Array]:
    """`backward_fused_padded` of micro-layer (t, layer) on stacked operands, in one launch.

    d_scaled_all [T, L, b_pad, 2, n_pad], dz_all [T, L, b_pad, n_pad] and dbias_acc
    [L, b_pad // block_b, 2, n_pad] are aliased to outputs 0, 2 and 3 (dbias_acc is added
    to); w_t_above [2, n_pad, n_pad]; g_all [T, L, b_pad, n_pad] or None. At t = T - 1 the
    last layer's GEMM term is zero. Returns (d_scaled_all, ds_carry [b_pad, n_pad], dz_all
    or None, dbias_acc).
    """
    depth = d_scaled_all.shape[1] if d_scaled_all.ndim == 5 else 0
    steps = d_scaled_all.shape[0]
    if d_scaled_all.ndim != 5 or not 0 <= layer < depth:
        raise ValueError(
            f"d_scaled_all must be [T, L, b_pad, 2, n_pad] with 0 <= layer < L, got "
            f"{d_scaled_all.shape} and layer {layer}."
        )
    if (z_all is None) != (dz_all is None):
        raise ValueError("dz_all must be given exactly when z_all is.")
    rows, tl = (geo.b_pad, geo.n_pad), (steps, depth)
    b_pad, n_pad = rows
    config.validate(w_t_above.dtype)
    check_operand("d_scaled_all", d_scaled_all, (*tl, b_pad, 2, n_pad), (F32,))
    check_operand("w_t_above", w_t_above, (2, n_pad, n_pad))
    check_operand("ds_carry_above", ds_carry_above, rows, (F32,))
    check_operand("g_all", g_all, (*tl, *rows), (F32,))
    check_operand("packed_all", packed_all, (*tl, b_pad, 3, n_pad), (F32,))
    check_operand("z_all", z_all, (*tl, *rows), (F32,))
    check_operand("bias2", bias2, (2, n_pad), (F32,))
    check_operand("xproj_all", xproj_all, (steps, b_pad, 2, n_pad), (F32,))
    check_operand("keep_all", keep_all, (*tl, *rows), MASK_DTYPES)
    check_operand("dz_all", dz_all, (*tl, *rows), (F32,))
    check_operand("dbias_acc", dbias_acc, (depth, geo.grid[0], 2, n_pad), (F32,))
    has = OptionalOperands(
        z=z_all is not None,
        xproj=xproj_all is not None,
        mask=keep_all is not None,
        g=g_all is not None,
        ds_carry_above=ds_carry_above is not None,
    )
    kernel = functools.partial(
        _backward_stacked_kernel, has=has, layer=layer, steps=steps, depth=depth,
        **kernel_params(geo, config, w_t_above.dtype, keep_all, keep),
    )  # fmt: skip
    bb, bn = geo.block_b, geo.block_n
    dbias_spec = pl.BlockSpec((depth, SQUEEZED, 2, bn), lambda i, j: (0, i, 0, j))
    wt_h, wt_t = weight_t_specs(geo)
    outputs = [
        (jax.ShapeDtypeStruct(d_scaled_all.shape, F32), halves_spec(geo, tl)),
        (jax.ShapeDtypeStruct(rows, F32), rows_spec(geo)),
    ]
    if dz_all is not None:
        outputs.append((jax.ShapeDtypeStruct(dz_all.shape, F32), rows_spec(geo, tl)))
    outputs.append((jax.ShapeDtypeStruct(dbias_acc.shape, F32), dbias_spec))
    operands = [
        (check_time(t), time_spec()),
        (d_scaled_all, lead_spec(tl, (bb, 2, n_pad), lambda i, j: (i, 0, 0)), 0),
        (w_t_above, wt_h),
        (w_t_above, wt_t),
        (ds_carry_above, rows_spec(geo)),
        (g_all, rows_spec(geo, tl)),
        (packed_all, lead_spec(tl, (bb, 3, bn), lambda i, j: (i, 0, j))),
        (bias2, bias_spec(geo)),
        (z_all, rows_spec(geo, tl)),
        (xproj_all, halves_spec(geo, (steps,))),
        (keep_all, rows_spec(geo, tl)),
        (dz_all, rows_spec(geo, tl), 2),
        (dbias_acc, dbias_spec, len(outputs) - 1),
    ]
    outs = launch(
        kernel, operands, outputs, geo=geo, config=config, interpret=interpret,
        name="highway_backward_fused_stacked",
    )  # fmt: skip
    dz = outs[2] if dz_all is not None else None
    return outs[0], outs[1], dz, outs[-1]
