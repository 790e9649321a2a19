"""Launches of the Triton backward kernel that only the tests make (not collected: no
``test_`` prefix): on ONE micro-layer's unstacked padded operands, the elementwise gate
backward alone (:func:`backward_padded`) and the state-gradient GEMM of the layer above fused
with it (:func:`backward_fused_padded`). The model runs the fused kernel on the stacked arrays
(``rhhjax.kernels.triton.backward_fused_stacked``); these check the kernel body against its
references and serve as the stacked kernels' reference on sliced operands. Both are built
from the package's pieces (the kernel body, its operands, the one ``launch``)."""

from __future__ import annotations

import functools

import jax
from jax.experimental import pallas as pl
from rhhjax.kernels.layout import Geometry
from rhhjax.kernels.triton import backward as bwd
from rhhjax.kernels.triton import common
from rhhjax.kernels.triton.common import F32
from rhhjax.kernels.triton.config import DEFAULT_CONFIG, HighwayConfig

Outputs = tuple[jax.Array, jax.Array, jax.Array | None, jax.Array]


def _elementwise(geo: Geometry, s, pre, z, bias2, xproj, keep_mask) -> list[common.Operand]:
    """The gate-backward operands of ``backward_kernel`` (after ds and g), checked."""
    rows, rows2 = (geo.b_pad, geo.n_pad), (geo.b_pad, 2, geo.n_pad)
    common.check_operand("s", s, rows, (F32,))
    common.check_operand("pre", pre, rows2, (F32,))
    common.check_operand("z", z, rows, (F32,))
    common.check_operand("bias2", bias2, (2, geo.n_pad), (F32,))
    common.check_operand("xproj", xproj, rows2, (F32,))
    common.check_operand("keep_mask", keep_mask, rows, common.MASK_DTYPES)
    return [
        (s, common.rows_spec(geo)),
        (pre, common.halves_spec(geo)),
        (bias2, common.bias_spec(geo)),
        (z, common.rows_spec(geo)),
        (xproj, common.halves_spec(geo)),
        (keep_mask, common.rows_spec(geo)),
    ]


def _gate_backward_call(first, g, elementwise, has, dot_dtype, keep_mask, keep, name, *, geo,
                        config=DEFAULT_CONFIG, interpret=False) -> Outputs:  # fmt: skip
    """ONE launch of the gate backward after ``first`` (the GEMM operands, or ds):
    (d_scaled [b_pad, 2, n_pad], ds_carry, dz | None, dbias_partial [grid_b, 2, n_pad])."""
    rows, rows2 = (geo.b_pad, geo.n_pad), (geo.b_pad, 2, geo.n_pad)
    gemm = dot_dtype is not None
    kernel = functools.partial(
        bwd.backward_kernel, has=has, gemm=gemm, elementwise=True, block_k=geo.block_k,
        precision=common.dot_precision(dot_dtype, config.allow_tf32) if gemm else None,
        mask_scale=common.dropout_scale(keep_mask, keep),
    )  # fmt: skip
    outputs = [
        (jax.ShapeDtypeStruct(rows2, F32), common.halves_spec(geo)),
        (jax.ShapeDtypeStruct(rows, F32), common.rows_spec(geo)),
    ]
    if has.z:
        outputs.append((jax.ShapeDtypeStruct(rows, F32), common.rows_spec(geo)))
    dbias_spec = pl.BlockSpec((common.SQUEEZED, 2, geo.block_n), lambda i, j: (i, 0, j))
    outputs.append((jax.ShapeDtypeStruct((geo.grid[0], 2, geo.n_pad), F32), dbias_spec))
    operands = [*first, (g, common.rows_spec(geo)), *elementwise]
    outs = common.launch(
        kernel, operands, outputs, geo=geo, config=config, interpret=interpret, name=name
    )
    return outs[0], outs[1], outs[2] if has.z else None, outs[-1]


def _config(launch: dict) -> HighwayConfig:
    return launch.get("config", DEFAULT_CONFIG)


def backward_padded(ds, s, pre, z, bias2, xproj, keep_mask, *, g=None, keep=1.0, **launch):
    """Elementwise gate backward of one micro-layer, padded layout: ONE kernel launch.

    Args:
      ds: [b_pad, n_pad] f32 cotangent of this layer's ``s_new``.
      s, pre, z, bias2, xproj, keep_mask, keep: as given to ``forward_padded`` (``pre`` is its
        output).
      g: [b_pad, n_pad] f32 added to ``ds`` (cotangent from outside), or None.
      launch: ``geo`` and optionally ``config`` and ``interpret``, as the package's launches.
    Returns:
      d_scaled [b_pad, 2, n_pad] f32: ``da * [z, z]`` (``da`` without z); ds_carry [b_pad,
      n_pad] f32: ``(ds + g) * (1 - t)``; dz [b_pad, n_pad] f32 | None; dbias_partial
      [b_pad // block_b, 2, n_pad] f32: per-batch-block column sums of ``da``.
    """
    geo = launch["geo"]
    rows = (geo.b_pad, geo.n_pad)
    common.check_operand("ds", ds, rows, (F32,))
    _config(launch).validate(None)
    common.check_operand("g", g, rows, (F32,))
    elementwise = _elementwise(geo, s, pre, z, bias2, xproj, keep_mask)
    has = common.OptionalOperands(
        g=g is not None, z=z is not None, xproj=xproj is not None, mask=keep_mask is not None
    )
    first = [(ds, common.rows_spec(geo))]
    return _gate_backward_call(
        first, g, elementwise, has, None, keep_mask, keep, "highway_backward", **launch
    )


def backward_fused_padded(d_scaled_above, w_t_above, ds_carry_above, g, *elementwise_args,
                          keep=1.0, **launch):  # fmt: skip
    """State-gradient GEMM of the layer above + gate backward of this layer: ONE launch.

    Per column block: ``ds = ds_carry_above + d_scaled_above @ W_above^T (+ g)``, then
    :func:`backward_padded` with that ``ds``. ``d_scaled_above`` [b_pad, 2, n_pad],
    ``w_t_above`` [2, n_pad, n_pad] and ``ds_carry_above`` [b_pad, n_pad] | None as in
    ``state_grad_padded``; ``elementwise_args`` (s, pre, z, bias2, xproj, keep_mask) and the
    rest as in :func:`backward_padded`, which it returns the outputs of.
    """
    geo = launch["geo"]
    bwd.check_gemm_operands(geo, d_scaled_above, w_t_above, ds_carry_above)
    _config(launch).validate(w_t_above.dtype)
    common.check_operand("g", g, (geo.b_pad, geo.n_pad), (F32,))
    s, pre, z, bias2, xproj, keep_mask = elementwise_args
    elementwise = _elementwise(geo, s, pre, z, bias2, xproj, keep_mask)
    has = common.OptionalOperands(
        g=g is not None, ds_carry_above=ds_carry_above is not None, z=z is not None,
        xproj=xproj is not None, mask=keep_mask is not None,
    )  # fmt: skip
    first = bwd.gemm_operands(geo, d_scaled_above, w_t_above, ds_carry_above)
    return _gate_backward_call(
        first, g, elementwise, has, w_t_above.dtype, keep_mask, keep, "highway_backward_fused",
        **launch,
    )  # fmt: skip
