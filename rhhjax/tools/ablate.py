"""Ablation runner: train config variants with the same seeds and budget, tabulate results.

    python -m rhhjax.tools.ablate --config=configs/ptb.py:cpu \\
        --sweep=model.hyper_rank=0,1,2,4,8 --max_minutes=12 --out=ablations/rank

    python -m rhhjax.tools.ablate --config=configs/ptb.py:cpu --config.data.dir=/path/to/ptb \\
        --sweep=model.type=rhn,hyperrhn --sweep=model.depth=3,5 --max_steps=2000 --out=DIR

Every `--sweep=FIELD=V1,V2,...` names any config field (dotted, e.g. model.depth,
model.type, model.dropout, train.learning_rate); values are converted to the field's type.
Several sweeps give their cross product, in order (the base config's value of a field is not
added: list it to include it). `--config.FIELD=VALUE` changes the base of every variant.
`--max_steps` / `--max_minutes` set the same budget for every variant (train.max_steps /
train.max_minutes); `--seeds=0,1` repeats every variant per seed (default: config.seed).

Each variant trains with `rhhjax.trainer.train_and_evaluate` in its own workdir DIR/<name>
(rerunning the command resumes unfinished variants and reuses finished ones, i.e. those with
a results.json, unless --rerun). DIR/results.md and DIR/results.json hold one row per variant:
parameters, steps, step time (median of the trainer's logged throughput, compilation
excluded), peak memory (XLA's compile-time estimate for the training step: arguments +
outputs + temporaries - donated, see `rhhjax.lowrank_bench`), the best periodic validation
BPC and the final validation BPC of the best checkpoint (first protocol of
eval.final_protocols). A variant that fails (e.g. an invalid combination) is recorded with
its error and the others still run; the exit status is then 1.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math
import re
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ml_collections

from rhhjax.errors import UserError

RESULTS_FILE = "results.json"


class SweepError(UserError):
    """A malformed --sweep (one line)."""


@dataclasses.dataclass
class Sweep:
    field: str
    values: list[Any]


@dataclasses.dataclass
class Variant:
    name: str
    overrides: dict[str, Any]
    seed: int


def _get(config: ml_collections.ConfigDict, field: str) -> Any:
    node = config
    for part in field.split("."):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            raise SweepError(f"--sweep field {field!r} is not in the config")
        node = node[part]
    return node


def _set(config: ml_collections.ConfigDict, field: str, value: Any) -> None:
    *parents, last = field.split(".")
    node = config
    for part in parents:
        node = node[part]
    node[last] = value


def convert(text: str, like: Any, field: str) -> Any:
    """`text` as the type of the field's current value `like`."""
    text = text.strip()
    try:
        if isinstance(like, bool):
            if text.lower() in ("true", "1", "yes"):
                return True
            if text.lower() in ("false", "0", "no"):
                return False
            raise ValueError(text)
        if isinstance(like, int):
            return int(text)
        if isinstance(like, float):
            return float(text)
    except ValueError:
        kind = type(like).__name__
        raise SweepError(f"--sweep {field}: {text!r} is not a valid {kind}") from None
    return text


def parse_sweep(text: str, config: ml_collections.ConfigDict) -> Sweep:
    """'model.hyper_rank=1,2,4' -> Sweep('model.hyper_rank', [1, 2, 4])."""
    field, sep, values = text.partition("=")
    field = field.strip()
    if not sep or not field or not values.strip():
        raise SweepError(f"--sweep={text!r}: expected FIELD=V1,V2,... e.g. model.depth=3,5")
    like = _get(config, field)
    if isinstance(like, ml_collections.ConfigDict):
        raise SweepError(f"--sweep field {field!r} is a section, not a value")
    parsed = [convert(v, like, field) for v in values.split(",") if v.strip()]
    if len(set(map(repr, parsed))) != len(parsed):
        raise SweepError(f"--sweep {field}: repeated values in {values!r}")
    return Sweep(field, parsed)


def variant_name(overrides: dict[str, Any], seed: int | None) -> str:
    """'model.hyper_rank=4' -> 'hyper_rank-4' (last component of each field)."""
    parts = [f"{field.split('.')[-1]}-{value}" for field, value in overrides.items()]
    if seed is not None:
        parts.append(f"seed-{seed}")
    name = "_".join(parts) or "base"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name)


def plan(
    config: ml_collections.ConfigDict, sweeps: Sequence[Sweep], seeds: Sequence[int] | None
) -> list[Variant]:
    """The cross product of the sweeps (then seeds), in the order given."""
    fields = [s.field for s in sweeps]
    if len(set(fields)) != len(fields):
        raise SweepError(f"a field is swept twice: {', '.join(fields)}")
    variants = []
    for values in itertools.product(*(s.values for s in sweeps)):
        overrides = dict(zip(fields, values, strict=True))
        for seed in seeds or [None]:
            name = variant_name(overrides, seed if seeds and len(seeds) > 1 else None)
            variants.append(Variant(name, overrides, int(config.seed if seed is None else seed)))
    return variants


