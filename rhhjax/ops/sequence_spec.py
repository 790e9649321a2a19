"""The static description of one recurrence call: `SequenceSpec`, and `ModelFacts`, what an
implementation needs to know of the model to say whether it runs it.

Plain types with no implementation behind them: the implementation modules (`fused`,
`pallas`, `mosaic`) and `lowrank` take a `SequenceSpec`; `rhhjax.ops.spec.resolve` builds one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rhhjax.kernels import triton

SCAN = "scan"  # the textbook nn.scan (the reference); every other name is a registered op


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    """What an implementation needs to know of the model to say whether it can run it."""

    model_type: str  # "rhn" | "hyperrhn" | "lstm"
    hyper_input: str = "x"  # "x" | "x_and_state"
    dropout: str = "none"  # "gate" | "variational" | "none"
    hyper_rank: int = 0


@dataclasses.dataclass(frozen=True)
class SequenceSpec:
    """Static description of the recurrence (hashable: a custom_vjp nondiff arg).

    Built by `rhhjax.ops.spec.resolve`; `gate_dropout` and `first_step` are set per call by
    the cores (`dataclasses.replace`). `reason` says why `impl` was chosen (not part of eq/hash).
    """

    impl: str  # A resolved name of `spec.IMPLS` (never "auto").
    keep: float  # Gate-dropout keep probability (used when gate dropout is on).
    dtype: Any  # Matmul input dtype.
    gate_dropout: bool = False  # Whether gate masks are generated from the key.
    # Interpret mode: Pallas interpret mode (`pallas`), GPU interpret mode, the real kernels
    # executed on the host (`mosaic`, `persistent`: `rhhjax.kernels.mosaic.interpret`).
    interpret: bool = False
    # `mosaic`, `persistent`: the kernels' pure-JAX references run in their place (the tests'
    # way of checking everything around the kernels under any jax); `resolve` never sets it.
    references: bool = False
    kernel: triton.HighwayConfig = triton.HighwayConfig()  # Pallas block sizes.
    # Time index of the call's first step: gate masks of entry i are those of step
    # first_step + i (1 when the caller ran step 0 itself, e.g. model.original_first_step).
    first_step: int = 0
    # The op returns the last layer's states [T, B, n] only (all a model's main cell reads),
    # so its backward gets that layer's cotangent alone (`Implementation.LAST_LAYER_COTANGENT`).
    last_layer_only: bool = False
    reason: str = dataclasses.field(default="", compare=False)

    @property
    def is_scan(self) -> bool:
        """Whether the cores run the textbook `nn.scan` (else the whole-sequence op)."""
        return self.impl == SCAN
