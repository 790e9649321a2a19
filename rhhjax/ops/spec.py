"""The implementation of the RHN time recurrence, decided ONCE: `resolve` -> `SequenceSpec`.

`resolve` turns plain values (the requested impl, the model's type, hyper input, dropout and
rank, the matmul dtype, the Pallas mode and block sizes, the gate keep probability) into a
small frozen `SequenceSpec` (`rhhjax.ops.sequence_spec`, re-exported here); the model builds
it once (`rhhjax.models.build_model`) and the cores receive it. Nothing else tests the
implementation's name: the cores dispatch on `spec.is_scan` (the textbook `nn.scan`) or call
`rhhjax.ops.recurrence.highway_sequence`, which runs the module registered under `spec.impl`
in `IMPLEMENTATIONS`.

Implementations (`IMPLS`):

- `scan`: the textbook `nn.scan` over the cell in `rhhjax.models` (plain autodiff; the
  reference). Runs every model.
- `fused` (`rhhjax.ops.fused`): the whole time loop as one `jax.custom_vjp`, each micro-layer
  one XLA matmul plus elementwise work.
- `pallas` (`rhhjax.ops.pallas`): the same op, each micro-layer one Pallas kernel.
- `mosaic` (`rhhjax.ops.mosaic`): the same op, each micro-layer one Mosaic GPU kernel forward
  and one backward; on a GPU, executed in GPU interpret mode with pallas_mode "interpret",
  or lowered for a GPU with pallas_mode "compiled". Not in "auto" until measured.
- `persistent` (`rhhjax.ops.persistent`): the same op as two persistent Mosaic GPU kernels,
  one launch for the whole forward and one for the whole backward; runs where `mosaic`
  runs (interpreted at a one-block plan) and is not in "auto" until measured. Rank-d models
  run `fused` in its place (`substitute`), said in the reason.
- `auto`: the fastest measured correct one for the platform and dtype (`_auto`).

Rank-d HyperRHNs (`model.hyper_rank > 0`) have a second, documented entry point: the core
calls `rhhjax.ops.lowrank.lowrank_sequence` (XLA matmuls of the factored rank-d update)
instead of `highway_sequence`. `resolve` admits such a model only as `scan` or `fused`
(`pallas` and `mosaic` refuse it in `unsupported`; `persistent` names `fused` in
`substitute`), so the rank-d op always runs under `spec.impl == "fused"`.

Adding an implementation: one module beside `fused.py` that is an `Implementation` (the
protocol below; `tests/test_ops_spec.py` checks every registered module against it, names of
parameters included) and one entry in `IMPLEMENTATIONS` (and, once measured, its place in
the rankings of `_MEASURED`).
"""

from __future__ import annotations

from typing import Any, Protocol

import jax
import jax.numpy as jnp

from rhhjax.errors import UserError
from rhhjax.kernels import triton
from rhhjax.kernels.layout import Geometry
from rhhjax.ops import fused, loops, mosaic, pallas, persistent
from rhhjax.ops.sequence_spec import SCAN, ModelFacts, SequenceSpec

__all__ = ["SCAN", "ModelFacts", "SequenceSpec"]  # re-exported: the types of `resolve`


