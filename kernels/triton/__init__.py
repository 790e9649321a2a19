"""The Pallas Triton op: the fused highway micro-layer step (Recurrent Highway Networks).

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

This package's face is the op's public API; its modules:

* ``config.py`` -- :class:`HighwayConfig` (block sizes and Triton launch parameters;
  :func:`validate_config`, :class:`KernelConfigError`). Its padded layout for one (batch, n)
  is :class:`rhhjax.kernels.layout.Geometry` (re-exported here), shared by every
  implementation.
* ``common.py`` -- what the kernels share: launch parameters, operand checks, the BlockSpecs
  of the padded layout and THE ``pallas_call`` (:func:`~rhhjax.kernels.triton.common.launch`),
  the in-kernel gate math, the references' helpers, and :func:`cuda_lowering_device` (trace
  and lower the kernels for CUDA on a host without a GPU).
* ``forward.py`` -- :func:`forward_padded` (one kernel: both matmul halves of a column block,
  gates, combine) and :func:`forward_padded_reference`.
* ``backward.py`` -- the backward kernel body, :func:`state_grad_padded` (the state-gradient
  GEMM of the layer above alone, e.g. for the gradient of the initial state) and the
  references :func:`backward_padded_reference` (the elementwise gate backward),
  :func:`backward_fused_reference` (GEMM then gate backward) and :func:`state_grad_reference`.
* ``stacked.py`` -- :func:`forward_stacked`, :func:`backward_fused_stacked`: the kernels on
  the WHOLE stacked ``[T, L, ...]`` arrays at a traced time index ``t`` and a static
  ``layer``; they write their outputs in place into stacked buffers aliased to the outputs,
  so a time loop needs no slice or update-slice launch around them. The backward of a
  micro-layer is ONE launch (the GEMM of the layer above fused with its gate backward).

Padded layout (:mod:`rhhjax.kernels.layout`): ``B`` is padded up to ``b_pad`` (a multiple of
``block_b``) and ``n`` up to ``n_pad`` (a multiple of ``block_n`` and ``block_k``) with zeros.
Padded *units* have zero weights, bias, z and xproj, hence ``a = 0`` and ``s_new = tanh(0) * t
+ 0 * (1 - t) = 0`` there: padded units of the carry stay exactly zero. Padded *rows* of the
carry need not stay zero (without a mask the bias drives them) but stay finite and never mix
with real rows; their state gradient stays zero as long as the incoming cotangents ``g`` are
zero-padded, so they contribute nothing to ``dz``, ``dbias_partial``, ``d_scaled`` or a
deferred ``dW``.
"""

from rhhjax.kernels.layout import Geometry
from rhhjax.kernels.triton.backward import (
    backward_fused_reference,
    backward_padded_reference,
    state_grad_padded,
    state_grad_reference,
)
from rhhjax.kernels.triton.common import cuda_lowering_device
from rhhjax.kernels.triton.config import (
    DEFAULT_CONFIG,
    HighwayConfig,
    KernelConfigError,
    validate_config,
)
from rhhjax.kernels.triton.forward import forward_padded, forward_padded_reference
from rhhjax.kernels.triton.stacked import backward_fused_stacked, forward_stacked

__all__ = [
    "DEFAULT_CONFIG",
    "Geometry",
    "HighwayConfig",
    "KernelConfigError",
    "backward_fused_reference",
    "backward_fused_stacked",
    "backward_padded_reference",
    "cuda_lowering_device",
    "forward_padded",
    "forward_padded_reference",
    "forward_stacked",
    "state_grad_padded",
    "state_grad_reference",
    "validate_config",
]
