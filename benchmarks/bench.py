"""Training-step benchmark: impl x model x rank x size x dtype, in one run.

    python benchmarks/bench.py --out=bench.json
    python benchmarks/bench.py --sizes=small --impls=scan,fused --repeats=5
    python benchmarks/bench.py --sizes=paper --models=hyperrhn --batch=512   # another batch
    python benchmarks/bench.py --parts=gemm --sizes=small --out=gemm.json

Parts (``--parts``):

* ``step``: the training step of ``train.py`` (``rhhjax.train.step``: forward, backward,
  L1-norm clipping, Adam update; gate dropout on) after compilation and a warm-up step: the
  median of ``--repeats`` steps, with the compiled step's memory
  (``compiled.memory_analysis()``). efficiency = flops_per_step / (step time x the GEMM
  rate of the ``square`` row), flops_per_step = the matmul FLOPs of forward + backward (3x
  the forward matmuls). ``hyperrhn`` rows run once per ``--ranks`` value (every impl the
  model config accepts: ``mosaic`` has no rank > 0).
* ``gemm``: the GEMM rate inside ONE jitted loop of ``--gemm_iters`` dependent GEMMs, at a
  large square and at the recurrence's own shapes (``benchmarks/gemm_rate.py``): microseconds
  per GEMM, TFLOP/s, and the launches per iteration XLA compiled.

`mosaic` and `persistent` compile Mosaic GPU kernels for a Hopper GPU: their rows need one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence

import gemm_rate
import jax
import jax.numpy as jnp
from absl import app, flags

from rhhjax import configs, models
from rhhjax.ops import persistent, spec
from rhhjax.train.optim import OptimizerConfig
from rhhjax.train.step import make_train_step, peak_bytes, step_inputs, timed_call

SIZES = {
    # name: (hidden, hyper_hidden, depth, batch, seq_len)
    "paper": (1000, 128, 7, 256, 100),
    "small": (256, 64, 3, 64, 50),
}
VOCAB, EMBED = 50, 27
PERSISTENT_VARIANT = persistent.DEFAULT_TEXT  # the persistent rows' variant (--persistent_variant)
PARTS = ("step", "gemm")


def _define_flags() -> None:
    """Command-line flags (defined only when run as a program, so others can import us)."""
    flags.DEFINE_string("out", "", "Write the rows as JSON to this file.")
    flags.DEFINE_list("impls", ["scan", "fused"], "Implementations.")
    flags.DEFINE_list("models", ["rhn", "hyperrhn"], "Model types.")
    flags.DEFINE_list("sizes", ["paper", "small"], f"Sizes: {', '.join(SIZES)}.")
    flags.DEFINE_list("dtypes", ["float32", "bfloat16"], "Matmul input dtypes.")
    flags.DEFINE_integer("repeats", 3, "Timed steps per row (median reported).")
    flags.DEFINE_list("parts", ["step"], f"What to measure: {', '.join(PARTS)}.")
    flags.DEFINE_list("ranks", ["0"], "hyper_rank values of the hyperrhn rows.")
    flags.DEFINE_integer("gemm_iters", 0, "GEMM loop iterations (0: 200 on GPU, 10 on CPU).")
    flags.DEFINE_integer("square", 0, "Square GEMM size (0: 8192 on GPU, 1024 on CPU).")
    flags.DEFINE_integer("seq_len", 0, "Sequence length of the step rows (0: the size's).")
    flags.DEFINE_integer("batch", 0, "Batch of the step and GEMM rows (0: the size's).")
    flags.DEFINE_string(
        "profile_dir",
        "",
        "Trace --profile_steps more steps of every step row here "
        "(jax.profiler; summarize with benchmarks/profile_summary.py).",
    )
    flags.DEFINE_integer("profile_steps", 2, "Steps traced per row with --profile_dir.")
    flags.DEFINE_string(
        "persistent_variant",
        persistent.DEFAULT_TEXT,
        "The persistent rows' model.persistent fields as text, e.g. layout=grid,stages=2.",
    )


@dataclasses.dataclass
class Row:
    """One training-step row."""

    impl: str
    model: str
    size: str
    dtype: str
    device: str
    step_ms_median: float
    step_ms_min: float
    flops_per_step: float
    matmul_tflops: float  # the square GEMM-loop rate (0 if not measured)
    efficiency: float
    compile_s: float
    hyper_rank: int = 0
    peak_bytes: int | None = None  # compiled.memory_analysis(): arguments + outputs + temps
    persistent_layout: str = ""  # the persistent rows' launch layout ("" for other impls)
    persistent_variant: str = ""  # their variant's text ("" for other impls)
    seq_len: int = 0  # the step's sequence length
    batch: int = 0  # the step's batch
    profile: str = ""  # the folder of its jax.profiler trace, if traced (or why it failed)


def model_config(model: str, size: str, impl: str, dtype: str, rank: int = 0) -> models.ModelConfig:
    """The benchmarked model: paper hyper-parameters at `size`."""
    hidden, hyper, depth, _, _ = SIZES[size]
    variant = PERSISTENT_VARIANT if impl == persistent.NAME else persistent.DEFAULT_TEXT
    return models.ModelConfig(
        type=model,
        vocab_size=VOCAB,
        embed_dim=EMBED,
        hidden=hidden,
        hyper_hidden=hyper,
        depth=depth,
        impl=impl,
        dtype=dtype,
        keep=0.65,
        hyper_rank=rank if model == "hyperrhn" else 0,
        persistent=persistent.parse_variant(variant),
    )


def persistent_row_facts(config: models.ModelConfig) -> dict:
    """The persistent fields of a row that ran ``config``: its variant's layout and text
    (empty for other impls)."""
    if config.impl != persistent.NAME:
        return {}
    variant = persistent.variant_of(models.sequence_spec(config, platform="gpu"))
    return dict(persistent_layout=variant.layout, persistent_variant=variant.text())


def flops_per_step(config: models.ModelConfig, batch: int, length: int) -> float:
    """Matmul FLOPs of one training step (forward x 3), counted from the shapes."""
    n, h, depth = config.hidden, config.hyper_hidden, config.depth
    per_token = 2 * config.embed_dim * 2 * n + depth * 2 * n * 2 * n + 2 * n * config.vocab_size
    if config.type == "hyperrhn":
        per_token += 2 * config.embed_dim * 2 * h + depth * (2 * h * 2 * h + 2 * h * n)
    return 3.0 * per_token * batch * length


def paper_optimizer() -> OptimizerConfig:
    """The paper recipe's optimizer (configs/ptb.py: Adam 1e-3, L1-norm clipping at 10)."""
    return OptimizerConfig.from_config(configs.load("ptb").train, batches_per_epoch=1)