def variant_config(
    base: ml_collections.ConfigDict,
    variant: Variant,
    max_steps: int | None,
    max_minutes: float | None,
) -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict(copy.deepcopy(base.to_dict()))
    for field, value in variant.overrides.items():
        _set(config, field, value)
    config.seed = variant.seed
    if max_steps is not None:
        config.train.max_steps = int(max_steps)
    if max_minutes is not None:
        config.train.max_minutes = float(max_minutes)
    return config


# ----------------------------------------------------------------------------- measurements


def step_seconds(workdir: Path, batch: int, seq_len: int) -> float | None:
    """Median seconds per step from the trainer's `train` records (chars_per_sec)."""
    path = workdir / "metrics.jsonl"
    if not path.exists():
        return None
    values = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        cps = record.get("chars_per_sec") if record.get("kind") == "train" else None
        if cps:
            values.append(batch * seq_len / cps)
    return statistics.median(values) if values else None


def peak_memory_gb(config: ml_collections.ConfigDict, vocab_size: int) -> float | None:
    """XLA's compile-time peak estimate (GB) of the variant's training step (the very step
    ``train.py`` runs, compiled but not run)."""
    from rhhjax import models
    from rhhjax.train import optim, step

    mc = models.ModelConfig.from_config(config.model, vocab_size=vocab_size)
    oc = optim.OptimizerConfig.from_config(config.train, batches_per_epoch=1)
    analysis, _ = step.compiled_memory(
        mc, oc, int(config.train.batch_size), int(config.train.seq_len)
    )
    return step.peak_bytes(analysis) * 1e-9


def _final_valid(results: dict, config: ml_collections.ConfigDict) -> tuple[float | None, str]:
    final = (results.get("final") or {}).get("valid") or {}
    from rhhjax import evaluation

    for protocol in evaluation.parse_protocols(config.eval.final_protocols):
        for label, metrics in final.items():
            if label == protocol or label.startswith(protocol):
                return metrics.get("bpc"), label
    return None, ""


