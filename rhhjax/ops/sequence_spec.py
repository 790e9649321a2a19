"""The static description of one recurrence call (`SequenceSpec`) and the model facts an
implementation needs to say whether it runs the model (`ModelFacts`)."""

from __future__ import annotations

import dataclasses
from typing import Any

SCAN = "scan"  # the textbook nn.scan, the reference


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    """What an implementation needs to know of the model."""

    model_type: str  # "rhn" | "hyperrhn" | "lstm"
    hyper_input: str = "x"  # "x" | "x_and_state"
    dropout: str = "none"  # "gate" | "variational" | "none"
    hyper_rank: int = 0


@dataclasses.dataclass(frozen=True)
class SequenceSpec:
    """Static description of the recurrence (hashable: a custom_vjp nondiff arg); built by
    `spec.resolve`. `reason` (why `impl`) is not part of eq/hash."""

    impl: str  # one of `spec.IMPLS`, never "auto"
    keep: float  # gate-dropout keep probability
    dtype: Any
    gate_dropout: bool = False
    interpret: bool = False
    references: bool = False  # run the kernels' pure-JAX references (tests only)
    first_step: int = 0  # time index of the call's first step, for the gate masks
    last_layer_only: bool = False  # return the last layer's states [T, B, n] only
    variant: Any = None  # persistent: a `PersistentVariant` (None: the module's switches)
    reason: str = dataclasses.field(default="", compare=False)

    @property
    def is_scan(self) -> bool:
        """Whether the cores run the textbook `nn.scan` (else the whole-sequence op)."""
        return self.impl == SCAN