def compile_step(config: models.ModelConfig, batch: int, length: int, stats=None):
    """(the training step compiled for its inputs' shapes, compile seconds); with a dict
    ``stats``, ``stats["peak_bytes"]`` gets its memory. Runs no kernel: the autotune compiles
    several at once, in threads."""
    oc = paper_optimizer()
    step = make_train_step(config, oc, 0)
    shapes = step_inputs(config, oc, batch, length, abstract=True)
    start = time.perf_counter()
    compiled = step.lower(*shapes).compile()
    compile_s = time.perf_counter() - start
    if stats is not None:
        mem = compiled.memory_analysis()
        stats["peak_bytes"] = None if mem is None else int(peak_bytes(mem))
    return compiled, compile_s


def step_arrays(config: models.ModelConfig, batch: int, length: int) -> list:
    """The inputs of a `compile_step` step on random tokens, initialised with `scan` (the
    same parameters for every impl, and no kernel run)."""
    return list(
        step_inputs(dataclasses.replace(config, impl="scan"), paper_optimizer(), batch, length)
    )


def time_compiled(
    compiled, args: list, repeats: int, stats=None, profile_dir: str = "", profile_steps: int = 2
) -> list[float]:
    """Seconds of each of ``repeats`` timed calls of a `compile_step` step, after one warm-up
    call; with ``profile_dir``, ``profile_steps`` more calls traced there."""
    times = []
    for i in range(repeats + 1):
        args[6] = jnp.asarray(i, jnp.int32)  # the step index seeds the dropout masks
        times.append(timed_call(compiled, args)[0])
    if profile_dir:  # a tracing failure (no profiler here) costs the trace, not the row
        try:
            with jax.profiler.trace(profile_dir):
                for _ in range(profile_steps):
                    timed_call(compiled, args)
        except Exception as e:  # noqa: BLE001
            if stats is not None:
                stats["profile_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return times[1:]


def time_step(
    config: models.ModelConfig, batch: int, length: int, repeats: int, stats=None,
    profile_dir: str = "", profile_steps: int = 2,
):  # fmt: skip
    """(compile seconds, [seconds of each timed step]) of the training step ``train.py`` runs
    (``rhhjax.train.step``: forward, backward, clipping, Adam) on random tokens: `compile_step`
    then `time_compiled`."""
    compiled, compile_s = compile_step(config, batch, length, stats)
    args = step_arrays(config, batch, length)
    return compile_s, time_compiled(compiled, args, repeats, stats, profile_dir, profile_steps)


def time_row(
    impl: str, model: str, size: str, dtype: str, repeats: int, rate: float, rank: int = 0,
    seq_len: int = 0, profile_dir: str = "", profile_steps: int = 2, batch: int = 0,
) -> Row:  # fmt: skip
    """Compiles, warms up and times one configuration (``rate``: the square GEMM FLOP/s;
    ``seq_len`` and ``batch``: the step's length and batch, 0 for the size's;
    ``profile_dir``: trace ``profile_steps`` more steps into a folder of it named after the
    row)."""
    config = model_config(model, size, impl, dtype, rank)
    _, _, _, size_batch, length = SIZES[size]
    length, batch = seq_len or length, batch or size_batch
    name = f"{impl}_{model}_r{rank}_{size}_{dtype}_B{batch}_T{length}"
    trace = f"{profile_dir}/{name}" if profile_dir else ""
    stats: dict = {}
    compile_s, times = time_step(config, batch, length, repeats, stats, trace, profile_steps)
    median = statistics.median(times)
    flops = flops_per_step(config, batch, length)
    return Row(
        impl=impl,
        model=model,
        size=size,
        dtype=dtype,
        device=device_name(),
        step_ms_median=1e3 * median,
        step_ms_min=1e3 * min(times),
        flops_per_step=flops,
        matmul_tflops=rate / 1e12,
        efficiency=flops / (median * rate) if rate else 0.0,
        compile_s=compile_s,
        hyper_rank=config.hyper_rank,
        peak_bytes=stats.get("peak_bytes"),
        seq_len=length,
        batch=batch,
        profile=stats.get("profile_error", trace),
        **persistent_row_facts(config),
    )


def on_gpu() -> bool:
    return jax.default_backend() == "gpu"


def device_name() -> str:
    device = jax.devices()[0]
    return f"{device.platform}:{getattr(device, 'device_kind', '?')}"


def supported(impl: str, model: str, rank: int) -> bool:
    """Whether the model config accepts the combination (mosaic has no hyper rank > 0)."""
    try:
        model_config(model, "small", impl, "float32", rank).validate()
    except models.ConfigError:
        return False
    return True


def plan(impls, model_types, sizes, dtypes, ranks=(0,)) -> list[tuple]:
    """(impl, model, size, dtype, rank) rows to run: hyperrhn once per rank, combinations the
    config rejects left out."""
    rows = []
    for size in sizes:
        for dtype in dtypes:
            for model in model_types:
                for rank in ranks if model == "hyperrhn" else (0,):
                    for impl in impls:
                        if supported(impl, model, rank):
                            rows.append((impl, model, size, dtype, rank))
    return rows


def format_table(rows: Sequence[Row]) -> str:
    header = f"{'impl':<7}{'model':<12}{'size':<7}{'batch':>6} {'dtype':<10}{'step ms':>10}"
    header += f"{'GFLOP':>9}"
    header += f"{'mm TFLOP/s':>12}{'eff':>7}{'peak GB':>9}"
    lines = [header]
    for r in rows:
        label = r.model + (f" r{r.hyper_rank}" if r.model == "hyperrhn" else "")
        peak = f"{r.peak_bytes / 1e9:.2f}" if r.peak_bytes else "?"
        lines.append(
            f"{r.impl:<7}{label:<12}{r.size:<7}{r.batch:>6} {r.dtype:<10}{r.step_ms_median:>10.1f}"
            f"{r.flops_per_step / 1e9:>9.1f}{r.matmul_tflops:>12.3f}{r.efficiency:>7.2f}"
            f"{peak:>9}"
        )
    return "\n".join(lines)


def validate_flags(f) -> None:
    """Exits with one line naming every unknown choice, before anything is compiled."""
    retired = [spec.retired(i) for i in f.impls if spec.retired(i)]
    if retired:
        raise SystemExit(f"error: {retired[0]}")
    unknown = [s for s in f.sizes if s not in SIZES]
    unknown += [i for i in f.impls if i not in models.IMPLS]
    unknown += [d for d in f.dtypes if d not in ("float32", "bfloat16")]
    unknown += [m for m in f.models if m not in ("rhn", "hyperrhn")]
    unknown += [p for p in f.parts if p not in PARTS]
    unknown += [r for r in f.ranks if not r.isdigit()]
    if unknown:
        raise SystemExit(f"error: unknown benchmark choice(s): {', '.join(unknown)}")
    if min(f.seq_len, f.batch) < 0 or f.profile_steps < 1:
        raise SystemExit("error: --seq_len and --batch must be >= 0, --profile_steps >= 1")
    try:
        persistent.parse_variant(f.persistent_variant)
    except persistent.VariantError as error:
        raise SystemExit(f"error: --persistent_variant={f.persistent_variant}: {error}") from None


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    f = flags.FLAGS
    validate_flags(f)
    global PERSISTENT_VARIANT
    PERSISTENT_VARIANT = f.persistent_variant
    ranks = sorted({int(r) for r in f.ranks})
    record = Record(f.out)
    square = f.square or (8192 if on_gpu() else 1024)
    iters = f.gemm_iters or (200 if on_gpu() else 10)
    rates: dict[str, float] = {}
    if "gemm" in f.parts or "step" in f.parts:
        for dtype in f.dtypes:
            hidden, hyper, _, batch, _ = SIZES[f.sizes[0]]
            for name, m, k, n in gemm_rate.gemm_shapes(hidden, hyper, f.batch or batch, square):
                if name != "square" and "gemm" not in f.parts:
                    continue
                args = (name, m, k, n, dtype, iters, max(f.repeats, 3), device_name())
                row = record.run("gemm", f"{name} {dtype}", gemm_rate.gemm_row, *args)
                if row and name == "square":
                    rates[dtype] = row["tflops"] * 1e12
                if row:
                    print(gemm_rate.format_gemm(row), flush=True)
    if "step" in f.parts:
        for impl, model, size, dtype, rank in plan(f.impls, f.models, f.sizes, f.dtypes, ranks):
            label = f"{impl} {model} r{rank} {size} {dtype}"
            args = (impl, model, size, dtype, f.repeats, rates.get(dtype, 0.0), rank)
            args += (f.seq_len, f.profile_dir, f.profile_steps, f.batch)
            row = record.run("rows", label, time_row, *args)
            if row:
                print(format_table([row]).splitlines()[1], flush=True)
        print(format_table(record.rows))
    if record.failed:
        raise SystemExit(f"error: {len(record.failed)} row(s) failed")


class Record:
    """The rows of every part, written to ``path`` after each row (so a command cut at its
    time limit keeps what it measured), with the command, date, JAX version and device."""

    def __init__(self, path: str):
        self.path = path
        self.rows: list[Row] = []
        self.gemm: list[dict] = []
        self.failed: list[dict] = []

    def run(self, part: str, label: str, fn, *args):
        """``fn(*args)`` appended to ``part``; an exception is recorded as a failed row."""
        try:
            row = fn(*args)
        except Exception as e:  # one failing row (e.g. a kernel that does not compile)
            error = f"{type(e).__name__}: {' '.join(str(e).split())[:2000]}"
            self.failed.append(dict(part=part, row=label, error=error))
            print(f"{part} {label} FAILED: {error[:300]}", flush=True)
            row = None
        else:
            {"rows": self.rows, "gemm": self.gemm}[part].append(row)
        self.write()
        return row

    def write(self) -> None:
        if not self.path:
            return
        record = {
            "command": "python benchmarks/bench.py " + " ".join(sys.argv[1:]),
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "jax": jax.__version__,
            "device": device_name(),
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "load_avg": os.getloadavg(),
            "rows": [dataclasses.asdict(r) for r in self.rows],
            "gemm_rows": self.gemm,
            "failed": self.failed,
        }
        with open(self.path, "w") as out:
            json.dump(record, out, indent=1)


if __name__ == "__main__":
    _define_flags()
    app.run(main)
