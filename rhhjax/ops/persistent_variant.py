"""`PersistentVariant` (``model.persistent``): how `persistent` runs, its tuning space, its
text form and the options REMOVED (slower on a GPU, or the plan's). docs/persistent_design.md."""

from __future__ import annotations

import dataclasses
import functools
import itertools

from rhhjax.errors import UserError
from rhhjax.kernels.mosaic import rowgroup_layout
from rhhjax.kernels.mosaic.plan import REGISTER_UNITS, PersistentPlan, PlanError
from rhhjax.ops.persistent_plans import K_CHUNK, check_runnable, plan_with_units

SHARING = ("none", "producer", "multicast", "split_k")
PAIRED = "paired"  # the grid, the hyper cell on blocks of its own in the main cell's launches
LAYOUTS = (*rowgroup_layout.LAYOUTS, PAIRED)
EPILOGUES = ("shared_memory", "registers")
# The fields the autotunes time, as a product (the layout: the default where it runs).
TUNING = dict(stages=(0, 6), sharing=SHARING, epilogue=EPILOGUES)  # the second design early
DEFAULT_TEXT = "default"  # `parse_variant`: the default `PersistentVariant()`
UNTESTED_ON_A_GPU = dict(layout=(PAIRED,), sharing=SHARING[1:], epilogue=("registers",))

REMOVED = {
    "hyper_inside": "the hyper cell inside the main kernels measured +6.3 ms (bf16) and "
    "+5.4 ms (f32) a step on an H100; it runs as its own kernels",
    "hyper_blocks": "it placed the hyper cell inside the main kernels, +6.3 ms (H100)",
    "in_flight": "one wgmma group in flight measured +1.9 to +3.4 ms a step (H200)",
    "prefetch": "the weights loaded before the barrier measured +1.2 ms a step (H200)",
    "status": "a grid barrier's give-up is checked on the device in training since the host "
    "check measured 0.8-1.6 ms slower a step (H200)",
    "k_chunk": "the K chunk is the plan's: the widest of 64, 32, 16 that fits the stages",
}
# Texts of earlier releases -> today's field and value (None: today's default).
RECORDED = {
    ("hyper_inside", "0"): None, ("hyper_inside", "false"): None, ("status", "host"): None,
    ("status", "poison"): None, ("multicast", "0"): None, ("split_k", "0"): None,
    ("multicast", "1"): ("sharing", "multicast"), ("split_k", "1"): ("sharing", "split_k"),
    ("k_chunk", "32"): None,  # the widest that fits the recorded stages 4 and 6
}  # fmt: skip


class VariantError(UserError):
    """A `PersistentVariant` field or text that is not valid (one line)."""


