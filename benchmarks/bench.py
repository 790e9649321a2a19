"""Training-step benchmark: impl x model x size x dtype, in one run.

    python benchmarks/bench.py --out=bench.json
    python benchmarks/bench.py --sizes=small --impls=scan,fused --repeats=5

Each row times the training step of ``train.py`` (``rhhjax.train.step``: forward, backward,
L1-norm clipping, Adam update; gate dropout on)
after compilation and a warm-up step: the median of `--repeats` steps. It also measures
the rate of a large matmul on the same device and dtype, and reports
efficiency = flops_per_step / (step time x matmul rate), where flops_per_step counts the
matmul FLOPs of forward + backward (3x the forward matmuls).

On CPU, `pallas` runs in Pallas interpret mode, so it is only measured at the small size,
and only to show it runs: interpret-mode timings say nothing about GPU speed.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from absl import app, flags

from rhhjax import configs, models
from rhhjax.train.optim import OptimizerConfig
from rhhjax.train.step import make_train_step, step_inputs

SIZES = {
    # name: (hidden, hyper_hidden, depth, batch, seq_len)
    "paper": (1000, 128, 7, 256, 100),
    "small": (256, 64, 3, 64, 50),
}
VOCAB, EMBED = 50, 27


def _define_flags() -> None:
    """Command-line flags (defined only when run as a program, so others can import us)."""
    flags.DEFINE_string("out", "", "Write the rows as JSON to this file.")
    flags.DEFINE_list("impls", ["scan", "fused", "pallas"], "Implementations.")
    flags.DEFINE_list("models", ["rhn", "hyperrhn"], "Model types.")
    flags.DEFINE_list("sizes", ["paper", "small"], f"Sizes: {', '.join(SIZES)}.")
    flags.DEFINE_list("dtypes", ["float32", "bfloat16"], "Matmul input dtypes.")
    flags.DEFINE_integer("repeats", 3, "Timed steps per row (median reported).")


@dataclasses.dataclass
class Row:
    impl: str
    model: str
    size: str
    dtype: str
    device: str
    step_ms_median: float
    step_ms_min: float
    flops_per_step: float
    matmul_tflops: float
    efficiency: float
    compile_s: float


def model_config(model: str, size: str, impl: str, dtype: str) -> models.ModelConfig:
    """The benchmarked model: paper hyper-parameters at `size`."""
    hidden, hyper, depth, _, _ = SIZES[size]
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
    )


def flops_per_step(config: models.ModelConfig, batch: int, length: int) -> float:
    """Matmul FLOPs of one training step (forward x 3), counted from the shapes."""
    n, h, depth = config.hidden, config.hyper_hidden, config.depth
    per_token = 2 * config.embed_dim * 2 * n + depth * 2 * n * 2 * n + 2 * n * config.vocab_size
    if config.type == "hyperrhn":
        per_token += 2 * config.embed_dim * 2 * h + depth * (2 * h * 2 * h + 2 * h * n)
    return 3.0 * per_token * batch * length


def matmul_rate(dtype: str, size: int = 2048, repeats: int = 5) -> float:
    """Measured FLOP/s of a [size, size] x [size, size] matmul (f32 accumulation)."""
    key = jax.random.key(0)
    a = jax.random.normal(key, (size, size), models.DTYPES[dtype])
    b = jax.random.normal(jax.random.fold_in(key, 1), (size, size), models.DTYPES[dtype])
    f = jax.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32))
    f(a, b).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        f(a, b).block_until_ready()
        times.append(time.perf_counter() - start)
    return 2.0 * size**3 / statistics.median(times)


def paper_optimizer() -> OptimizerConfig:
    """The paper recipe's optimizer (configs/ptb.py: Adam 1e-3, L1-norm clipping at 10)."""
    return OptimizerConfig.from_config(configs.load("ptb").train, batches_per_epoch=1)


