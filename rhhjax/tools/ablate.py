"""Ablation runner: train config variants with the same seeds and budget, tabulate results.

    python -m rhhjax.tools.ablate --config=configs/ptb.py:cpu \\
        --sweep=model.hyper_rank=0,1,2,4,8 --max_minutes=12 --out=ablations/rank
    python -m rhhjax.tools.ablate --config=configs/ptb.py:cpu \\
        --variant=rhn:model.type=rhn,model.hidden=280 --seeds=0,1 --max_steps=500 --out=DIR

Each variant trains in DIR/<name>; DIR/results.md and results.json hold one row per run.
Details: docs/operations.md ("Ablations")."""

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

from rhhjax import cli, config_fields, outputs
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
    group: str = ""


def _get(config: ml_collections.ConfigDict, field: str, flag: str = "sweep") -> Any:
    try:
        return config_fields.lookup(config, field)
    except config_fields.UnknownField as e:
        raise SweepError(f"--{flag} field {field!r} is not in the config{e.hint}") from None


def _set(config: ml_collections.ConfigDict, field: str, value: Any) -> None:
    *parents, last = field.split(".")
    node = config
    for part in parents:
        node = node[part]
    node[last] = value


def convert(text: str, like: Any, field: str, flag: str = "sweep") -> Any:
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
        raise SweepError(f"--{flag} {field}: {text!r} is not a valid {kind}") from None
    return text


def _leaf_value(config: ml_collections.ConfigDict, field: str, flag: str) -> Any:
    like = _get(config, field, flag)
    if isinstance(like, ml_collections.ConfigDict):
        raise SweepError(f"--{flag} field {field!r} is a section, not a value")
    return like


def parse_sweep(text: str, config: ml_collections.ConfigDict) -> Sweep:
    """'model.hyper_rank=1,2,4' -> Sweep('model.hyper_rank', [1, 2, 4])."""
    field, sep, values = text.partition("=")
    field = field.strip()
    if not sep or not field or not values.strip():
        raise SweepError(f"--sweep={text!r}: expected FIELD=V1,V2,... e.g. model.depth=3,5")
    like = _leaf_value(config, field, "sweep")
    parsed = [convert(v, like, field) for v in values.split(",") if v.strip()]
    if len(set(map(repr, parsed))) != len(parsed):
        raise SweepError(f"--sweep {field}: repeated values in {values!r}")
    return Sweep(field, parsed)


def variant_name(overrides: dict[str, Any], seed: int | None) -> str:
    parts = [f"{field.split('.')[-1]}-{value}" for field, value in overrides.items()]
    if seed is not None:
        parts.append(f"seed-{seed}")
    name = "_".join(parts) or "base"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name)


def parse_variant(
    text: str, config: ml_collections.ConfigDict, file_variants: Sequence[str] = ()
) -> tuple[str, dict[str, Any]]:
    """'rhn:model.type=rhn,model.hidden=280' -> ('rhn', {'model.type': 'rhn', ...})."""
    name, colon, body = text.partition(":")
    name = name.strip()
    if not name or re.search(r"[^A-Za-z0-9._-]", name):
        raise SweepError(
            f"--variant={text!r}: expected NAME[:FIELD=V,FIELD=V] with NAME of letters, "
            "digits, '.', '_', '-', e.g. rhn:model.type=rhn,model.hidden=280"
        )
    base_names = ("base", str(config.model.get("type", "")))
    if not colon and name not in base_names:
        own = f"; the config file's own variants ({', '.join(file_variants)}) are picked with "
        own = own + "--config=FILE:VARIANT" if file_variants else ""
        raise SweepError(
            f"--variant={text} changes no field: give NAME:FIELD=V,FIELD=V (e.g. "
            f"rhn:model.type=rhn,model.hidden=280), or {' / '.join(base_names)} / {name}: for "
            f"the base config{own}"
        )
    overrides: dict[str, Any] = {}
    for item in filter(str.strip, body.split(",")):
        field, sep, value = item.partition("=")
        field = field.strip()
        if not sep or not field:
            raise SweepError(f"--variant={text!r}: {item!r} is not FIELD=VALUE")
        if field in overrides:
            raise SweepError(f"--variant={text!r}: {field} is set twice")
        like = _leaf_value(config, field, "variant")
        overrides[field] = convert(value, like, field, "variant")
    return name, overrides


