"""Memory, known before it is spent: the peak of training and of every evaluation protocol,
estimated from the config's shapes before anything is compiled, checked against what is free,
and an out-of-memory that still happens turned into one line.

    need = memory.training(model, n_params, batch=256, seq_len=100, optimizer="adam")
    memory.check([need, *memory.evaluations(...)], memory.free_memory())   # MemoryCheckError

The estimate (``Need``) is activations per ``[batch, time]`` element (floats per element, by
model type, from the widths: the coefficients below), plus the parameters and what the step
keeps beside them (gradients, optimizer moments), plus a fixed allowance for the runtime.
The training coefficients were fitted to XLA's own buffer assignment of the compiled steps,
the evaluation ones to measured peaks (CPU backend, ``scan``, jax 0.10.2, 2026-11-25; the
RHN ones refitted 2026-11-26), and rounded up. ``benchmarks/memory_peaks.py`` measures the
real peak (the process's resident set, ``VmHWM``) of a training step and an evaluation for
a set of configs;
``results/memory_cpu.json`` holds the ratios: 1.03-1.27 for every config whose peak is above
100 MB, and tests/test_memory.py checks one. The other implementations keep the states of the
whole sequence (``[T, L, batch, n]``): their coefficient is larger, and unmeasured.
Evaluation never spans more than ``rhhjax.data.MAX_CHUNK`` time steps per batch, with at most
two batches in flight.

On the CPU backend device memory is host memory: one budget. On a GPU the device's free memory
(``memory_stats``) bounds the step and the host's the batches built on the host. Compiling
takes memory of its own (``COMPILE_BYTES``), freed before the step runs.
"""

from __future__ import annotations

import dataclasses
import resource
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from rhhjax.errors import UserError

if TYPE_CHECKING:  # no jax import at run time: the programs check before importing it
    from rhhjax.models import ModelConfig

FLOAT = 4  # bytes: the estimate counts float32 (bfloat16 halves some of it: a bound)
RUNTIME_BYTES = 16 * 2**20  # the runtime's buffers beside a step, allocator noise (1-10 MB each)
# Compiling a step takes memory of its own, freed before the step runs (measured on the CPU:
# 150-320 MB whatever the widths): a run needs at least this much free.
COMPILE_BYTES = 384 * 2**20
HOST_BYTES_PER_EVAL_ELEMENT = 48  # numpy index, mask and token arrays of one eval batch
OPTIMIZER_SLOTS = {"adam": 2, "sgd": 0}  # moments per parameter

# Floats per [batch, time] element of a training step (forward residuals and the backward's
# temporaries), by model type: {width term: coefficient}. "Ln": depth (LSTM: layers) x hidden;
# "n": hidden; "Lh" / "h": the hypernetwork's; "V": vocabulary; "E": embedding.
TRAIN_FLOATS = {
    "hyperrhn": {"Ln": 13.0, "n": 6.0, "Lh": 2.0, "h": 23.0, "V": 2.6, "E": 2.1},
    "rhn": {"Ln": 8.1, "n": 6.0, "V": 2.6, "E": 2.1},
    "lstm": {"Ln": 18.7, "n": 10.0, "V": 2.6, "E": 2.1},
}
# ... of an evaluation batch (forward only: the scan keeps its outputs, not its residuals;
# depth hardly matters). Fitted to the measured peaks, two batches in flight (refitted
# 2026-11-26 after the RHN cores project the input time-major: 40% lower peaks).
EVAL_FLOATS = {
    "hyperrhn": {"n": 3.5, "h": 2.0, "V": 1.0, "E": 0.5},
    "rhn": {"n": 3.5, "V": 1.0, "E": 0.5},
    "lstm": {"n": 11.0, "V": 1.0, "E": 0.5},
}
# Whole-sequence implementations (fused, pallas, mosaic, persistent) keep every state
# [T, L, B, n] of a batch (and, training, the gates): these floats per L x n more.
OP_EXTRA_LN = {"train": 2.0, "eval": 2.5}


class MemoryCheckError(UserError):
    """A config whose estimated peak memory exceeds what is free; one line."""


class OutOfMemoryError(UserError):
    """An out-of-memory at run time (host or device), as one line."""


