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

Adding an implementation: one module beside `fused.py` (the interface of `rhhjax.ops.fused`:
NAME, INTERPRETABLE, KEEP_DTYPE, unsupported, geometry, prepare_weights, saved_rows,
forward_loop, backward_loop; `unavailable` where it cannot run on every platform,
`substitute` where another implementation runs some models in its place) and one
entry in `IMPLEMENTATIONS` (and, once measured, its place in the rankings of `_MEASURED`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from rhhjax.errors import UserError
from rhhjax.kernels import triton
from rhhjax.ops import fused, loops, mosaic, pallas, persistent
from rhhjax.ops.sequence_spec import SCAN, ModelFacts, SequenceSpec

__all__ = ["SCAN", "ModelFacts", "SequenceSpec"]  # re-exported: the types of `resolve`

AUTO = "auto"
# The whole-sequence ops, by name: the only table of implementations.
IMPLEMENTATIONS = {module.NAME: module for module in (fused, pallas, mosaic, persistent)}
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
    substitute = getattr(IMPLEMENTATIONS.get(impl), "substitute", None)
    if substitute is not None and substitute(model) is not None:
        impl, reason = substitute(model)
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
    """Why the explicit `impl` cannot run on `platform` in `pallas_mode`, or None (modules
    without `unavailable` run everywhere; "auto" picks only those)."""
    check_here = getattr(IMPLEMENTATIONS.get(impl), "unavailable", None)
    return None if check_here is None else check_here(pallas_mode, platform)


# Measured step times (ms, median) that decide "auto", per platform: the ranking of the
# implementations from fastest, and where it comes from.
#   gpu: results/bench_gpu_h100.json (H100, the paper's sizes, one train step): HyperRHN bf16
#     fused 41.7, pallas 59.7, scan 119.1; f32 fused 50.4, pallas 94.1, scan 127.7; RHN bf16
#     fused 26.5, pallas 44.5, scan 66.7; f32 fused 33.5, pallas 74.7, scan 75.8.
#   cpu: results/bench_cpu_paper.json (paper HyperRHN f32: scan 26,909, fused 34,058) and
#     results/bench_cpu_small.json (small RHN and HyperRHN, f32 and bf16: scan 165-255,
#     fused 194-279): scan is faster in every measured row.
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