def plan(
    config: ml_collections.ConfigDict,
    sweeps: Sequence[Sweep],
    seeds: Sequence[int] | None,
    named: Sequence[tuple[str, dict[str, Any]]] = (),
) -> list[Variant]:
    """The named variants x the cross product of the sweeps, repeated per seed (seed-major)."""
    fields = [s.field for s in sweeps]
    if len(set(fields)) != len(fields):
        raise SweepError(f"a field is swept twice: {', '.join(fields)}")
    names = [name for name, _ in named]
    if len(set(names)) != len(names):
        raise SweepError(f"a --variant name is given twice: {', '.join(names)}")
    for name, overrides in named:
        both = sorted(set(overrides) & set(fields))
        if both:
            raise SweepError(f"--variant {name} sets {', '.join(both)}, which is also swept")
    combos = []
    for prefix, fixed in named or [("", {})]:
        for values in itertools.product(*(s.values for s in sweeps)):
            swept = dict(zip(fields, values, strict=True))
            combos.append((prefix, {**fixed, **swept}, swept))
    variants = []
    for seed in seeds or [None]:
        for prefix, overrides, swept in combos:
            group = "_".join(p for p in (prefix, variant_name(swept, None)) if p != "base" and p)
            suffix = variant_name({}, seed) if seeds and len(seeds) > 1 else ""
            name = "_".join(p for p in (group, suffix) if p) or "base"
            seed_value = int(config.seed if seed is None else seed)
            variants.append(Variant(name, overrides, seed_value, group or "base"))
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


def check_budget(max_steps: int | None, max_minutes: float | None) -> None:
    if max_steps is not None and max_steps < 1:
        raise SweepError(
            f"--max_steps={max_steps} must be >= 1 (leave it out to keep the config's "
            f"train.max_steps; 0 there means no step bound)"
        )
    if max_minutes is not None and not (math.isfinite(max_minutes) and max_minutes > 0):
        raise SweepError(
            f"--max_minutes={max_minutes} must be a finite number > 0 (leave it out to keep "
            f"the config's train.max_minutes)"
        )


def check_variants(
    base: ml_collections.ConfigDict,
    planned: Sequence[Variant],
    max_steps: int | None,
    max_minutes: float | None,
) -> None:
    from rhhjax.train import config as train_config

    for variant in planned:
        try:
            train_config.prepare_config(variant_config(base, variant, max_steps, max_minutes))
        except UserError as e:
            raise SweepError(
                f"variant {variant.name}: {e}; nothing was trained (every variant is checked first)"
            ) from None


def metrics_summary(workdir: Path, batch: int, seq_len: int) -> dict[str, Any]:
    """Per-step timing, minutes and ``valid_curve`` [[step, minutes, BPC]] of ``metrics.jsonl``."""
    from rhhjax.train import workdir as workdir_lib

    summary: dict[str, Any] = dict(
        step_s=None, chars_per_sec=None, train_minutes=None, wall_s=None, valid_curve=[]
    )
    speeds, times, train_seconds, curve = [], [], None, {}
    for record in workdir_lib.MetricsLog(workdir / workdir_lib.METRICS_FILE).read():
        if record.get("time") is not None:
            times.append(float(record["time"]))
        if record.get("train_seconds") is not None:
            train_seconds = float(record["train_seconds"])
        if record.get("kind") == "train" and record.get("chars_per_sec"):
            speeds.append(float(record["chars_per_sec"]))
        if record.get("kind") == "valid" and record.get("bpc") is not None:
            minutes = record.get("train_seconds")
            minutes = None if minutes is None else float(minutes) / 60.0
            curve[int(record["step"])] = [int(record["step"]), minutes, float(record["bpc"])]
    if speeds:
        summary["chars_per_sec"] = statistics.median(speeds)
        summary["step_s"] = batch * seq_len / summary["chars_per_sec"]
    if train_seconds is not None:
        summary["train_minutes"] = train_seconds / 60.0
    if (workdir / RESULTS_FILE).exists():
        times.append((workdir / RESULTS_FILE).stat().st_mtime)
    if len(times) > 1:
        summary["wall_s"] = max(times) - min(times)
    summary["valid_curve"] = [curve[step] for step in sorted(curve)]
    return summary


