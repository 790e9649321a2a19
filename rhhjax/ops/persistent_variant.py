"""`PersistentVariant`: how `persistent` runs (speed, not values), its text form
(``model.persistent_variant``) and the levers the autotunes time first. Design:
docs/persistent_design.md section 5."""

from __future__ import annotations

import dataclasses
import functools

from rhhjax.errors import UserError
from rhhjax.kernels.mosaic import persistent_forward as pf
from rhhjax.kernels.mosaic import rowgroup_layout
from rhhjax.kernels.mosaic.plan import PersistentPlan, PlanError
from rhhjax.ops.persistent_cost import check_runnable, plan_with_units

DEFAULT_TEXT = "default"  # `parse_variant`: the module's switches (`default_variant`)
AUTO_TEXT = "auto"  # the same here; the trainer times the variants (rhhjax.train.autotune)
# (stages, k_chunk) of every plan tried by `variant_candidates` (None: the plan's own).
PIPELINES = ((None, None), (2, None), (3, None), (4, None), (4, 32), (6, 32), (2, 128))
# Today's variant with each of these is timed right after it (`variant_candidates`), the
# fastest timed so far first (docs/persistent_design.md, "Autotuning the variant").
LEVERS = (
    dict(layout="rowgroup"), dict(layout="rowgroup", multicast=1), dict(multicast=1),
    dict(units=32), dict(split_k=1, k_chunk=32, stages=2),
    dict(layout="rowgroup", split_k=1, k_chunk=32, stages=2),
    dict(status="poison"), dict(in_flight=1), dict(in_flight=1, status="poison"),
    dict(prefetch=1), dict(prefetch=1, in_flight=1),
)  # fmt: skip

# Variant fields whose kernels have not passed a compiled test on a GPU: the trainer's
# autotune leaves out variants that set them (a loan's `gpu_suite.sh check` times them).
UNTESTED_ON_A_GPU = ("multicast", "split_k")


class VariantError(UserError):
    """A `PersistentVariant` text that does not parse (one line)."""


STATUS_CHECKS = ("host", "poison")


@dataclasses.dataclass(frozen=True)
class PersistentVariant:
    """How `persistent` runs (speed, not values); docs/persistent_design.md section 5."""

    hyper_inside: bool = False
    layout: str = "grid"
    stages: int | None = None
    k_chunk: int | None = None
    in_flight: int = 0
    status: str = "host"  # the row-group layout's is always this (it has none to check)
    prefetch: int = 0
    hyper_blocks: str = "shared"
    multicast: int = 0
    units: int | None = None  # per block of every plan (None: the plan's own)
    split_k: int = 0  # the backward's main GEMM split between two warpgroups of a block

    def __post_init__(self):
        if self.layout not in rowgroup_layout.LAYOUTS:
            raise VariantError(f"layout={self.layout!r} is not one of {rowgroup_layout.LAYOUTS}")
        for name, low, multiple in (("stages", 1, 1), ("k_chunk", 8, 8), ("units", 4, 4)):
            value = getattr(self, name)
            if value is not None and (value < low or value % multiple):
                raise VariantError(f"{name}={value} must be >= {low} and a multiple of {multiple}")
        for name in ("in_flight", "prefetch", "multicast", "split_k"):
            if getattr(self, name) not in (0, 1):
                raise VariantError(f"{name}={getattr(self, name)} must be 0 or 1")
        if (self.prefetch or self.multicast) and self.hyper_inside:
            lever = "prefetch" if self.prefetch else "multicast"
            raise VariantError(f"{lever}=1 runs the hyper cell apart (hyper_inside=0)")
        if self.multicast and self.prefetch and self.layout == "grid":
            raise VariantError("multicast=1 multicasts the weights in the grid: no prefetch=1")
        if self.split_k and (self.prefetch or self.multicast or self.hyper_inside):
            raise VariantError("split_k=1 runs without prefetch, multicast and hyper_inside")
        if self.hyper_blocks not in pf.HYPER_BLOCKS:
            raise VariantError(
                f"hyper_blocks={self.hyper_blocks!r} is not one of {pf.HYPER_BLOCKS}"
            )
        if self.hyper_blocks == "own" and (not self.hyper_inside or self.layout != "grid"):
            raise VariantError("hyper_blocks=own needs hyper_inside=1 and layout=grid")
        if self.status not in STATUS_CHECKS:
            raise VariantError(f"status={self.status!r} is not one of {STATUS_CHECKS}")
        if self.layout == "rowgroup":  # its status is always 0: nothing to check (`_checked`)
            object.__setattr__(self, "status", STATUS_CHECKS[0])

    def text(self) -> str:
        """``hyper_inside=0,layout=grid[,stages=S,k_chunk=K,in_flight=1,status=poison,
        prefetch=1,hyper_blocks=own,multicast=1,units=U,split_k=1]``."""
        parts = [f"hyper_inside={int(self.hyper_inside)}", f"layout={self.layout}"]
        parts += [f"{k}={getattr(self, k)}" for k in ("stages", "k_chunk") if getattr(self, k)]
        parts += ["in_flight=1"] * self.in_flight + [f"status={self.status}"] * self.poisons()
        parts += ["prefetch=1"] * self.prefetch
        parts += [f"hyper_blocks={self.hyper_blocks}"] * (self.hyper_blocks != "shared")
        parts += ["multicast=1"] * self.multicast + [f"units={self.units}"] * bool(self.units)
        parts += ["split_k=1"] * self.split_k
        return ",".join(parts)

    def poisons(self) -> bool:
        return self.status == "poison"

    def tested_on_a_gpu(self) -> bool:
        return not any(getattr(self, name) for name in UNTESTED_ON_A_GPU)

    def planned(self, plan: PersistentPlan) -> PersistentPlan:
        """``plan`` at this variant's units and pipeline; PlanError (one line) unless both
        kernels run it."""
        if self.units and self.units != plan.units_per_block:
            plan = _with_units(plan, self.units)
        shared = ("a" if self.layout == "rowgroup" else "b") if self.multicast else ""
        levers = (self.in_flight, self.prefetch, shared, self.split_k)
        if (self.stages, self.k_chunk, *levers) == (None, None, 0, 0, "", 0):
            return plan
        stages, k_chunk = self.stages or plan.stages, self.k_chunk or plan.k_chunk
        return _pipelined(plan, stages, k_chunk, *levers)


