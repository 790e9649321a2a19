"""`impl=auto` on one GPU: the training step timed under `fused` and the `persistent` variants,
once per device, model shape and dtype; the fastest that agrees with the first is cached in
``$RHHJAX_CACHE/autotune.json``. docs/persistent_design.md ("Autotuning the variant")."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp

from rhhjax import models
from rhhjax.data.cache import atomic_write, cache_root
from rhhjax.errors import UserError
from rhhjax.models.config import model_facts
from rhhjax.ops import persistent, spec
from rhhjax.train import step as step_lib
from rhhjax.train.optim import OptimizerConfig

CACHE_FILE = "autotune.json"
REPEATS = 5
# |candidate - first| / |first| of the loss and of the gradient norm: a broken kernel, not rounding
TOLERANCE = {"float32": 1e-2, "bfloat16": 5e-2}


@dataclasses.dataclass(frozen=True)
class Candidate:
    impl: str
    variant: str = persistent.DEFAULT_TEXT  # `persistent.parse_variant`'s text

    def label(self) -> str:
        return self.impl if self.impl != persistent.NAME else f"{self.impl}[{self.variant}]"

    def applied(self, mc: models.ModelConfig) -> models.ModelConfig:
        variant = persistent.parse_variant(self.variant)
        return dataclasses.replace(mc, impl=self.impl, persistent=variant)


@dataclasses.dataclass
class Row:
    """One candidate's outcome: ok | mismatch | failed | skipped."""

    label: str
    impl: str
    variant: str
    status: str = "ok"
    step_ms: float | None = None
    loss: float | None = None
    grad_norm: float | None = None
    seconds: float = 0.0
    error: str = ""


@dataclasses.dataclass(frozen=True)
class Choice:
    impl: str
    variant: str
    line: str  # what the trainer prints


def cache_path() -> Path:
    return cache_root() / CACHE_FILE


def cache_key(mc: models.ModelConfig, batch: int, length: int, device: str) -> str:
    """Device, jax release, what was asked for, the model's shape and dtype, and the batch."""
    shape = f"{mc.type} n{mc.hidden} h{mc.hyper_hidden} L{mc.depth} r{mc.hyper_rank}"
    model = f"{shape} {mc.dropout} keep{mc.keep} {jnp.dtype(mc.compute_dtype).name}"
    return f"{device} | jax {jax.__version__} | impl {mc.impl} | {model} | {batch} x {length}"


def candidates(mc: models.ModelConfig, batch: int, platform: str = "gpu") -> list[Candidate]:
    """`auto`'s measured pick first, then every `persistent` variant of the tuning space that
    runs ``mc`` and has passed its tests on a GPU."""
    first = models.sequence_spec(dataclasses.replace(mc, impl=spec.AUTO), platform).impl
    found = [Candidate(first)]
    facts = model_facts(mc)
    if spec.unsupported(persistent.NAME, facts) or spec.substitute(persistent.NAME, facts):
        return found
    hyper = mc.hyper_hidden if mc.type == "hyperrhn" else 0
    dtype = jnp.dtype(mc.compute_dtype).name
    variants = persistent.variant_candidates(batch, mc.hidden, hyper, dtype)
    tested = [v for v in variants if v.tested_on_a_gpu()]
    return found + [Candidate(persistent.NAME, v.text()) for v in tested]


def measure(mc: models.ModelConfig, oc: OptimizerConfig, args: tuple, repeats: int = REPEATS):
    """(step seconds [repeats], loss, grad norm) of the training step on copies of ``args``."""
    train_step = step_lib.make_train_step(mc, oc, 0)
    args = list(jax.tree.map(lambda x: x.copy(), args))
    compiled = train_step.lower(*args).compile()
    _, outs = step_lib.timed_call(compiled, args)
    times = [step_lib.timed_call(compiled, args)[0] for _ in range(repeats)]
    return times, float(outs[3]), float(outs[4])


def _disagrees(row: Row, first: Row, dtype: str) -> str:
    for name in ("loss", "grad_norm"):
        a, b = getattr(row, name), getattr(first, name)
        if not math.isfinite(a) or abs(a - b) > TOLERANCE[dtype] * abs(b):
            return f"{name} {a:.6g} against {first.label}'s {b:.6g}"
    return ""


