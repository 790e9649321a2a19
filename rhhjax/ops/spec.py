"""The implementation of the RHN time recurrence, decided once: `resolve` -> `SequenceSpec`.

The model builds the spec once; the cores run `nn.scan` when `spec.is_scan`, else
`rhhjax.ops.recurrence.highway_sequence`, which runs the module registered under `spec.impl`
in `IMPLEMENTATIONS` (`fused`, `mosaic`, `persistent`). `auto` picks the fastest
measured one that runs the model (`_MEASURED`). Rank-d HyperRHNs call
`rhhjax.ops.lowrank.lowrank_sequence` under `fused`. Adding an implementation: a module that
is an `Implementation`, an entry in `IMPLEMENTATIONS` and what it refuses (`unsupported`,
`substitute`, `unavailable`); removing one: an entry in `RETIRED`. See docs/design.md.
"""

from __future__ import annotations

from typing import Any, Protocol

import jax
import jax.numpy as jnp

from rhhjax.errors import UserError
from rhhjax.kernels.layout import Geometry
from rhhjax.kernels.mosaic import interpret as gpu_interpret
from rhhjax.ops import fused, loops, mosaic, persistent
from rhhjax.ops.sequence_spec import SCAN, ModelFacts, SequenceSpec

__all__ = ["SCAN", "ModelFacts", "SequenceSpec"]


class Implementation(Protocol):
    """A whole-sequence implementation module, as `resolve` and `highway_sequence` read it."""

    NAME: str
    INTERPRETABLE: bool
    KEEP_DTYPE: Any
    LAST_LAYER_COTANGENT: bool

    def geometry(self, spec: SequenceSpec, batch: int, width: int) -> Geometry:
        """The padded layout of a [batch, width] state."""

    def scales_operand(
        self, spec: SequenceSpec, geo: Geometry, z: jax.Array | None
    ) -> jax.Array | None:
        """z [T, L, B, n] (or None) in the layout its loops read, once per call."""

    def prepare_weights(
        self, spec: SequenceSpec, geo: Geometry, kernel_s: jax.Array, transposed: bool = False
    ) -> tuple[jax.Array, ...]:
        """W_l [L, n, 2n] -> its layout and matmul dtype, once per call."""

    def saved_rows(self, has_z: bool) -> loops.Fields:
        """What the forward saves per micro-layer besides its input state."""

    def forward_loop(
        self, spec, geo, w, bias, s0, xproj, z, keep, hidden, save: bool
    ) -> tuple[jax.Array, Any]:
        """(states [T, L, Bp, Np], saved or None), saved read by its `backward_loop`."""

    def backward_loop(
        self, spec, geo, w, bias, s0, xproj, z, keep, hidden, saved, g_states
    ) -> tuple[jax.Array, jax.Array, jax.Array | None, jax.Array, jax.Array]:
        """(ds0, d_scaled, dz or None, dbias, dW), padded."""


AUTO = "auto"
# The whole-sequence ops by name: the only table of implementations.
IMPLEMENTATIONS: dict[str, Implementation] = {
    module.NAME: module for module in (fused, mosaic, persistent)
}
IMPLS = (SCAN, *IMPLEMENTATIONS)
CHOICES = (AUTO, *IMPLS)
PALLAS_MODES = ("auto", "compiled", "interpret")
_NO_VARIATIONAL = (mosaic.NAME, persistent.NAME)
_NO_RANK_D = (mosaic.NAME,)  # `persistent` runs `fused` in its place
_HOPPER_ONLY = (mosaic.NAME, persistent.NAME)
# Implementations that were removed, and the one line a request for one gets instead.
RETIRED = {
    "pallas": (
        "model.impl='pallas' (Pallas Triton) was retired: it was slower than 'fused' on every "
        "GPU measured; use 'mosaic' or 'persistent' (Hopper GPUs: H100, H200) or 'fused' "
        "(any platform)"
    ),
}


class UnsupportedImpl(UserError):
    """An implementation that cannot run the model."""


def unsupported(impl: str, model: ModelFacts) -> str | None:
    """None, or the one-line reason `impl` cannot run `model` (needs no device)."""
    if impl not in IMPLEMENTATIONS:
        return None
    if model.model_type == "lstm":
        return f"model.impl={impl!r} is only for RHN models; use 'scan' for lstm"
    if model.model_type == "hyperrhn" and model.hyper_input != "x":
        return (
            f"model.impl={impl!r} needs model.hyper_input='x' (x_and_state reads the "
            "main state, so the hyper recurrence cannot run first); use impl='scan'"
        )
    if impl in _NO_VARIATIONAL and model.dropout == "variational":
        return (
            f"model.impl={impl!r} supports dropout='gate' or 'none'; use impl='fused' "
            "for variational dropout"
        )
    if impl in _NO_RANK_D and model.hyper_rank > 0:
        return (
            f"model.hyper_rank={model.hyper_rank} is not supported by model.impl={impl!r} (its "
            "kernels scale output columns only); use impl='fused' or 'scan'"
        )
    return None


def substitute(impl: str, model: ModelFacts) -> tuple[str, str] | None:
    """(the implementation that runs `model` in `impl`'s place, why), or None."""
    if impl == persistent.NAME and model.hyper_rank > 0:
        return fused.NAME, (
            f"model.impl={impl!r} has no rank-d kernels (model.hyper_rank="
            f"{model.hyper_rank}): runs {fused.NAME!r} instead"
        )
    return None


