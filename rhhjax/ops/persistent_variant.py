"""`PersistentVariant`: how `persistent` runs (speed, not values), its text form, the options
the autotunes time on the grid first and those REMOVED as slower on a GPU. Design:
docs/persistent_design.md, "Tuning"."""

from __future__ import annotations

import dataclasses
import functools

from rhhjax.errors import UserError
from rhhjax.kernels.mosaic import rowgroup_layout
from rhhjax.kernels.mosaic.plan import PersistentPlan, PlanError
from rhhjax.ops.persistent_cost import check_runnable, plan_with_units

DEFAULT_TEXT = "default"  # `parse_variant`: the module's default (`default_variant`)
AUTO_TEXT = "auto"  # the same here; the trainer times the variants (rhhjax.train.autotune)
# (stages, k_chunk) of every plan tried by `variant_candidates` (None: the plan's own).
PIPELINES = ((None, None), (2, None), (3, None), (4, None), (4, 32), (6, 32), (2, 128))
OPTIONS = (
    dict(layout="rowgroup"), dict(layout="rowgroup", multicast=1), dict(multicast=1),
    dict(units=32), dict(split_k=1, k_chunk=32, stages=2),
    dict(layout="rowgroup", split_k=1, k_chunk=32, stages=2),
)  # fmt: skip

REMOVED = {
    "hyper_inside": "the hyper cell inside the main kernels measured +6.3 ms (bf16) and "
    "+5.4 ms (f32) a step on an H100; it runs as its own kernels",
    "hyper_blocks": "it placed the hyper cell inside the main kernels, +6.3 ms (H100)",
    "in_flight": "one wgmma group in flight measured +1.9 to +3.4 ms a step (H200)",
    "prefetch": "the weights loaded before the barrier measured +1.2 ms a step (H200)",
    "status": "a grid barrier's give-up is checked on the device in training since the host "
    "check measured 0.8-1.6 ms slower a step (H200)",
}

# Fields whose kernels no GPU has tested: the trainer's autotune leaves their variants out.
UNTESTED_ON_A_GPU = ("multicast", "split_k")


# Texts of removed options that name what runs today, as recorded runs and tables write them.
RECORDED = {("hyper_inside", "0"), ("hyper_inside", "false"), ("status", "host"),
            ("status", "poison")}  # fmt: skip


class VariantError(UserError):
    """A `PersistentVariant` text that does not parse (one line)."""


@dataclasses.dataclass(frozen=True)
class PersistentVariant:
    """How `persistent` runs (speed, not values); docs/persistent_design.md section 5."""

    layout: str = "grid"
    stages: int | None = None
    k_chunk: int | None = None
    multicast: int = 0
    units: int | None = None  # per block of every plan (None: the plan's own)
    split_k: int = 0  # the backward's main GEMM split between a block's two warpgroups

    def __post_init__(self):
        if self.layout not in rowgroup_layout.LAYOUTS:
            raise VariantError(f"layout={self.layout!r} is not one of {rowgroup_layout.LAYOUTS}")
        for name, low, multiple in (("stages", 1, 1), ("k_chunk", 8, 8), ("units", 4, 4)):
            value = getattr(self, name)
            if value is not None and (value < low or value % multiple):
                raise VariantError(f"{name}={value} must be >= {low} and a multiple of {multiple}")
        for name in ("multicast", "split_k"):
            if getattr(self, name) not in (0, 1):
                raise VariantError(f"{name}={getattr(self, name)} must be 0 or 1")
        if self.split_k and self.multicast:
            raise VariantError("split_k=1 runs without multicast")

    def text(self) -> str:
        """``layout=grid[,stages=S,k_chunk=K,multicast=1,units=U,split_k=1]``."""
        parts = [f"layout={self.layout}"]
        parts += [f"{k}={getattr(self, k)}" for k in ("stages", "k_chunk") if getattr(self, k)]
        parts += ["multicast=1"] * self.multicast + [f"units={self.units}"] * bool(self.units)
        parts += ["split_k=1"] * self.split_k
        return ",".join(parts)

    def tested_on_a_gpu(self) -> bool:
        return not any(getattr(self, name) for name in UNTESTED_ON_A_GPU)

    def planned(self, plan: PersistentPlan) -> PersistentPlan:
        """``plan`` at this variant's units and pipeline; PlanError (one line) unless both
        kernels run it."""
        if self.units and self.units != plan.units_per_block:
            plan = _with_units(plan, self.units)
        shared = ("a" if self.layout == "rowgroup" else "b") if self.multicast else ""
        if (self.stages, self.k_chunk, shared, self.split_k) == (None, None, "", 0):
            return plan
        stages, k_chunk = self.stages or plan.stages, self.k_chunk or plan.k_chunk
        return _pipelined(plan, stages, k_chunk, shared, self.split_k)


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
    plan: PersistentPlan, stages: int, k_chunk: int, shared: str, split_k: int
) -> PersistentPlan:
    """``shared``: the multicast operand, "a" (the state rows), "b" (the weights: not to a
    plan of one row block, which has no one to share them with) or ""."""
    what = (
        f"persistent variant stages={stages}, k_chunk={k_chunk}, "
        f"multicast={int(bool(shared))}, split_k={split_k}"
    )
    try:
        replanned = dataclasses.replace(
            plan, stages=stages, k_chunk=k_chunk, multicast_a=shared == "a",
            multicast_b=shared == "b" and plan.row_blocks > 1, split_k=bool(split_k),
        )  # fmt: skip
        check_runnable(replanned)
    except PlanError as error:
        raise PlanError(f"{what}: {error}") from None
    return replanned


def parse_variant(text: str) -> PersistentVariant | None:
    """``key=value,...`` -> the variant (others at their defaults), DEFAULT_TEXT or AUTO_TEXT
    -> None, else VariantError (REMOVED's keys with their figure; RECORDED texts skipped)."""
    if not isinstance(text, str):
        raise VariantError(f"must be a string, got {type(text).__name__}")
    if text.strip() in (DEFAULT_TEXT, AUTO_TEXT):
        return None
    fields = {f.name: f.type for f in dataclasses.fields(PersistentVariant)}
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise VariantError(f"is empty; give {DEFAULT_TEXT!r} or key=value pairs")
    values = {}
    for item in items:
        key, sep, value = (x.strip() for x in item.partition("="))
        if (key, value.lower()) in RECORDED:
            continue
        if key in REMOVED:
            raise VariantError(f"{key} was removed: {REMOVED[key]}")
        if key not in fields or not sep:
            raise VariantError(f"{item!r} is not key=value with key one of {', '.join(fields)}")
        if key in values:
            raise VariantError(f"gives {key} twice: keep one {key}=...")
        values[key] = _variant_value(key, value)
    return PersistentVariant(**values)


def _variant_value(key: str, value: str):
    if key == "layout":
        return value
    if value.isdigit():
        return int(value)
    raise VariantError(f"{key}={value!r} is not a whole number >= 0 (digits only)")