@dataclasses.dataclass(frozen=True)
class Need:
    """The estimated peak of one computation: ``device`` bytes (the step's buffers) and
    ``host`` bytes (numpy batches beside it); ``what`` and ``fields`` say what it is and
    which fields size it (the first one is the one to lower)."""

    what: str
    device: int
    host: int
    fields: tuple[str, ...]
    shape: str  # e.g. "train.batch_size=256 x train.seq_len=100"


@dataclasses.dataclass(frozen=True)
class Free:
    """Free memory: ``host`` bytes; ``device`` bytes of one accelerator, or None on the CPU
    backend (its memory is the host's)."""

    host: int
    device: int | None = None
    host_source: str = "MemAvailable"


def _widths(model: ModelConfig) -> dict[str, float]:
    """The width terms of ``TRAIN_FLOATS`` for a ``ModelConfig``."""
    layers = model.lstm_layers if model.type == "lstm" else model.depth
    return {
        "Ln": layers * model.hidden,
        "n": model.hidden,
        "Lh": layers * model.hyper_hidden,
        "h": model.hyper_hidden,
        "V": model.vocab_size,
        "E": model.embed_dim,
    }


def floats_per_element(model: ModelConfig, kind: str, impl: str = "scan") -> float:
    """Floats per ``[batch, time]`` element of a training step (``kind="train"``) or an
    evaluation batch (``"eval"``) of ``model`` run with ``impl``."""
    table = (TRAIN_FLOATS if kind == "train" else EVAL_FLOATS)[model.type]
    widths = _widths(model)
    floats = sum(coef * widths[term] for term, coef in table.items())
    if impl != "scan":
        floats += OP_EXTRA_LN[kind] * widths["Ln"]
    return floats