def time_step(config: models.ModelConfig, batch: int, length: int, repeats: int):
    """(compile seconds, [seconds of each timed step]) of the training step ``train.py`` runs
    (``rhhjax.train.step``: forward, backward, clipping, Adam) on random tokens; the first call
    compiles and warms up, the next ``repeats`` are timed."""
    oc = paper_optimizer()
    step = make_train_step(config, oc, 0)
    args = list(step_inputs(config, oc, batch, length))
    times = []
    for i in range(repeats + 1):
        args[6] = jnp.asarray(i, jnp.int32)  # the step index seeds the dropout masks
        start = time.perf_counter()
        out = step(*args)
        out[3].block_until_ready()
        times.append(time.perf_counter() - start)
        args[:3] = out[:3]  # params, opt_state, carry were donated
    return times[0], times[1:]


def time_row(impl: str, model: str, size: str, dtype: str, repeats: int, rate: float) -> Row:
    """Compiles, warms up and times one configuration."""
    config = model_config(model, size, impl, dtype)
    _, _, _, batch, length = SIZES[size]
    compile_s, times = time_step(config, batch, length, repeats)
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
        efficiency=flops / (median * rate),
        compile_s=compile_s,
    )


def device_name() -> str:
    device = jax.devices()[0]
    return f"{device.platform}:{getattr(device, 'device_kind', '?')}"


def plan(impls, model_types, sizes, dtypes) -> list[tuple[str, str, str, str]]:
    """The rows to run; pallas on CPU only at the small size (interpret mode)."""
    on_gpu = jax.default_backend() == "gpu"
    rows = []
    for size in sizes:
        for dtype in dtypes:
            for model in model_types:
                for impl in impls:
                    if impl == "pallas" and not on_gpu and size != "small":
                        continue
                    rows.append((impl, model, size, dtype))
    return rows


def format_table(rows: Sequence[Row]) -> str:
    header = f"{'impl':<7}{'model':<10}{'size':<7}{'dtype':<10}{'step ms':>10}{'GFLOP':>9}"
    header += f"{'mm TFLOP/s':>12}{'eff':>7}"
    lines = [header]
    for r in rows:
        lines.append(
            f"{r.impl:<7}{r.model:<10}{r.size:<7}{r.dtype:<10}{r.step_ms_median:>10.1f}"
            f"{r.flops_per_step / 1e9:>9.1f}{r.matmul_tflops:>12.3f}{r.efficiency:>7.2f}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    f = flags.FLAGS
    unknown = [s for s in f.sizes if s not in SIZES]
    unknown += [i for i in f.impls if i not in models.IMPLS]
    unknown += [d for d in f.dtypes if d not in ("float32", "bfloat16")]
    unknown += [m for m in f.models if m not in ("rhn", "hyperrhn")]
    if unknown:
        raise SystemExit(f"error: unknown benchmark choice(s): {', '.join(unknown)}")
    rates = {dtype: matmul_rate(dtype) for dtype in f.dtypes}
    rows, failed = [], []
    for impl, model, size, dtype in plan(f.impls, f.models, f.sizes, f.dtypes):
        try:
            row = time_row(impl, model, size, dtype, f.repeats, rates[dtype])
        except Exception as e:  # one failing row (e.g. a kernel that does not compile)
            error = f"{type(e).__name__}: {' '.join(str(e).split())[:2000]}"
            failed.append(dict(impl=impl, model=model, size=size, dtype=dtype, error=error))
            print(f"{impl} {model} {size} {dtype} FAILED: {failed[-1]['error'][:300]}", flush=True)
        else:
            rows.append(row)
            print(format_table([row]).splitlines()[1], flush=True)
        if f.out:  # after every row, so a command cut at its time limit keeps what it measured
            write_record(f.out, rows, failed)
    print(format_table(rows))
    if failed:
        raise SystemExit(f"error: {len(failed)} row(s) failed")


def write_record(path: str, rows: Sequence[Row], failed: Sequence[dict]) -> None:
    """The rows (and failed rows) as JSON, with the command, date, JAX version and device."""
    record = {
        "command": "python benchmarks/bench.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "jax": jax.__version__,
        "device": device_name(),
        "rows": [dataclasses.asdict(r) for r in rows],
        "failed": list(failed),
    }
    with open(path, "w") as out:
        json.dump(record, out, indent=1)


if __name__ == "__main__":
    _define_flags()
    app.run(main)
