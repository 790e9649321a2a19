"""The memory estimate (rhhjax.memory) against the measured peak, on the CPU backend.

    python benchmarks/memory_peaks.py --out=results/memory_cpu.json        # every case
    python benchmarks/memory_peaks.py --case='{"type": "rhn", "hidden": 64}' # one, as JSON

Each case runs in a fresh process (``--measure``): it builds the training step of a model
(``rhhjax.train.step``, what train.py runs) and compiles it, then records the growth of the
process's resident set over two executed steps: ``VmHWM`` of /proc/self/status after its
high-water mark was reset (``clear_refs`` 5, once freed memory went back to the system:
``malloc_trim``) less the resident set at the reset. The same for the windows-protocol
evaluation of a random split (``rhhjax.evaluation.evaluate_tokens``, compiled on a short
prefix first). The compile itself is measured the same way. Each line of the output: the
case, the estimates (``rhhjax.memory.training`` / ``evaluation``: device + host bytes), the
measured peaks and their ratio. Linux only (it reads /proc).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import subprocess
import sys
import time
from pathlib import Path

# (model fields, training batch and length, evaluation batch and length)
CASES = [
    dict(type="hyperrhn", hidden=64, hyper_hidden=16, depth=2, batch=64, seq_len=100,
         eval_batch=64, eval_seq_len=100),
    dict(type="hyperrhn", hidden=256, hyper_hidden=64, depth=3, batch=64, seq_len=100,
         eval_batch=256, eval_seq_len=100),
    dict(type="hyperrhn", hidden=128, hyper_hidden=32, depth=2, batch=256, seq_len=100,
         eval_batch=512, eval_seq_len=200),
    dict(type="rhn", hidden=256, hyper_hidden=8, depth=3, batch=128, seq_len=100,
         eval_batch=256, eval_seq_len=100),
    dict(type="rhn", hidden=64, hyper_hidden=8, depth=5, batch=256, seq_len=200,
         eval_batch=1024, eval_seq_len=100),
    dict(type="lstm", hidden=256, hyper_hidden=8, depth=2, batch=128, seq_len=100,
         eval_batch=256, eval_seq_len=100),
    dict(type="hyperrhn", hidden=16, hyper_hidden=8, depth=2, batch=4, seq_len=20,
         eval_batch=8, eval_seq_len=20),
]  # fmt: skip
MODEL_FIELDS = ("type", "hidden", "hyper_hidden", "depth")


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def _reset_peak() -> int:
    """Return freed memory to the system, reset the high-water mark; the resident set now."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status("VmRSS")


def measure(case: dict) -> dict:
    """Measured peaks and the estimates of one case (runs jax in this process)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from rhhjax import evaluation as eval_lib
    from rhhjax import memory, models
    from rhhjax.train import optim, step
    from rhhjax.train.config import default_train_config

    fields = {k: case[k] for k in MODEL_FIELDS}
    mc = models.ModelConfig(**fields, lstm_layers=case["depth"], impl="scan")
    oc = optim.OptimizerConfig.from_config(default_train_config(), batches_per_epoch=1)
    batch, length = case["batch"], case["seq_len"]
    args = step.step_inputs(mc, oc, batch, length)
    args = (args[0], args[1], jax.tree.map(jnp.copy, args[2]), *args[3:])  # LSTM: no alias
    n_params = models.count_params(args[0])
    base = _reset_peak()
    compiled = step.make_train_step(mc, oc, 0).lower(*args).compile()
    compile_peak = _status("VmHWM") - base
    base = _reset_peak()
    start = time.perf_counter()
    for _ in range(2):
        out = compiled(*args)
        jax.block_until_ready(out)
        args = (*out[:3], *args[3:])
    train_peak = _status("VmHWM") - base
    train_s = (time.perf_counter() - start) / 2
    params = out[0]
    eb, el = case["eval_batch"], case["eval_seq_len"]
    tokens = np.random.default_rng(0).integers(0, mc.vocab_size, 10 * eb * el).astype(np.int32)
    kwargs = dict(batch_size=eb, seq_len=el, min_context=el // 2)
    eval_lib.evaluate_tokens(mc, params, tokens[: 2 * el], "windows", **kwargs)  # compiles
    base = _reset_peak()
    eval_lib.evaluate_tokens(mc, params, tokens, "windows", **kwargs)
    eval_peak = _status("VmHWM") - base
    train = memory.training(mc, n_params, batch, length, "adam")
    evaluation = memory.evaluation(mc, n_params, eb, memory.eval_steps("windows", el), "windows")
    train_est, eval_est = train.device + train.host, evaluation.device + evaluation.host
    return {
        **case,
        "params": n_params,
        "train_estimate": train_est,
        "train_measured": train_peak,
        "train_ratio": round(train_est / train_peak, 3),
        "eval_estimate": eval_est,
        "eval_measured": eval_peak,
        "eval_ratio": round(eval_est / eval_peak, 3),
        "compile_measured": compile_peak,
        "train_step_s": round(train_s, 3),
    }


def measure_in_subprocess(case: dict, env: dict | None = None) -> dict:
    """``measure(case)`` in a fresh Python (a clean high-water mark for each case)."""
    proc = subprocess.run(
        [sys.executable, __file__, "--measure", json.dumps(case)],
        capture_output=True, text=True, env=env, check=True, timeout=900,
    )  # fmt: skip
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ratio_range(rows: list[dict], above: float) -> list[float]:
    """[min, max] of the estimate / measured ratios of the peaks above ``above`` bytes."""
    ratios = [
        r[f"{kind}_ratio"]
        for r in rows
        for kind in ("train", "eval")
        if r[f"{kind}_measured"] > above
    ]
    return [min(ratios), max(ratios)] if ratios else []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--case", help="one case as JSON (default: every case in CASES)")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(json.loads(args.measure))))
        return
    cases = [json.loads(args.case)] if args.case else CASES
    rows = []
    for case in cases:
        rows.append(measure_in_subprocess(case))
        print(json.dumps(rows[-1]), flush=True)
    if args.out:
        import jax

        summary = {
            "command": "python benchmarks/memory_peaks.py --out=" + str(args.out),
            "date": time.strftime("%Y-%m-%d"),
            "machine": "the project's 2-core CPU (CPU backend)",
            "jax": jax.__version__,
            "ratio_range_above_100MB": ratio_range(rows, 100e6),
            "ratio_range_all": ratio_range(rows, 0),
            "rows": rows,
        }
        args.out.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
