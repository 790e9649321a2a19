"""Fused highway micro-layer step (Recurrent Highway Networks), Pallas Triton kernels.

One highway micro-layer step, with ``B`` the batch and ``n`` the number of units::

    s     [B, n]   f32        carry (the layer's input state)
    w     [n, 2n]  f32 | bf16 recurrent weight; columns [:n] feed h, columns [n:] feed t
    z     [B, n]   f32 | None per-example column scale (HyperRHN); the same z scales both halves
    bias  [2n]     f32
    xproj [B, 2n]  f32 | None addend *inside* the scale (layer 0: the input projection x U)
    mask  [B, n]   int8 | None gate-dropout keep decisions on t (0/1, scaled by 1/keep in the
                   kernel)

    pre   = s @ w                                [B, 2n]  f32 accumulation (s cast to w.dtype)
    u     = pre + xproj                          [B, 2n]  the unscaled pre-activation
    a     = u * [z, z] + bias                    [B, 2n]
    h     = tanh(a[:, :n])
    t     = sigmoid(a[:, n:])
    s_new = h * (t * mask) + s * (1 - t)         [B, n]   the carry gate uses the *undropped* t

This is the HyperRHN layer of ``rhhjax.ops.recurrence``: at layer 0,
``a = (s W_0 + x U) * [z_0, z_0] + b_0 + b_U``, so the caller passes ``xproj = x U`` and
``bias = b_0 + b_U``; at the other layers ``xproj`` is None. All gate arithmetic and all
outputs are f32 whatever the dtype of ``w``.

Backward of one layer, given ``ds`` (the cotangent of ``s_new``, plus ``g`` from outside)::

    da       = d a                                    [B, 2n]
    d_scaled = da * [z, z]  (= da without z)          [B, 2n]  = d u = d pre = d xproj
    ds_carry = ds * (1 - t)                           [B, n]   the carry part of d s
    dz       = da[:, :n] * u[:, :n] + da[:, n:] * u[:, n:]     (u includes xproj!)
    ds_in    = ds_carry + d_scaled @ w.T              [B, n]   the state gradient of the layer
    dw       = s.T @ d_scaled   (deferred by the caller to one GEMM after the time loop)

This module is the public API; the kernels live in one module per family:

* :mod:`rhhjax.kernels.triton.config` -- :class:`HighwayConfig` (block sizes and Triton launch
  parameters; :func:`validate_config`), :class:`Geometry` (the padded layout of one
  (batch, n): effective block sizes, padded extents and the padding methods ``pad_rows``,
  ``pad_halves``, ``pad_weight``, ``pad_weight_t``, ``pad_bias`` and their inverses; also the
  layout of the XLA ``fused`` path, :meth:`Geometry.for_units`).
* :mod:`rhhjax.kernels.triton.forward` -- :func:`forward_padded` (one kernel: both matmul halves of
  a column block, gates, combine) and :func:`forward_padded_reference`.
* :mod:`rhhjax.kernels.triton.backward` -- :func:`backward_padded` (the elementwise gate backward),
  :func:`backward_fused_padded` (the state-gradient GEMM of the layer above, then the
  elementwise backward, per column block: the backward of a micro-layer is ONE launch),
  :func:`state_grad_padded` (the GEMM alone, e.g. for the gradient of the initial state) and
  their references.
* :mod:`rhhjax.kernels.triton.stacked` -- :func:`forward_stacked`, :func:`backward_fused_stacked`:
  the same kernels on the WHOLE stacked ``[T, L, ...]`` arrays at a traced time index ``t``
  and a static ``layer``; they write their outputs in place into stacked buffers aliased to
  the outputs, so a time loop needs no slice or update-slice launch around them.
* :mod:`rhhjax.kernels.triton.common` -- shared helpers and :func:`cuda_lowering_device` (trace and
  lower the Triton kernels for CUDA on a host without a GPU).

Padded layout: ``B`` is padded up to ``b_pad`` (a multiple of ``block_b``) and ``n`` up to
``n_pad`` (a multiple of ``block_n`` and ``block_k``) with zeros. Arrays with two halves are
``[..., 2, n_pad]`` so that the h and t halves stay aligned: ``x2[..., half, u]`` is
``x[..., half * n + u]``. The weight is ``w3 [n_pad, 2, n_pad]`` (``w3[k, half, j] =
w[k, half * n + j]``) for the forward and ``w_t [2, n_pad, n_pad]`` (``w_t[half, k, j] =
w[j, half * n + k]``) for the state-gradient GEMM. Padded *units* have zero weights, bias,
z and xproj, hence ``a = 0`` and ``s_new = tanh(0) * t + 0 * (1 - t) = 0`` there: padded units
of the carry stay exactly zero. Padded *rows* of the carry need not stay zero (without a
mask the bias drives them) but stay finite and never mix with real rows; their state
gradient stays zero as long as the incoming cotangents ``g`` are zero-padded, so they
contribute nothing to ``dz``, ``dbias_partial``, ``d_scaled`` or a deferred ``dW``.
"""

from rhhjax.kernels.triton.backward import (
    backward_fused_padded,
    backward_fused_reference,
    backward_padded,
    backward_padded_reference,
    state_grad_padded,
    state_grad_reference,
)
from rhhjax.kernels.triton.common import cuda_lowering_device
from rhhjax.kernels.triton.config import (
    DEFAULT_CONFIG,
    H100_SMEM_PER_BLOCK,
    Geometry,
    HighwayConfig,
    KernelConfigError,
    validate_config,
)
from rhhjax.kernels.triton.forward import forward_padded, forward_padded_reference
from rhhjax.kernels.triton.stacked import backward_fused_stacked, forward_stacked

__all__ = [
    "DEFAULT_CONFIG",
    "H100_SMEM_PER_BLOCK",
    "Geometry",
    "HighwayConfig",
    "KernelConfigError",
    "backward_fused_padded",
    "backward_fused_reference",
    "backward_fused_stacked",
    "backward_padded",
    "backward_padded_reference",
    "cuda_lowering_device",
    "forward_padded",
    "forward_padded_reference",
    "forward_stacked",
    "state_grad_padded",
    "state_grad_reference",
    "validate_config",
]