@dataclasses.dataclass(frozen=True)
class PersistentVariant:
    """How `persistent` runs (speed, not values); 0: the plan's own."""

    # rowgroup (one cluster a row group; the grid where it cannot) | grid | paired (the grid,
    # the HyperRHN's two cells in one launch each way)
    layout: str = "rowgroup"
    stages: int = 0  # K pipeline depth, each stage the widest K chunk of 64, 32, 16 that fits
    units: int = 0  # units per block
    # none | producer (a warpgroup issues the loads) | multicast | split_k (backward K)
    sharing: str = "none"
    epilogue: str = "shared_memory"  # shared_memory (the GEMM tile's round trip) | registers

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise VariantError(f"layout={self.layout!r} is not one of {LAYOUTS}")
        if self.sharing not in SHARING:
            raise VariantError(f"sharing={self.sharing!r} is not one of {SHARING}")
        if self.epilogue not in EPILOGUES:
            raise VariantError(f"epilogue={self.epilogue!r} is not one of {EPILOGUES}")
        for name, low, multiple in (("stages", 1, 1), ("units", 4, 4)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise VariantError(f"{name}={value!r} is not a whole number")
            if value and (value < low or value % multiple):
                raise VariantError(
                    f"{name}={value} must be 0 or >= {low}, a multiple of {multiple}"
                )

    def changed(self) -> dict:
        """The fields not at their defaults, name -> value."""
        default = dataclasses.asdict(PersistentVariant())
        return {k: v for k, v in dataclasses.asdict(self).items() if v != default[k]}

    def text(self) -> str:
        """``layout=L[,stages=S,units=U,sharing=X,epilogue=E]``: the fields not at default."""
        others = [f"{k}={v}" for k, v in self.changed().items() if k != "layout"]
        return ",".join([f"layout={self.layout}", *others])

    @property
    def kernel_layout(self) -> str:
        """The kernels' launch layout (`rowgroup_layout.LAYOUTS`): paired is the grid's."""
        return "grid" if self.layout == PAIRED else self.layout

    def tested_on_a_gpu(self) -> bool:
        return all(getattr(self, k) not in v for k, v in UNTESTED_ON_A_GPU.items())

    def planned(self, plan: PersistentPlan) -> PersistentPlan:
        """``plan`` at this variant's units and pipeline; PlanError (one line) unless both
        kernels run it."""
        if self.units and self.units != plan.units_per_block:
            plan = _with_units(plan, self.units, self.kernel_layout)
        registers = self.epilogue == "registers"
        if registers and not self.units and plan.units_per_block % REGISTER_UNITS:
            units = -(-plan.units_per_block // REGISTER_UNITS) * REGISTER_UNITS
            plan = _with_units(plan, units, self.kernel_layout)
        if (self.stages, self.sharing, registers) == (0, "none", False):
            return plan
        shared = ""
        if self.sharing == "multicast":
            shared = "a" if self.kernel_layout == "rowgroup" else "b"
        split_k, producer = self.sharing == "split_k", self.sharing == "producer"
        args = (plan, self.stages, shared, split_k, producer, registers, self.kernel_layout)
        return _pipelined(*args)


def tuning_space() -> list[PersistentVariant]:
    """`TUNING`'s product at the default layout, the default first, the second design's
    (`PAIRED` with it) after it."""
    names = list(TUNING)
    product = [
        PersistentVariant(**dict(zip(names, values, strict=True)))
        for values in itertools.product(*TUNING.values())
    ]
    second = product[: len(EPILOGUES) * 2]
    paired = [dataclasses.replace(v, layout=PAIRED) for v in (second[0], second[-1])]
    return [*second, *paired, *product[len(second) :]]


@functools.cache
def _with_units(plan: PersistentPlan, units: int, layout: str) -> PersistentPlan:
    replanned = plan_with_units(plan, units, layout)
    if replanned is None:
        raise PlanError(
            f"persistent variant units={units}: neither kernel runs {plan.row_blocks} row blocks "
            f"of {units} units for width {plan.width} ({plan.dtype})"
        )
    return replanned


@functools.cache
def _pipelined(
    plan: PersistentPlan, stages: int, shared: str, split_k: bool, producer: bool,
    registers: bool, layout: str,
) -> PersistentPlan:  # fmt: skip
    """``plan`` at ``stages`` (0: its own, in ``registers`` the deepest that fits) of the widest
    K chunk that fits; ``shared``: the multicast operand, "a" (A rows), "b" (weights) or ""."""
    what = f"persistent variant stages={stages}, shared={shared or 'none'}"
    what += ", producer" * producer
    what += ", epilogue=registers" * registers
    depths, chunks = [stages], [k for k in (K_CHUNK, K_CHUNK // 2, K_CHUNK // 4)]
    if not stages:
        depths, chunks = (range(8, 1, -1) if registers else [plan.stages]), [plan.k_chunk]
    error = None
    for depth, chunk in itertools.product(depths, [k for k in chunks if k <= plan.k_chunk]):
        try:
            replanned = dataclasses.replace(
                plan, stages=depth, k_chunk=chunk, multicast_a=shared == "a",
                multicast_b=shared == "b" and plan.row_blocks > 1, split_k=split_k,
                producer=producer, in_registers=registers,
            )  # fmt: skip
            check_runnable(replanned, layout)
            return replanned
        except PlanError as err:
            error = error or err
    raise PlanError(f"{what}: {error}") from None


def parse_variant(text: str) -> PersistentVariant:
    """``key=value,...`` (others at default; RECORDED texts as today's) or DEFAULT_TEXT -> the
    variant, else VariantError."""
    if not isinstance(text, str):
        raise VariantError(f"must be a string, got {type(text).__name__}")
    if text.strip() == DEFAULT_TEXT:
        return PersistentVariant()
    fields = [f.name for f in dataclasses.fields(PersistentVariant)]
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise VariantError(f"is empty; give {DEFAULT_TEXT!r} or key=value pairs")
    values = {}
    for item in items:
        key, sep, value = (x.strip() for x in item.partition("="))
        if (key, value.lower()) in RECORDED:
            if RECORDED[key, value.lower()] is None:
                continue
            key, value = RECORDED[key, value.lower()]
        if key in REMOVED:
            raise VariantError(f"{key} was removed: {REMOVED[key]}")
        if key not in fields or not sep:
            raise VariantError(f"{item!r} is not key=value with key one of {', '.join(fields)}")
        if key in values:
            raise VariantError(f"gives {key} twice: keep one {key}=...")
        words = ("layout", "sharing", "epilogue")
        values[key] = value if key in words else _whole_number(key, value)
    return PersistentVariant(**values)


def from_fields(fields) -> PersistentVariant:
    """``model.persistent``'s fields (a former ``k_chunk=0`` dropped) -> the variant, or
    VariantError."""
    known = {f.name for f in dataclasses.fields(PersistentVariant)}
    fields = {k: v for k, v in dict(fields).items() if (k, v) != ("k_chunk", 0)}
    unknown = sorted(set(fields) - known)
    if unknown:
        why = REMOVED.get(unknown[0])
        why = f"was removed: {why}" if why else f"is not one of {', '.join(sorted(known))}"
        raise VariantError(f"field {unknown[0]!r} {why}")
    return PersistentVariant(**dict(fields))


def _whole_number(key: str, value: str) -> int:
    if value.isdigit():
        return int(value)
    raise VariantError(f"{key}={value!r} is not a whole number >= 0 (digits only)")