def unavailable(impl: str, pallas_mode: str, platform: str | None) -> str | None:
    """None, or the one-line reason `impl` cannot run on `platform` in `pallas_mode`."""
    if impl not in _HOPPER_ONLY or pallas_mode == "compiled":
        return None
    if pallas_mode == "interpret":
        return gpu_interpret.unavailable(f"model.impl={impl!r} with model.pallas_mode='interpret'")
    platform = platform or jax.default_backend()
    if platform == "gpu":
        return None
    return (
        f"model.impl={impl!r} compiles Mosaic GPU kernels for a Hopper GPU, and the platform "
        f"is {platform}: {_off_gpu_advice()}"
    )


def lowering_only(impl: str, pallas_mode: str, platform: str | None) -> str | None:
    """Why `impl`'s kernels can be lowered but not executed here ("compiled" off a GPU)."""
    platform = platform or jax.default_backend()
    if pallas_mode != "compiled" or platform == "gpu":
        return None
    return (
        f"model.pallas_mode='compiled' only lowers the kernels of model.impl={impl!r} for a GPU "
        f"(the deviceless compile report); they cannot execute on {platform}: "
        f"{_off_gpu_advice()}"
    )


def _off_gpu_advice() -> str:
    if gpu_interpret.available():
        return (
            "use model.pallas_mode='interpret' (the kernels executed in GPU interpret "
            "mode: slow, for checking), or model.impl='fused' or 'scan'"
        )
    return (
        "use model.impl='fused' or 'scan' (executing the kernels on a CPU, "
        f"model.pallas_mode='interpret', needs jax >= {gpu_interpret.MIN_JAX})"
    )


def retired(impl: str) -> str | None:
    """None, or the one line saying `impl` was removed and what to use instead."""
    return RETIRED.get(impl)


def check(impl: str, model: ModelFacts) -> None:
    """Raises UnsupportedImpl when `impl` is unknown or cannot run `model` (no device)."""
    if impl in RETIRED:
        raise UnsupportedImpl(RETIRED[impl])
    if impl not in CHOICES:
        raise UnsupportedImpl(f"model.impl={impl!r} is not one of {', '.join(CHOICES)}")
    reason = unsupported(impl, model)
    if reason is not None:
        raise UnsupportedImpl(reason)


def resolve(
    impl: str,
    model: ModelFacts,
    *,
    dtype: Any,
    keep: float = 1.0,
    pallas_mode: str = "auto",
    platform: str | None = None,
) -> SequenceSpec:
    """The requested `impl` ("auto" or one of IMPLS) -> SequenceSpec; refuses in one line
    an impl that cannot run on ``platform`` in ``pallas_mode``."""
    check(impl, model)
    if pallas_mode not in PALLAS_MODES:
        raise UnsupportedImpl(
            f"model.pallas_mode={pallas_mode!r} is not one of {', '.join(PALLAS_MODES)}"
        )
    why_not_here = unavailable(impl, pallas_mode, platform)
    if why_not_here is not None:
        raise UnsupportedImpl(why_not_here)
    dtype = jnp.dtype(dtype)
    reason = "requested"
    if impl == AUTO:
        platform = platform or jax.default_backend()
        impl, reason = _auto(model, dtype, platform)
    instead = substitute(impl, model)
    if instead is not None:
        impl, reason = instead
    module = IMPLEMENTATIONS.get(impl)
    interpret = (module is not None and module.INTERPRETABLE) and (
        pallas_mode == "interpret"
        or (pallas_mode == "auto" and (platform or jax.default_backend()) != "gpu")
    )
    return SequenceSpec(impl, float(keep), dtype, interpret=interpret, reason=reason)


def check_executable(resolved: SequenceSpec, pallas_mode: str, platform: str | None = None):
    """Raises UnsupportedImpl where `resolved`'s kernels can only be lowered, not run."""
    module = IMPLEMENTATIONS.get(resolved.impl)
    if module is None or not module.INTERPRETABLE:
        return
    reason = lowering_only(resolved.impl, pallas_mode, platform)
    if reason is not None:
        raise UnsupportedImpl(reason)


# "auto"'s ranking per platform, fastest first (results/gpu_h100.md, results/README.md).
_MEASURED = {
    "gpu": (
        (fused.NAME, SCAN),
        "the H100 measurements, RHN and HyperRHN, f32 and bf16 (results/bench_gpu_h100.json)",
    ),
    "cpu": (
        (SCAN, fused.NAME),
        "the CPU measurements, RHN and HyperRHN, f32 and bf16 (results/bench_cpu_paper.json, "
        "results/bench_cpu_small.json)",
    ),
}


def _auto(model: ModelFacts, dtype: jnp.dtype, platform: str) -> tuple[str, str]:
    """(impl, why) of "auto": the fastest measured one that runs `model`."""
    if platform not in _MEASURED:
        return SCAN, f"no measurement on platform {platform!r}: scan, the reference"
    ranking, source = _MEASURED[platform]
    rank_note = " (rank-d models not measured: ranked as rank 0)" if model.hyper_rank else ""
    for position, name in enumerate(ranking):
        if unsupported(name, model) is None:
            faster = ranking[:position]
            why = f"the fastest {jnp.dtype(dtype).name} {platform} implementation in {source}"
            if faster:
                why = f"{', '.join(faster)} cannot run this model; {name} is the next in {source}"
            return name, why + rank_note
    raise AssertionError("scan runs every model")  # pragma: no cover