class Implementation(Protocol):
    """An implementation module of the whole-sequence recurrence: what `resolve` and
    `rhhjax.ops.recurrence.highway_sequence` read of it (``fused``, ``pallas``, ``mosaic``,
    ``persistent``). Shapes: T time, L depth, Bp / Np the padded batch and units.

    Attributes:
      NAME: the `model.impl` value.
      INTERPRETABLE: whether it runs Pallas kernels (interpreted per `model.pallas_mode`).
      KEEP_DTYPE: dtype of the gate-dropout keep decisions the loops read.
      LAST_LAYER_COTANGENT: whether `backward_loop` takes, with ``spec.last_layer_only``,
        the last layer's cotangent alone ([T, Bp, Np]); else it gets every layer's, zeros
        but the last.
    """

    NAME: str
    INTERPRETABLE: bool
    KEEP_DTYPE: Any
    LAST_LAYER_COTANGENT: bool

    def unsupported(self, model: ModelFacts) -> str | None:
        """None, or the one-line reason it cannot run `model` (needs no device)."""

    def unavailable(self, pallas_mode: str, platform: str | None) -> str | None:
        """None, or the one-line reason it cannot run on `platform` in `pallas_mode`."""

    def substitute(self, model: ModelFacts) -> tuple[str, str] | None:
        """(the implementation that runs `model` in its place, why), or None."""

    def geometry(self, spec: SequenceSpec, batch: int, width: int) -> Geometry:
        """The padded layout (`rhhjax.kernels.layout.Geometry`) of a [batch, width] state."""

    def scales_operand(self, geo: Geometry, z: jax.Array | None) -> jax.Array | None:
        """The hyper scales z [T, L, B, n] (or None) in the layout its loops read (the padded
        [T, L, Bp, Np], or `persistent`'s layer-major one), prepared once per call."""

    def prepare_weights(
        self, spec: SequenceSpec, geo: Geometry, kernel_s: jax.Array, transposed: bool = False
    ) -> tuple[jax.Array, ...]:
        """W_l [L, n, 2n] -> the weights in its layout and matmul dtype, padded and cast once
        per call (`transposed`: the backward's), passed to its loops as they are."""

    def saved_rows(self, has_z: bool) -> loops.Fields:
        """What the forward saves per micro-layer besides its input state."""

    def forward_loop(
        self, spec, geo, w, bias, s0, xproj, z, keep, hidden, save: bool
    ) -> tuple[jax.Array, Any]:
        """(states [T, L, Bp, Np], saved): saved (with ``save``, else None) is what its own
        `backward_loop` reads, handed back to it as it is."""

    def backward_loop(
        self, spec, geo, w, bias, s0, xproj, z, keep, hidden, saved, g_states
    ) -> tuple[jax.Array, jax.Array, jax.Array | None, jax.Array, jax.Array]:
        """(ds0 [Bp, Np], d_scaled [T, L | 1, Bp, 2, Np] (layer 0: the gradient of xproj),
        dz [T, L, Bp, Np] or None, dbias [L, 2, Np], dW [L, K, 2, Np]), all padded.
        g_states: [T, L, Bp, Np], or [T, Bp, Np] (the last layer's) where
        LAST_LAYER_COTANGENT and ``spec.last_layer_only``."""


AUTO = "auto"
# The whole-sequence ops, by name: the only table of implementations.
IMPLEMENTATIONS: dict[str, Implementation] = {
    module.NAME: module for module in (fused, pallas, mosaic, persistent)
}
IMPLS = (SCAN, *IMPLEMENTATIONS)
CHOICES = (AUTO, *IMPLS)  # what `model.impl` accepts
PALLAS_MODES = ("auto", "compiled", "interpret")


class UnsupportedImpl(UserError):
    """An implementation that cannot run the model (one line, names the alternative)."""


def check(impl: str, model: ModelFacts) -> None:
    """Raises UnsupportedImpl (one line) when `impl` is unknown or cannot run `model`.

    Needs no device: `ModelConfig.validate` calls it before anything is compiled.
    """
    if impl not in CHOICES:
        raise UnsupportedImpl(f"model.impl={impl!r} is not one of {', '.join(CHOICES)}")
    module = IMPLEMENTATIONS.get(impl)
    reason = None if module is None else module.unsupported(model)
    if reason is not None:
        raise UnsupportedImpl(reason)


