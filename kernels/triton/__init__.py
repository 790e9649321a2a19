"""The Pallas Triton op: the fused highway micro-layer step and its backward.

s [B, n], w [n, 2n], z [B, n] or None, xproj [B, 2n] or None, mask [B, n] int8 or None:
a = (s @ w + xproj) * [z, z] + bias; s_new = tanh(a_h) * sigmoid(a_t) * mask
+ s * (1 - sigmoid(a_t)). Gate arithmetic in f32. Modules:

* ``config.py``: `HighwayConfig`, block sizes and launch parameters; `validate_config`.
* ``common.py``: launch parameters, operand checks, BlockSpecs, the ``pallas_call``.
* ``forward.py``: `forward_padded`; ``backward.py``: `state_grad_padded`, references.
* ``stacked.py``: the kernels on whole [T, L, ...] arrays at a traced step, in place.
Padded layout: `rhhjax.kernels.layout.Geometry`. Design: docs/design.md (module notes).
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