def run_variant(
    base: ml_collections.ConfigDict,
    variant: Variant,
    out: Path,
    *,
    max_steps: int | None,
    max_minutes: float | None,
    memory: bool,
    rerun: bool,
    log: Callable[[str], None],
) -> dict:
    """Trains one variant (or reuses its results) and returns its row."""
    from rhhjax.train import trainer

    config = variant_config(base, variant, max_steps, max_minutes)
    workdir = out / variant.name
    row: dict[str, Any] = {
        "variant": variant.name,
        "overrides": variant.overrides,
        "seed": variant.seed,
        "workdir": str(workdir),
    }
    start = time.time()
    try:
        cached = workdir / RESULTS_FILE
        if cached.exists() and not rerun:
            results = json.loads(cached.read_text())
            log(f"[{variant.name}] finished before: reusing {cached}")
        else:
            results = trainer.train_and_evaluate(
                config, workdir, log=lambda m: log(f"[{variant.name}] {m}")
            )
    except Exception as e:  # one failing variant must not stop the ablation
        known = isinstance(e, UserError)
        row.update(status="error", error=" ".join(str(e).split()) or type(e).__name__)
        if not known:
            row["error"] = f"{type(e).__name__}: {row['error']}"
            log(f"[{variant.name}] failed:\n{traceback.format_exc()}")
        else:
            log(f"[{variant.name}] error: {row['error']}")
        return row
    row["wall_s"] = time.time() - start
    vocab_size = int(config.model.vocab_size)
    if (workdir / "config.json").exists():  # the trainer's resolved config: the data's vocab
        saved = json.loads((workdir / "config.json").read_text())
        vocab_size = int(saved.get("model", {}).get("vocab_size", vocab_size))
    final_bpc, protocol = _final_valid(results, config)
    row.update(
        status=results.get("status"),
        stop_reason=results.get("stop_reason"),
        steps=results.get("step"),
        epochs=results.get("epoch"),
        params=results.get("num_params"),
        best_valid_bpc=results.get("best_valid_bpc"),
        best_step=results.get("best_step"),
        final_valid_bpc=final_bpc,
        final_valid_protocol=protocol,
        step_s=step_seconds(workdir, int(config.train.batch_size), int(config.train.seq_len)),
    )
    if memory:
        try:
            row["peak_memory_gb"] = peak_memory_gb(config, vocab_size)
        except Exception as e:  # memory is a bonus: never fail the row for it
            row["peak_memory_gb"] = None
            log(f"[{variant.name}] no memory estimate: {type(e).__name__}: {e}")
    return row


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def format_markdown(rows: Sequence[dict], header: dict) -> str:
    lines = [
        f"# Ablation: {header['config']}",
        "",
        f"Command: `{header['command']}`  ",
        f"Date: {header['date']}; device: {header['device']}; budget: {header['budget']}",
        "",
        "| variant | params | steps | step s | peak mem GB | best valid BPC (step) | "
        "final valid BPC | status |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("status") == "error":
            lines.append(f"| {r['variant']} | - | - | - | - | - | - | error: {r['error']} |")
            continue
        best = _fmt(r.get("best_valid_bpc"), ".4f")
        if r.get("best_step") is not None and best != "-":
            best += f" ({r['best_step']})"
        final = _fmt(r.get("final_valid_bpc"), ".4f")
        if final != "-":
            final += f" ({r['final_valid_protocol']})"
        status = r.get("status", "")
        if r.get("stop_reason"):
            status += f", {r['stop_reason']}"
        lines.append(
            f"| {r['variant']} | {_fmt(r.get('params'), ',')} | {_fmt(r.get('steps'), ',')} | "
            f"{_fmt(r.get('step_s'), '.3f')} | {_fmt(r.get('peak_memory_gb'), '.3f')} | "
            f"{best} | {final} | {status} |"
        )
    return "\n".join(lines) + "\n"


def run_ablation(
    config: ml_collections.ConfigDict,
    sweeps: Sequence[str],
    out: str | Path,
    *,
    max_steps: int | None = None,
    max_minutes: float | None = None,
    seeds: Sequence[int] | None = None,
    memory: bool = True,
    rerun: bool = False,
    command: str = "",
    config_label: str = "",
    log: Callable[[str], None] = print,
) -> list[dict]:
    """Runs every variant, writes out/results.{md,json}, returns the rows."""
    import jax

    parsed = [parse_sweep(s, config) for s in sweeps]
    if not parsed:
        raise SweepError("give at least one --sweep=FIELD=V1,V2,...")
    variants = plan(config, parsed, seeds)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    budget = ", ".join(
        f"{k}={v}" for k, v in (("max_steps", max_steps), ("max_minutes", max_minutes)) if v
    )
    header = {
        "config": config_label or "config",
        "command": command,
        "date": time.strftime("%Y-%m-%d"),
        "device": f"{jax.devices()[0].platform}:{getattr(jax.devices()[0], 'device_kind', '?')}",
        "budget": budget or "the config's",
        "sweeps": {s.field: s.values for s in parsed},
    }
    log(f"ablation: {len(variants)} variant(s) in {out}: {', '.join(v.name for v in variants)}")
    rows: list[dict] = []
    for variant in variants:
        row = run_variant(
            config,
            variant,
            out,
            max_steps=max_steps,
            max_minutes=max_minutes,
            memory=memory,
            rerun=rerun,
            log=log,
        )
        rows.append(row)
        (out / "results.json").write_text(json.dumps({**header, "rows": rows}, indent=2) + "\n")
        (out / "results.md").write_text(format_markdown(rows, header))
    log(format_markdown(rows, header))
    return rows


# ----------------------------------------------------------------------------- command line


def main(argv: Sequence[str]) -> int:
    from absl import flags
    from ml_collections import config_flags

    FLAGS = flags.FLAGS  # noqa: N806
    del argv  # run_program refuses positional arguments
    config = FLAGS.config
    if config is None:
        raise SweepError("--config is required, e.g. --config=configs/ptb.py:cpu")
    if not FLAGS.out:
        raise SweepError("--out=DIR is required")
    try:
        seeds = [int(s) for s in FLAGS.seeds] if FLAGS.seeds else None
    except ValueError:
        raise SweepError(f"--seeds must be integers, got {FLAGS.seeds}") from None
    rows = run_ablation(
        config,
        FLAGS.sweep or [],
        FLAGS.out,
        max_steps=FLAGS.max_steps,
        max_minutes=FLAGS.max_minutes,
        seeds=seeds,
        memory=FLAGS.memory,
        rerun=FLAGS.rerun,
        command="python -m rhhjax.tools.ablate " + " ".join(sys.argv[1:]),
        config_label=config_flags.get_config_filename(FLAGS["config"]),
    )
    return 1 if any(r.get("status") == "error" for r in rows) else 0


def define_flags() -> None:
    from absl import flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file(
        "config", None, "Config file, optionally with a variant: configs/ptb.py[:cpu]."
    )
    flags.DEFINE_multi_string("sweep", [], "FIELD=V1,V2,... (repeatable; cross product).")
    flags.DEFINE_integer("max_steps", None, "train.max_steps for every variant.")
    flags.DEFINE_float("max_minutes", None, "train.max_minutes for every variant.")
    flags.DEFINE_list("seeds", [], "Seeds to repeat every variant with (default config.seed).")
    flags.DEFINE_string("out", None, "Output folder (one workdir per variant + results).")
    flags.DEFINE_bool("memory", True, "Estimate each variant's training-step peak memory.")
    flags.DEFINE_bool("rerun", False, "Retrain variants that already have results.")


if __name__ == "__main__":
    from rhhjax.tools import common as cli

    cli.run_program(main, define_flags, __doc__)