def peak_memory_gb(config: ml_collections.ConfigDict, vocab_size: int) -> float | None:
    from rhhjax import models
    from rhhjax.train import optim, step

    mc = models.ModelConfig.from_config(config.model, vocab_size=vocab_size)
    oc = optim.OptimizerConfig.from_config(config.train, batches_per_epoch=1)
    analysis, _ = step.compiled_memory(
        mc, oc, int(config.train.batch_size), int(config.train.seq_len)
    )
    return step.peak_bytes(analysis) * 1e-9


FINAL_COLUMNS = (("valid", "windows"), ("valid", "stream"), ("test", "windows"), ("test", "stream"))


def final_bpcs(results: dict) -> dict[str, float | None]:
    final = results.get("final") or {}
    return {
        f"{split}_{protocol}": ((final.get(split) or {}).get(protocol) or {}).get("bpc")
        for split, protocol in FINAL_COLUMNS
    }


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
    from rhhjax.train import trainer

    config = variant_config(base, variant, max_steps, max_minutes)
    workdir = out / variant.name
    row: dict[str, Any] = {
        "variant": variant.name,
        "group": variant.group,
        "overrides": variant.overrides,
        "seed": variant.seed,
        "workdir": str(workdir),
    }
    try:
        cached = workdir / RESULTS_FILE
        if cached.exists() and not rerun:
            results = json.loads(cached.read_text())
            log(f"[{variant.name}] finished before: reusing {cached}")
        else:
            results = trainer.train_and_evaluate(
                config, workdir, log=lambda m: log(f"[{variant.name}] {m}")
            )
    except Exception as e:
        known = isinstance(e, UserError)
        row.update(status="error", error=" ".join(str(e).split()) or type(e).__name__)
        if not known:
            row["error"] = f"{type(e).__name__}: {row['error']}"
            log(f"[{variant.name}] failed:\n{traceback.format_exc()}")
        else:
            log(f"[{variant.name}] error: {row['error']}")
        return row
    vocab_size = int(config.model.vocab_size)
    if (workdir / "config.json").exists():
        saved = json.loads((workdir / "config.json").read_text())
        vocab_size = int(saved.get("model", {}).get("vocab_size", vocab_size))
    row.update(
        status=results.get("status"),
        exit_code=results.get("exit_code", 0),
        stop_reason=results.get("stop_reason"),
        steps=results.get("step"),
        epochs=results.get("epoch"),
        params=results.get("num_params"),
        best_valid_bpc=results.get("best_valid_bpc"),
        best_step=results.get("best_step"),
        final=final_bpcs(results),
        **metrics_summary(workdir, int(config.train.batch_size), int(config.train.seq_len)),
    )
    if memory:
        try:
            row["peak_memory_gb"] = peak_memory_gb(config, vocab_size)
        except Exception as e:
            row["peak_memory_gb"] = None
            log(f"[{variant.name}] no memory estimate: {type(e).__name__}: {e}")
    return row


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def _mean_range(values: Sequence[float | None], spec: str) -> str:
    known = [v for v in values if v is not None and math.isfinite(v)]
    if not known:
        return "-"
    mean = format(statistics.fmean(known), spec)
    if len(known) == 1:
        return mean
    return f"{mean} ({format(min(known), spec)}-{format(max(known), spec)})"


FINAL_HEADER = " | ".join(f"{split} {protocol}" for split, protocol in FINAL_COLUMNS)


def _valid_at(row: dict, step: int) -> float | None:
    for curve_step, _, bpc in row.get("valid_curve") or []:
        if curve_step == step:
            return bpc
    return None


