"""Peak memory of training and of each evaluation protocol, estimated from the config's
shapes before compiling, checked against what is free (``check``), and out-of-memory errors
as one line. The model and its fit: docs/operations.md ("Memory")."""

from __future__ import annotations

import dataclasses
import resource
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from rhhjax.errors import UserError

if TYPE_CHECKING:
    from rhhjax.models import ModelConfig

FLOAT = 4  # bytes: float32 (an upper bound for bfloat16)
RUNTIME_BYTES = 16 * 2**20
# compiling a step takes memory of its own (results/memory_cpu.json)
COMPILE_BYTES = 384 * 2**20
HOST_BYTES_PER_EVAL_ELEMENT = 48
OPTIMIZER_SLOTS = {"adam": 2, "sgd": 0}

# floats per [batch, time] element of a training step: {width term ("Ln", "n", ...): coef}
TRAIN_FLOATS = {
    "hyperrhn": {"Ln": 13.0, "n": 6.0, "Lh": 2.0, "h": 23.0, "V": 2.6, "E": 2.1},
    "rhn": {"Ln": 8.1, "n": 6.0, "V": 2.6, "E": 2.1},
    "lstm": {"Ln": 18.7, "n": 10.0, "V": 2.6, "E": 2.1},
}
EVAL_FLOATS = {
    "hyperrhn": {"n": 3.5, "h": 2.0, "V": 1.0, "E": 0.5},
    "rhn": {"n": 3.5, "V": 1.0, "E": 0.5},
    "lstm": {"n": 11.0, "V": 1.0, "E": 0.5},
}
# whole-sequence implementations keep every state [T, L, B, n]: these floats per L x n more
OP_EXTRA_LN = {"train": 2.0, "eval": 2.5}


class MemoryCheckError(UserError):
    """A config whose estimated peak memory exceeds what is free; one line."""


class OutOfMemoryError(UserError):
    """An out-of-memory at run time (host or device), as one line."""


@dataclasses.dataclass(frozen=True)
class Need:
    """The estimated peak of one computation in bytes; ``fields[0]`` is the one to lower."""

    what: str
    device: int
    host: int
    fields: tuple[str, ...]
    shape: str


@dataclasses.dataclass(frozen=True)
class Free:
    host: int
    device: int | None = None
    host_source: str = "MemAvailable"


def _widths(model: ModelConfig) -> dict[str, float]:
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
    """Floats per ``[batch, time]`` element of a ``"train"`` step or an ``"eval"`` batch."""
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
    """The peak of one training step on one device, optimizer state included."""
    per_device = max(batch // max(n_devices, 1), 1)
    activations = FLOAT * floats_per_element(model, "train", impl) * per_device * seq_len
    copies = 3 + OPTIMIZER_SLOTS.get(optimizer, 2)
    device = int(activations + FLOAT * n_params * copies + RUNTIME_BYTES)
    host = int(8 * batch * (seq_len + 1))
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
    """The peak of one evaluation batch of ``[batch, steps]`` under ``protocol``."""
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
    """Time steps of one evaluation batch (``paper``: 100; else capped at ``MAX_CHUNK``)."""
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
    return [
        evaluation(model, n_params, batch, eval_steps(p, seq_len), p, impl, n_devices, batch_field)
        for p in dict.fromkeys(protocols)
    ]


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
    try:
        limit = open("/sys/fs/cgroup/memory.max").read().strip()
        if limit == "max":
            return None
        return int(limit) - int(open("/sys/fs/cgroup/memory.current").read())
    except (OSError, ValueError):
        return None


def _address_space_free() -> int | None:
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
    """(free host bytes, its source): the least of MemAvailable, cgroup and ``ulimit -v``."""
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
    """Free bytes of an accelerator (``memory_stats``); None on the CPU or when unknown."""
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
    host, source = host_free()
    return Free(host, device_free(), source)


def size(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n / 1e3:,.0f} kB"


def _budget(need: Need, free: Free) -> tuple[str, int, int, str]:
    """(where, estimate, free, source) of the budget that bounds ``need``."""
    host_source = f" ({free.host_source})"
    if free.device is None:
        return "host memory", need.device + need.host, free.host, host_source
    if need.device + COMPILE_BYTES > free.device:
        return "device memory", need.device, free.device, ""
    return "host memory", need.host, free.host, host_source


def _problem(need: Need, free: Free) -> str | None:
    where, needed, available, source = _budget(need, free)
    if needed + COMPILE_BYTES <= available:
        return None
    lower = need.fields[0] + (f" (or {need.fields[1]})" if len(need.fields) > 1 else "")
    return (
        f"{need.what} needs about {size(needed)} + {size(COMPILE_BYTES)} to compile of {where} "
        f"({need.shape}), {size(available)} is free{source}: lower {lower}"
    )


def estimate_line(needs: Sequence[Need], free: Free) -> str:
    budgets = [(_budget(need, free), need) for need in needs]
    (where, needed, available, source), need = max(
        budgets, key=lambda b: (b[0][1] + COMPILE_BYTES) / max(b[0][2], 1)
    )
    return (
        f"memory: {need.what} needs about {size(needed)} + {size(COMPILE_BYTES)} to compile of "
        f"{where} ({need.shape}), {size(available)} is free{source}"
    )


def check(needs: Sequence[Need], free: Free, hint: str = "") -> None:
    """MemoryCheckError for the first estimate that does not fit; ``hint`` ends the line."""
    for need in needs:
        problem = _problem(need, free)
        if problem:
            raise MemoryCheckError(f"{problem}{'; ' + hint if hint else ''}")


def is_out_of_memory(error: BaseException) -> bool:
    if isinstance(error, MemoryError):
        return True
    text = str(error)
    return type(error).__name__ in ("XlaRuntimeError", "JaxRuntimeError") and (
        "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or "out of memory" in text
    )


def out_of_memory_line(error: BaseException, during: str, fields: Sequence[str], kept: str) -> str:
    """One line for an out-of-memory: what failed, what is kept, which field to lower."""
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    lower = fields[0] + (f" (or {fields[1]})" if len(fields) > 1 else "")
    reason = f"{type(error).__name__}: {first}"[:240].rstrip(".")
    return f"out of memory during {during} ({reason}); {kept}; lower {lower}"