def resolve(
    impl: str,
    model: ModelFacts,
    *,
    dtype: Any,
    keep: float = 1.0,
    pallas_mode: str = "auto",
    kernel: triton.HighwayConfig = triton.HighwayConfig(),  # noqa: B008 (frozen)
    platform: str | None = None,
) -> SequenceSpec:
    """The one decision: the requested `impl` ("auto" or a name of IMPLS) -> SequenceSpec.

    `platform` (default `jax.default_backend()`, read only when needed) decides "auto" and
    the kernels' interpret mode: `pallas_mode` "auto" compiles Triton on a GPU and interprets
    it elsewhere, and compiles `mosaic` / `persistent` on a GPU (refused elsewhere);
    "compiled" (e.g. to trace a GPU step on a CPU host: `check_executable` refuses to run
    it there); "interpret" (Pallas interpret mode for `pallas`, GPU interpret mode for
    `mosaic` and `persistent` where jax has it). An explicit impl that cannot run on
    `platform` in `pallas_mode` is refused here, in one line, before anything is traced.
    """
    check(impl, model)
    if pallas_mode not in PALLAS_MODES:
        raise UnsupportedImpl(
            f"model.pallas_mode={pallas_mode!r} is not one of {', '.join(PALLAS_MODES)}"
        )
    why_not_here = _unavailable(impl, pallas_mode, platform)
    if why_not_here is not None:
        raise UnsupportedImpl(why_not_here)
    dtype = jnp.dtype(dtype)
    reason = "requested"
    if impl == AUTO:
        platform = platform or jax.default_backend()
        impl, reason = _auto(model, dtype, platform)
    module = IMPLEMENTATIONS.get(impl)
    instead = None if module is None else module.substitute(model)
    if instead is not None:
        impl, reason = instead
    module = IMPLEMENTATIONS.get(impl)
    interpret = (module is not None and module.INTERPRETABLE) and (
        pallas_mode == "interpret"
        or (pallas_mode == "auto" and (platform or jax.default_backend()) != "gpu")
    )
    return SequenceSpec(impl, float(keep), dtype, interpret=interpret, kernel=kernel, reason=reason)


def check_executable(resolved: SequenceSpec, pallas_mode: str, platform: str | None = None):
    """Raises UnsupportedImpl (one line) when the kernels of `resolved` can only be lowered
    for a GPU here, not executed: `pallas_mode` "compiled" off a GPU
    (`loops.lowering_only`). `resolve` accepts that mode anywhere, for the deviceless
    compile report; a program that will run the model (the trainer) calls this too."""
    module = IMPLEMENTATIONS.get(resolved.impl)
    if module is None or not module.INTERPRETABLE:
        return
    reason = loops.lowering_only(resolved.impl, pallas_mode, platform)
    if reason is not None:
        raise UnsupportedImpl(reason)


def _unavailable(impl: str, pallas_mode: str, platform: str | None) -> str | None:
    """Why the explicit `impl` cannot run on `platform` in `pallas_mode`, or None (`scan`
    and "auto" run everywhere: "auto" picks only implementations that do)."""
    module = IMPLEMENTATIONS.get(impl)
    return None if module is None else module.unavailable(pallas_mode, platform)


# What decides "auto", per platform: the ranking of the implementations from fastest by
# measured training-step times, and the source the start-up line names. The measurements
# (command, machine, date, every row): results/gpu_h100.md (gpu: bench_gpu_h100.json) and
# results/README.md#training-step-benchmark-cpu (cpu: bench_cpu_paper.json,
# bench_cpu_small.json; scan is faster in every measured row).
_MEASURED = {
    "gpu": (
        (fused.NAME, pallas.NAME, SCAN),
        "the H100 measurements, RHN and HyperRHN, f32 and bf16 (results/bench_gpu_h100.json: "
        "HyperRHN bf16 fused 41.7 ms, pallas 59.7, scan 119.1 per step)",
    ),
    "cpu": (
        (SCAN, fused.NAME, pallas.NAME),
        "the CPU measurements, RHN and HyperRHN, f32 and bf16 (results/bench_cpu_paper.json: "
        "paper HyperRHN scan 26.9 s, fused 34.1 s per step; results/bench_cpu_small.json)",
    ),
}


def _auto(model: ModelFacts, dtype: jnp.dtype, platform: str) -> tuple[str, str]:
    """(impl, why) of "auto": the fastest measured implementation on `platform` that runs
    `model` (every measured ranking holds for f32 and bf16); scan where nothing was measured."""
    if platform not in _MEASURED:
        return SCAN, f"no measurement on platform {platform!r}: scan, the reference"
    ranking, source = _MEASURED[platform]
    rank_note = " (rank-d models not measured: ranked as rank 0)" if model.hyper_rank else ""
    for position, name in enumerate(ranking):
        module = IMPLEMENTATIONS.get(name)
        if module is None or module.unsupported(model) is None:
            faster = ranking[:position]
            why = f"the fastest {jnp.dtype(dtype).name} {platform} implementation in {source}"
            if faster:
                why = f"{', '.join(faster)} cannot run this model; {name} is the next in {source}"
            return name, why + rank_note
    raise AssertionError("scan runs every model")  # pragma: no cover
