"""Times the pallas training step for several kernel block settings (model.kernel).

    python benchmarks/kernel_blocks.py --model=hyperrhn --dtype=bfloat16 \\
        --blocks=64/32/32/4/3,64/64/64/4/3 --out=blocks.json

Each setting is block_b/block_n/block_k/num_warps/num_stages[/tf32]; it times the same step
as ``benchmarks/bench.py`` (the training step of ``train.py``, paper size, gate dropout on):
the median of --repeats steps after compilation and a warm-up step. A setting the config
check refuses (e.g. over the shared-memory limit) or that fails to compile is recorded with
its error. On a GPU only: interpret mode on a CPU says nothing about kernel speed.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Sequence

import bench  # benchmarks/bench.py, beside this script: the timed step and the paper sizes
import jax
from absl import app, flags
from rhhjax.kernels import triton


def parse_blocks(text: str) -> triton.HighwayConfig:
    """'64/32/32/4/3[/tf32]' -> HighwayConfig(64, 32, 32, 4, 3, allow_tf32)."""
    parts = text.split("/")
    usage = f"--blocks item {text!r}: expected B/N/K/WARPS/STAGES[/tf32] of integers"
    if len(parts) not in (5, 6) or (len(parts) == 6 and parts[5] != "tf32"):
        raise app.UsageError(usage)
    try:
        b, n, k, warps, stages = (int(p) for p in parts[:5])
    except ValueError:
        raise app.UsageError(usage) from None
    return triton.HighwayConfig(b, n, k, warps, stages, allow_tf32=len(parts) == 6)


def time_blocks(model: str, dtype: str, kernel: triton.HighwayConfig, repeats: int) -> dict:
    """One row: the setting, and its median step ms or its error."""
    row = {"model": model, "dtype": dtype, **dataclasses.asdict(kernel)}
    config = dataclasses.replace(
        bench.model_config(model, "paper", "pallas", dtype), kernel=kernel, pallas_mode="compiled"
    )
    _, _, _, batch, length = bench.SIZES["paper"]
    try:
        config.validate()
        compile_s, times = bench.time_step(config, batch, length, repeats)
    except Exception as e:  # record and go on: the sweep is for finding the good ones
        row["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:500]}"
        return row
    row.update(step_ms_median=1e3 * statistics.median(times), step_ms_min=1e3 * min(times))
    row["compile_s"] = compile_s
    return row


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    f = flags.FLAGS
    settings = [parse_blocks(b) for b in f.blocks]
    rows = []
    for kernel in settings:
        row = time_blocks(f.model, f.dtype, kernel, f.repeats)
        rows.append(row)
        label = "/".join(str(row[k]) for k in ("block_b", "block_n", "block_k", "num_warps"))
        label += f"/{row['num_stages']}" + ("/tf32" if kernel.allow_tf32 else "")
        result = f"{row['step_ms_median']:.1f} ms" if "error" not in row else row["error"][:200]
        print(f"{f.model} {f.dtype} {label}: {result}", flush=True)
        if f.out:
            record = {
                "command": "python benchmarks/kernel_blocks.py " + " ".join(sys.argv[1:]),
                "date": time.strftime("%Y-%m-%d"),
                "jax": jax.__version__,
                "device": bench.device_name(),
                "rows": rows,
            }
            with open(f.out, "w") as out:
                json.dump(record, out, indent=1)


if __name__ == "__main__":
    flags.DEFINE_string("model", "hyperrhn", "rhn | hyperrhn.")
    flags.DEFINE_string("dtype", "bfloat16", "float32 | bfloat16.")
    flags.DEFINE_list("blocks", ["64/32/32/4/3"], "B/N/K/WARPS/STAGES[/tf32] settings.")
    flags.DEFINE_integer("repeats", 10, "Timed steps per setting (median reported).")
    flags.DEFINE_string("out", "", "Write the rows as JSON to this file.")
    app.run(main)