def training(
    model: ModelConfig,
    n_params: int,
    batch: int,
    seq_len: int,
    optimizer: str = "adam",
    impl: str = "scan",
    n_devices: int = 1,
) -> Need:
    """The peak of one training step on one device: activations of ``[batch / n_devices,
    seq_len]``, the parameters with their gradients, updates and optimizer moments."""
    per_device = max(batch // max(n_devices, 1), 1)
    activations = FLOAT * floats_per_element(model, "train", impl) * per_device * seq_len
    copies = 3 + OPTIMIZER_SLOTS.get(optimizer, 2)  # params, gradients, updates, moments
    device = int(activations + FLOAT * n_params * copies + RUNTIME_BYTES)
    host = int(8 * batch * (seq_len + 1))  # the sampler's window indices and tokens
    return Need(
        "training",
        device,
        host,
        ("train.batch_size", "train.seq_len"),
        f"train.batch_size={batch} x train.seq_len={seq_len}",
    )


def evaluation(
    model: ModelConfig,
    n_params: int,
    batch: int,
    steps: int,
    protocol: str,
    impl: str = "scan",
    n_devices: int = 1,
    batch_field: str = "eval.batch_size",
) -> Need:
    """The peak of one evaluation batch of ``[batch, steps]`` under ``protocol`` (``steps``:
    the batch's time steps, ``rhhjax.data`` caps them at ``MAX_CHUNK``)."""
    per_device = max(batch // max(n_devices, 1), 1)
    activations = FLOAT * floats_per_element(model, "eval", impl) * per_device * steps
    device = int(activations + FLOAT * n_params + RUNTIME_BYTES)
    host = int(HOST_BYTES_PER_EVAL_ELEMENT * batch * steps)
    return Need(
        f"evaluation ({protocol} protocol)",
        device,
        host,
        (batch_field,),
        f"{batch_field}={batch} x {steps} time steps",
    )


def eval_steps(protocol: str, seq_len: int) -> int:
    """Time steps of one evaluation batch: 100 for ``paper``, else ``seq_len`` capped at
    ``MAX_CHUNK``."""
    from rhhjax import data as data_lib

    if protocol == "paper":
        return data_lib.PAPER_SEQ_LEN
    return min(int(seq_len), data_lib.MAX_CHUNK)


def evaluations(
    model: ModelConfig,
    n_params: int,
    batch: int,
    seq_len: int,
    protocols: Iterable[str],
    impl: str = "scan",
    n_devices: int = 1,
    batch_field: str = "eval.batch_size",
) -> list[Need]:
    """``evaluation`` of every protocol in ``protocols`` (each once)."""
    return [
        evaluation(model, n_params, batch, eval_steps(p, seq_len), p, impl, n_devices, batch_field)
        for p in dict.fromkeys(protocols)
    ]


# ----------------------------------------------------------------------------- what is free


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _cgroup_free() -> int | None:
    """memory.max - memory.current of this process's cgroup (v2), when it is limited."""
    try:
        limit = open("/sys/fs/cgroup/memory.max").read().strip()
        if limit == "max":
            return None
        return int(limit) - int(open("/sys/fs/cgroup/memory.current").read())
    except (OSError, ValueError):
        return None


def _address_space_free() -> int | None:
    """RLIMIT_AS (``ulimit -v``) less the process's address space now, when limited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/status") as f:
            size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    except (OSError, StopIteration):
        return None
    return soft - size


def host_free() -> tuple[int, str]:
    """(free host bytes, where the bound comes from): the least of MemAvailable, the cgroup's
    limit and ``ulimit -v``."""
    candidates = [
        (_meminfo_available(), "MemAvailable"),
        (_cgroup_free(), "the cgroup's memory.max"),
        (_address_space_free(), "ulimit -v"),
    ]
    known = [(max(value, 0), name) for value, name in candidates if value is not None]
    if not known:
        return (2**62, "unknown")
    return min(known)


def device_free(device: object | None = None) -> int | None:
    """Free bytes of an accelerator (``memory_stats``: limit less in use); None on the CPU
    backend or when the device does not say."""
    import jax

    device = device or jax.local_devices()[0]
    if device.platform == "cpu":
        return None
    try:
        stats = device.memory_stats() or {}
    except Exception:  # noqa: BLE001 -- a backend without memory statistics
        return None
    if "bytes_limit" not in stats:
        return None
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))


def free_memory() -> Free:
    """What is free now, host and device."""
    host, source = host_free()
    return Free(host, device_free(), source)


# ----------------------------------------------------------------------------- the check


def size(n: float) -> str:
    """Bytes for people: "512 kB", "61.2 MB", "3.1 GB", "3.2 TB"."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n / 1e3:,.0f} kB"


def _problem(need: Need, free: Free) -> str | None:
    """The refusal line of one estimate, or None when it fits."""
    if free.device is None:  # CPU backend: the step's buffers are host memory
        where, needed, available = "host memory", need.device + need.host, free.host
        source = f" ({free.host_source})"
    elif max(need.device, COMPILE_BYTES) > free.device:
        where, needed, available, source = "device memory", need.device, free.device, ""
    else:
        where, needed, available = "host memory", need.host, free.host
        source = f" ({free.host_source})"
    if max(needed, COMPILE_BYTES) <= available:
        return None
    lower = need.fields[0] + (f" (or {need.fields[1]})" if len(need.fields) > 1 else "")
    return (
        f"{need.what} needs about {size(needed)} of {where} ({need.shape}), "
        f"{size(available)} is free{source}: lower {lower}"
    )


def check(needs: Sequence[Need], free: Free, hint: str = "") -> None:
    """MemoryCheckError (one line) for the first estimate that does not fit in ``free``;
    ``hint`` ends the line (e.g. how to run anyway)."""
    for need in needs:
        problem = _problem(need, free)
        if problem:
            raise MemoryCheckError(f"{problem}{'; ' + hint if hint else ''}")


# ----------------------------------------------------------------------------- at run time


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an out-of-memory: numpy's (``MemoryError``) or XLA's
    (``RESOURCE_EXHAUSTED``, "Out of memory")."""
    if isinstance(error, MemoryError):
        return True
    text = str(error)
    return type(error).__name__ in ("XlaRuntimeError", "JaxRuntimeError") and (
        "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or "out of memory" in text
    )


def out_of_memory_line(error: BaseException, during: str, fields: Sequence[str], kept: str) -> str:
    """One line for an out-of-memory ``during`` something: what failed (its first line), what
    is kept, and which field to lower."""
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    lower = fields[0] + (f" (or {fields[1]})" if len(fields) > 1 else "")
    reason = f"{type(error).__name__}: {first}"[:240].rstrip(".")
    return f"out of memory during {during} ({reason}); {kept}; lower {lower}"