@functools.cache
def _with_units(plan: PersistentPlan, units: int) -> PersistentPlan:
    replanned = plan_with_units(plan, units)
    if replanned is None:
        raise PlanError(
            f"persistent variant units={units}: neither kernel runs {plan.row_blocks} row blocks "
            f"of {units} units for width {plan.width} ({plan.dtype})"
        )
    return replanned


@functools.cache
def _pipelined(
    plan: PersistentPlan, stages: int, k_chunk: int, in_flight: int, prefetch: int, shared: str,
    split_k: int,
) -> PersistentPlan:  # fmt: skip
    """``shared``: the multicast operand, "a" (the state rows), "b" (the weights: not to a
    plan of one row block, which has no one to share them with) or ""."""
    what = (
        f"persistent variant stages={stages}, k_chunk={k_chunk}, in_flight={in_flight}, "
        f"prefetch={prefetch}, multicast={int(bool(shared))}, split_k={split_k}"
    )
    try:
        replanned = dataclasses.replace(
            plan, stages=stages, k_chunk=k_chunk, wgmma_in_flight=in_flight,
            prefetch_weights=bool(prefetch), multicast_a=shared == "a",
            multicast_b=shared == "b" and plan.row_blocks > 1, split_k=bool(split_k),
        )  # fmt: skip
        check_runnable(replanned)
    except PlanError as error:
        raise PlanError(f"{what}: {error}") from None
    return replanned


def parse_variant(text: str) -> PersistentVariant | None:
    """``key=value,...`` (`PersistentVariant`'s fields, others at their defaults) -> the
    variant; DEFAULT_TEXT or AUTO_TEXT -> None (the module's switches); else VariantError."""
    if not isinstance(text, str):
        raise VariantError(f"must be a string, got {type(text).__name__}")
    if text.strip() in (DEFAULT_TEXT, AUTO_TEXT):
        return None
    fields = {f.name: f.type for f in dataclasses.fields(PersistentVariant)}
    values = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = (x.strip() for x in item.partition("="))
        if key not in fields or not sep:
            raise VariantError(f"{item!r} is not key=value with key one of {', '.join(fields)}")
        if key in values:
            raise VariantError(f"gives {key} twice: keep one {key}=...")
        values[key] = _variant_value(key, value)
    if not values:
        raise VariantError(f"is empty; give {DEFAULT_TEXT!r} or key=value pairs")
    return PersistentVariant(**values)


def _variant_value(key: str, value: str):
    if key in ("layout", "status", "hyper_blocks"):
        return value
    if key == "hyper_inside" and value.lower() in ("0", "1", "false", "true"):
        return value.lower() in ("1", "true")
    if key != "hyper_inside" and value.isdigit():
        return int(value)
    wanted = "0 or 1" if key == "hyper_inside" else "a whole number >= 0 (digits only)"
    raise VariantError(f"{key}={value!r} is not {wanted}")