def format_markdown(rows: Sequence[dict], header: dict) -> str:
    """The results table: one row per run, per-variant means."""
    lines = [
        f"# Ablation: {header['config']}",
        "",
        f"Command: `{header['command']}`  ",
        f"Date: {header['date']}; device: {header['device']}; budget: {header['budget']}",
        "",
        "| run | params | steps | epochs | char/s | train min | wall min | peak mem GB | "
        f"best periodic valid (step) | {FINAL_HEADER} | status |",
        "|---|" + "---|" * (9 + len(FINAL_COLUMNS)),
    ]
    for r in rows:
        if r.get("status") == "error":
            blanks = " - |" * (8 + len(FINAL_COLUMNS))
            lines.append(f"| {r['variant']} |{blanks} error: {r['error']} |")
            continue
        best = _fmt(r.get("best_valid_bpc"), ".4f")
        if r.get("best_step") is not None and best != "-":
            best += f" ({r['best_step']})"
        final = r.get("final") or {}
        finals = " | ".join(_fmt(final.get(f"{s}_{p}"), ".4f") for s, p in FINAL_COLUMNS)
        status = r.get("status", "")
        if r.get("stop_reason"):
            status += f", {r['stop_reason']}"
        wall = r.get("wall_s")
        lines.append(
            f"| {r['variant']} | {_fmt(r.get('params'), ',')} | {_fmt(r.get('steps'), ',')} | "
            f"{_fmt(r.get('epochs'), '.2f')} | {_fmt(r.get('chars_per_sec'), ',.0f')} | "
            f"{_fmt(r.get('train_minutes'), '.1f')} | "
            f"{_fmt(None if wall is None else wall / 60, '.1f')} | "
            f"{_fmt(r.get('peak_memory_gb'), '.3f')} | {best} | {finals} | {status} |"
        )
    groups: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("status") != "error":
            groups.setdefault(r.get("group") or r["variant"], []).append(r)
    if any(len(g) > 1 for g in groups.values()):
        lines += [
            "",
            "Mean (min-max) over seeds:",
            "",
            f"| variant | runs | params | steps | char/s | {FINAL_HEADER} |",
            "|---|" + "---|" * (4 + len(FINAL_COLUMNS)),
        ]
        for name, group in groups.items():
            finals = " | ".join(
                _mean_range([(r.get("final") or {}).get(f"{s}_{p}") for r in group], ".4f")
                for s, p in FINAL_COLUMNS
            )
            lines.append(
                f"| {name} | {len(group)} | {_mean_range([r.get('params') for r in group], ',.0f')}"
                f" | {_mean_range([r.get('steps') for r in group], ',.0f')}"
                f" | {_mean_range([r.get('chars_per_sec') for r in group], ',.0f')} | {finals} |"
            )
    at_steps = header.get("at_steps") or []
    if at_steps:
        lines += [
            "",
            "Periodic validation BPC at equal steps (whatever the time each run needed):",
            "",
            "| run | " + " | ".join(f"step {s:,}" for s in at_steps) + " |",
            "|---|" + "---|" * len(at_steps),
        ]
        for r in rows:
            if r.get("status") != "error":
                values = " | ".join(_fmt(_valid_at(r, s), ".4f") for s in at_steps)
                lines.append(f"| {r['variant']} | {values} |")
    return "\n".join(lines) + "\n"


