"""Memory and speed of the rank-d HyperRHN training step (Suarez 2017 section 4).

    python benchmarks/lowrank_bench.py --out=lowrank_bench.json
    python benchmarks/lowrank_bench.py --ranks=1,4 --modes=fused --time_size=none

Modes (how the rank-d scaled matmuls are differentiated; rank 0 is the paper's column
scaling and is measured with the plain `scan` and `fused` models as the baseline):

    scan-factored   `scan` model, the factored op with plain autodiff (no custom VJP)
    scan-vjp        `scan` model, the custom-VJP op (saves x, u, v per step and layer)
    scan-vjp-remat  `scan` model, custom-VJP op + u, v recomputed from the hyper state
                    (the default of `impl=scan`)
    fused           `impl=fused`: one custom VJP over the whole main recurrence

Memory is XLA's compile-time estimate for one jitted training step (forward, backward,
Adam update; gate dropout on; params and optimizer state donated):
peak = arguments + outputs + temporaries - aliased (donated) bytes, from
`jax.jit(step).lower(...).compile().memory_analysis()`; nothing runs, so it is cheap at the
paper size. `materialized_gb` is what storing W~ per example would take for the same step:
T x (L x B x n x 2n + B x E x 2n) x 4 bytes (every step and micro-layer's W~ is kept for
the backward), computed from the shapes.

Step time is the median of `--repeats` steps after a warm-up step, at `--time_size` (a paper
step on a 2-core CPU takes tens of seconds at rank 0 and grows ~linearly with the rank, so
the default times a shorter batch with the paper's widths).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from collections.abc import Sequence

import jax
from absl import app, flags
from bench import device_name, paper_optimizer, time_step

from rhhjax import models
from rhhjax.ops import lowrank
from rhhjax.train import step as train_step

SIZES = {
    # name: (hidden, hyper_hidden, depth, batch, seq_len)
    "paper": (1000, 128, 7, 256, 100),
    "short": (1000, 128, 7, 32, 20),  # the paper's widths, 1/40 of the tokens
    "small": (256, 64, 3, 16, 20),
    "tiny": (32, 8, 2, 4, 6),
}
MODES = ("scan-factored", "scan-vjp", "scan-vjp-remat", "fused")
VOCAB, EMBED = 50, 27


def define_flags() -> None:
    """The command-line flags (only when run as a program: the helpers are imported too)."""
    flags.DEFINE_string("out", "", "Write the rows as JSON to this file.")
    flags.DEFINE_list("ranks", ["1", "2", "4", "8"], "Ranks d > 0 (rank 0 always runs).")
    flags.DEFINE_list("modes", list(MODES), f"Modes: {', '.join(MODES)}.")
    flags.DEFINE_string("memory_size", "paper", "Size of the memory rows.")
    flags.DEFINE_string("time_size", "short", "Size of the timed rows; none = skip.")
    flags.DEFINE_integer("repeats", 2, "Timed steps per row (median reported).")
    flags.DEFINE_string("dtype", "float32", "Matmul input dtype.")


@dataclasses.dataclass
class Row:
    mode: str
    rank: int
    size: str
    params: int
    peak_gb: float  # arguments + outputs + temporaries - aliased
    temp_gb: float
    argument_gb: float
    materialized_gb: float  # W~ per example, every step and layer (from the shapes)
    compile_s: float
    time_size: str = ""
    step_s: float | None = None


def model_config(mode: str, rank: int, size: str, dtype: str = "float32") -> models.ModelConfig:
    hidden, hyper, depth, _, _ = SIZES[size]
    return models.ModelConfig(
        type="hyperrhn",
        vocab_size=VOCAB,
        embed_dim=EMBED,
        hidden=hidden,
        hyper_hidden=hyper,
        depth=depth,
        keep=0.65,
        impl="fused" if mode == "fused" else "scan",
        dtype=dtype,
        hyper_rank=rank,
        **op_options(mode),
    )


def op_options(mode: str) -> dict:
    """The `lowrank_op` / `lowrank_remat` model fields of a mode."""
    if mode == "scan-factored":
        return {"lowrank_op": "factored", "lowrank_remat": False}
    if mode == "scan-vjp":
        return {"lowrank_op": "custom_vjp", "lowrank_remat": False}
    return {"lowrank_op": "custom_vjp", "lowrank_remat": True}


def materialized_bytes(config: models.ModelConfig, batch: int, length: int) -> int:
    """Bytes of W~ kept per example for every step and micro-layer (f32)."""
    n, e = config.hidden, config.embed_dim
    per_step = config.depth * lowrank.materialized_size(batch, n, 2 * n)
    per_step += lowrank.materialized_size(batch, e, 2 * n)
    return length * per_step


def compiled_memory(config: models.ModelConfig, batch: int, length: int):
    """(memory_analysis, compile seconds, parameter count) of the training step."""
    analysis, seconds = train_step.compiled_memory(config, paper_optimizer(), batch, length)
    params = jax.eval_shape(train_step.make_init(config), train_step.init_key(0))
    return analysis, seconds, models.count_params(params)


def time_step_median(config: models.ModelConfig, batch: int, length: int, repeats: int):
    """Median seconds of a training step after a warm-up step."""
    _, times = time_step(config, batch, length, repeats)
    return statistics.median(times)


def plan(ranks: Sequence[int], modes: Sequence[str]) -> list[tuple[str, int]]:
    rows = [(mode, 0) for mode in ("scan", "fused")]
    return rows + [(mode, rank) for rank in ranks for mode in modes]


def run_row(mode, rank, memory_size, time_size, repeats, dtype) -> Row:
    base_mode = "fused" if mode == "fused" else "scan"
    config = model_config(base_mode if rank == 0 else mode, rank, memory_size, dtype)
    _, _, _, batch, length = SIZES[memory_size]
    analysis, compile_s, params = compiled_memory(config, batch, length)
    gb = 1e-9
    row = Row(
        mode=mode,
        rank=rank,
        size=memory_size,
        params=params,
        peak_gb=train_step.peak_bytes(analysis) * gb,
        temp_gb=analysis.temp_size_in_bytes * gb,
        argument_gb=analysis.argument_size_in_bytes * gb,
        materialized_gb=materialized_bytes(config, batch, length) * gb,
        compile_s=compile_s,
    )
    if time_size != "none":
        timed = model_config(base_mode if rank == 0 else mode, rank, time_size, dtype)
        _, _, _, t_batch, t_length = SIZES[time_size]
        row.time_size = time_size
        row.step_s = time_step_median(timed, t_batch, t_length, repeats)
    return row


def format_table(rows: Sequence[Row]) -> str:
    """Markdown; `vs rank 1` = peak / the same mode's rank-1 peak."""
    rank1 = {r.mode: r.peak_gb for r in rows if r.rank == 1}
    lines = [
        "| mode | rank | params | peak GB | temp GB | vs rank 1 | W~ materialized GB | "
        "step s | compile s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = f"{r.peak_gb / rank1[r.mode]:.2f}" if r.mode in rank1 and r.rank else "-"
        step = f"{r.step_s:.2f}" if r.step_s is not None else "-"
        lines.append(
            f"| {r.mode} | {r.rank} | {r.params:,} | {r.peak_gb:.3g} | {r.temp_gb:.3g} | "
            f"{ratio} | {r.materialized_gb:,.0f} | {step} | {r.compile_s:.0f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    FLAGS = flags.FLAGS  # noqa: N806
    try:
        ranks = [int(r) for r in FLAGS.ranks]
    except ValueError:
        raise SystemExit(f"error: --ranks must be integers, got {FLAGS.ranks}") from None
    bad = [m for m in FLAGS.modes if m not in MODES]
    bad += [s for s in (FLAGS.memory_size,) if s not in SIZES]
    bad += [s for s in (FLAGS.time_size,) if s not in (*SIZES, "none")]
    bad += [str(r) for r in ranks if r < 1]
    if bad:
        raise SystemExit(f"error: unknown benchmark choice(s): {', '.join(bad)}")
    rows = []
    for mode, rank in plan(ranks, FLAGS.modes):
        sizes = (FLAGS.memory_size, FLAGS.time_size)
        row = run_row(mode, rank, *sizes, FLAGS.repeats, FLAGS.dtype)
        rows.append(row)
        print(format_table(rows).splitlines()[-1], flush=True)
    print(format_table(rows))
    if FLAGS.out:
        record = {
            "command": "python benchmarks/lowrank_bench.py " + " ".join(argv[1:]),
            "date": time.strftime("%Y-%m-%d"),
            "jax": jax.__version__,
            "device": device_name(),
            "sizes": {k: SIZES[k] for k in {FLAGS.memory_size, FLAGS.time_size} if k in SIZES},
            "rows": [dataclasses.asdict(r) for r in rows],
            "table": format_table(rows),
        }
        with open(FLAGS.out, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    define_flags()
    app.run(main)