def time_candidates(
    mc: models.ModelConfig, oc: OptimizerConfig, batch: int, length: int, found: list,
    budget_s: float, measure_fn: Callable = measure, clock: Callable = time.perf_counter,
) -> list[Row]:  # fmt: skip
    """A row per candidate in order; one is started only while the budget holds the
    slowest candidate so far. Rows that disagree with the first ok row are `mismatch`."""
    start = clock()
    args = step_lib.step_inputs(found[0].applied(mc), oc, batch, length)  # the same params
    dtype, slowest, first = jnp.dtype(mc.compute_dtype).name, 0.0, None
    rows = [Row(c.label(), c.impl, c.variant) for c in found]
    for candidate, row in zip(found, rows, strict=True):
        began = clock()
        if began - start + slowest > budget_s:
            row.status, row.error = "skipped", f"the budget of {budget_s:g} s was spent"
            continue
        try:
            times, row.loss, row.grad_norm = measure_fn(candidate.applied(mc), oc, args)
        except Exception as e:  # noqa: BLE001 (a failing candidate is a row)
            row.status, row.error = "failed", f"{type(e).__name__}: {' '.join(str(e).split())}"
        else:
            row.step_ms = 1e3 * statistics.median(times)
            row.error = _disagrees(row, first, dtype) if first else ""
            row.status = "mismatch" if row.error else "ok"
            first = first or row
        row.seconds = clock() - began
        slowest = max(slowest, row.seconds)
    return rows


def _winner(rows: list[Row]) -> Row | None:
    timed = [r for r in rows if r.status == "ok"]
    return min(timed, key=lambda r: r.step_ms) if timed else None


def _read(path: Path) -> dict:
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):  # none yet, or damaged: timed again and rewritten
        return {}
    return entries if isinstance(entries, dict) else {}


def _write(path: Path, entries: dict) -> str:
    """``entries`` written atomically (`rhhjax.data.cache.atomic_write`); where, in a few words."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(entries, indent=1).encode())
    except OSError as error:
        return f"not cached: {error}"
    return f"cached in {path}"


def _cached_choice(entry) -> Choice | None:
    try:
        impl, variant = entry["impl"], entry["variant"]
        if impl not in spec.IMPLS:
            return None
        persistent.parse_variant(variant)
        return Choice(impl, variant, f"autotune: {entry['line']} (cached)")
    except (KeyError, TypeError, UserError):
        return None


def choose(
    mc: models.ModelConfig, oc: OptimizerConfig, batch: int, length: int, budget_s: float,
    platform: str = "gpu", path: Path | None = None, **timing,
) -> Choice:  # fmt: skip
    """The cached choice for this device and shape, else every candidate timed (`time_candidates`)
    and the winner cached; `auto`'s measured pick when no candidate ran."""
    path = path or cache_path()
    key = cache_key(mc, batch, length, jax.devices()[0].device_kind)
    entries = _read(path)
    cached = _cached_choice(entries.get(key))
    if cached is not None:
        return cached
    found = candidates(mc, batch, platform)
    rows = time_candidates(mc, oc, batch, length, found, budget_s, **timing)
    best = _winner(rows)
    if best is None:  # what was asked for, untimed
        line = "autotune: no candidate ran; " + _summary(rows)
        return Choice(found[0].impl, found[0].variant, line)
    line = f"the training step runs {best.label} at {best.step_ms:.2f} ms; {_summary(rows)}"
    rows_json = [dataclasses.asdict(r) for r in rows]
    entries[key] = dict(impl=best.impl, variant=best.variant, line=line, rows=rows_json)
    return Choice(best.impl, best.variant, f"autotune: {line} ({_write(path, entries)})")


def _summary(rows: list[Row]) -> str:
    timed = ", ".join(f"{r.label} {r.step_ms:.2f} ms" for r in rows if r.status == "ok")
    counts = {s: sum(r.status == s for r in rows) for s in ("mismatch", "failed", "skipped")}
    others = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    return f"timed {timed or 'none'}" + (f" ({others})" if others else "")


def off_reason(mc: models.ModelConfig, budget_s: float, devices: int, platform: str) -> str | None:
    """Why the trainer does not autotune ``mc`` (None: it does)."""
    if mc.impl != spec.AUTO:
        return f"model.impl={mc.impl!r} was asked for"
    if not budget_s:
        return "train.autotune_seconds=0"
    if platform != "gpu":
        return f"the platform is {platform}"
    if devices > 1:
        return f"{devices} devices (every process must run the same program)"
    return None