def run_ablation(
    config: ml_collections.ConfigDict,
    sweeps: Sequence[str],
    out: str | Path,
    *,
    variants: Sequence[str] = (),
    max_steps: int | None = None,
    max_minutes: float | None = None,
    seeds: Sequence[int] | None = None,
    memory: bool = True,
    rerun: bool = False,
    at_steps: Sequence[int] = (),
    command: str = "",
    config_label: str = "",
    log: Callable[[str], None] = print,
    file_variants: Sequence[str] = (),
) -> list[dict]:
    """Runs every variant (all checked first), writes out/results.{md,json}, returns rows."""
    out = outputs.check_folder(out, "--out")
    check_budget(max_steps, max_minutes)
    import jax

    parsed = [parse_sweep(s, config) for s in sweeps]
    named = [parse_variant(v, config, file_variants) for v in variants]
    if not parsed and not named:
        raise SweepError("give at least one --sweep=FIELD=V1,V2,... or --variant=NAME:...")
    planned = plan(config, parsed, seeds, named)
    check_variants(config, planned, max_steps, max_minutes)
    outputs.make_folder(out, "--out")
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
        "variants": dict(named),
        "at_steps": [int(s) for s in at_steps],
    }
    log(f"ablation: {len(planned)} run(s) in {out}: {', '.join(v.name for v in planned)}")
    rows: list[dict] = []
    for variant in planned:
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
        table = json.dumps({**header, "rows": rows}, indent=2) + "\n"
        outputs.write_text(out / "results.json", table, "--out")
        outputs.write_text(out / "results.md", format_markdown(rows, header), "--out")
        if row.get("status") == "interrupted":  # SIGTERM / SIGINT: stop, not the next run
            log(f"stopped during {variant.name}: run the same command again to resume it")
            return rows
    log(format_markdown(rows, header))
    return rows


def main(argv: Sequence[str]) -> int:
    from absl import flags
    from ml_collections import config_flags

    FLAGS = flags.FLAGS  # noqa: N806
    del argv
    config = FLAGS.config
    if config is None:
        raise SweepError("--config is required, e.g. --config=configs/ptb.py:cpu")
    if not FLAGS.out:
        raise SweepError("--out=DIR is required")
    outputs.check_folder(FLAGS.out, "--out")
    try:
        seeds = [int(s) for s in FLAGS.seeds] if FLAGS.seeds else None
    except ValueError:
        raise SweepError(f"--seeds must be integers, got {FLAGS.seeds}") from None
    try:
        at_steps = [int(s) for s in FLAGS.at_steps]
    except ValueError:
        raise SweepError(f"--at_steps must be integers, got {FLAGS.at_steps}") from None
    try:
        module, _ = cli.load_config_file(config_flags.get_config_filename(FLAGS["config"]))
        file_variants = [v for v in getattr(module, "VARIANTS", ()) if v]
    except cli.ConfigArgumentError:
        file_variants = []
    rows = run_ablation(
        config,
        FLAGS.sweep or [],
        FLAGS.out,
        variants=FLAGS.variant or [],
        at_steps=at_steps,
        max_steps=FLAGS.max_steps,
        max_minutes=FLAGS.max_minutes,
        seeds=seeds,
        memory=FLAGS.memory,
        rerun=FLAGS.rerun,
        command="python -m rhhjax.tools.ablate " + " ".join(sys.argv[1:]),
        config_label=config_flags.get_config_filename(FLAGS["config"]),
        file_variants=file_variants,
    )
    stopped = [r["exit_code"] for r in rows if r.get("status") == "interrupted"]
    if stopped:
        return stopped[0]
    return 1 if any(r.get("status") == "error" for r in rows) else 0


def define_flags() -> None:
    from absl import flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file(
        "config", None, "Config file, optionally with a variant: configs/ptb.py[:cpu]."
    )
    flags.DEFINE_multi_string("sweep", [], "FIELD=V1,V2,... (repeatable; cross product).")
    flags.DEFINE_multi_string(
        "variant", [], "NAME:FIELD=V,FIELD=V (repeatable): fields changed together."
    )
    flags.DEFINE_integer("max_steps", None, "train.max_steps for every variant.")
    flags.DEFINE_float("max_minutes", None, "train.max_minutes for every variant.")
    flags.DEFINE_list("seeds", [], "Seeds to repeat every variant with (default config.seed).")
    flags.DEFINE_string("out", None, "Output folder (one workdir per variant + results).")
    flags.DEFINE_bool("memory", True, "Estimate each variant's training-step peak memory.")
    flags.DEFINE_bool("rerun", False, "Retrain variants that already have results.")
    flags.DEFINE_list("at_steps", [], "Also tabulate the periodic validation BPC at these steps.")


def console() -> None:
    cli.run_program(main, define_flags, __doc__)


if __name__ == "__main__":
    console()
