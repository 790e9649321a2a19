"""The driver: load every subject, run the requested analyses, write figures and JSON."""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import jax

from rhhjax import models, outputs
from rhhjax.analysis import figures
from rhhjax.analysis.gates import GATED_TYPES, can_trace_gates, gate_activity
from rhhjax.analysis.gradients import input_gradients
from rhhjax.analysis.lesion import lesion
from rhhjax.analysis.subjects import (
    AnalysisError,
    Subject,
    heldout_windows,
    parse_which,
    slug,
    subject_from_config,
    subject_from_workdir,
    to_float64,
)
from rhhjax.analysis.weights import weight_norms

ANALYSES = ("weights", "gradients", "gates", "lesion")
JSON_FILE = "analysis.json"


@dataclasses.dataclass
class Settings:
    """What to compute: the analyses, the held-out split and the sizes of each analysis."""

    analyses: tuple[str, ...] = ANALYSES
    split: str = "valid"
    seq_len: int = 100
    grad_sequences: int = 64
    gate_sequences: int = 4
    lesion_chars: int = 20_000
    batch_size: int = 32


def analyse(subject: Subject, settings: Settings, log: Callable[[str], None] = print) -> dict:
    mc = subject.config
    result = {
        "label": subject.label,
        "type": mc.type,
        "num_params": models.count_params(subject.params),
        "model": dataclasses.asdict(mc),
        "source": subject.source,
    }
    if "weights" in settings.analyses:
        start = time.time()
        depth = mc.depth if mc.type in GATED_TYPES else None
        result["weight_norms"] = weight_norms(subject.params, depth)
        log(f"  weight norms ({len(result['weight_norms'])} matrices, {time.time() - start:.1f}s)")
    if "gradients" in settings.analyses:
        start = time.time()
        result["input_gradients"] = input_gradients(
            subject, settings.grad_sequences, settings.seq_len, settings.batch_size
        )
        g = result["input_gradients"]["mean_norm"]
        log(f"  input gradients: t=0 {g[0]:.3g}, t=T-1 {g[-1]:.3g} ({time.time() - start:.1f}s)")
    if can_trace_gates(mc) and {"gates", "lesion"} & set(settings.analyses):
        _gates_and_lesion(subject, settings, result, log)
    return result


def _gates_and_lesion(subject: Subject, settings: Settings, result: dict, log) -> None:
    count = max(settings.gate_sequences, 1)
    gate_inputs, _, starts = heldout_windows(subject.tokens, count, settings.seq_len)
    if "gates" in settings.analyses:
        start = time.time()
        result["gates"] = gate_activity(subject, gate_inputs, settings.gate_sequences)
        result["gates"]["window_starts"] = starts.tolist()
        means = ", ".join(f"{v:.2f}" for v in result["gates"]["main"]["mean_per_layer"])
        log(f"  gates: mean per layer [{means}] ({time.time() - start:.1f}s)")
    if "lesion" in settings.analyses:
        start = time.time()
        result["lesion"] = lesion(
            subject, settings.lesion_chars, settings.seq_len, settings.batch_size, gate_inputs
        )
        deltas = ", ".join(
            f"{x['cell'][0]}{x['layer']} {x['delta_bpc']:+.3f}" for x in result["lesion"]["layers"]
        )
        log(
            f"  lesion (baseline {result['lesion']['baseline']['bpc']:.3f} BPC): {deltas} "
            f"({time.time() - start:.1f}s)"
        )


def write_outputs(results: list[dict], out: Path, prefix: str = "", meta: dict | None = None):
    """Figures and ``<prefix>analysis.json`` into ``out``, each written whole; returns the paths."""
    outputs.make_folder(out, "--out")
    written = []
    if any(r.get("weight_norms") for r in results):
        written.append(figures.plot_weight_norms(results, out / f"{prefix}weight_norms.png"))
    if any(r.get("input_gradients") for r in results):
        written.append(figures.plot_input_gradients(results, out / f"{prefix}input_gradients.png"))
    for r in results:
        if r.get("gates"):
            written.append(figures.plot_gates(r, out / f"{prefix}gates_{slug(r['label'])}.png"))
    if any(r.get("lesion") for r in results):
        written.append(figures.plot_lesion(results, out / f"{prefix}lesion.png"))
    path = out / f"{prefix}{JSON_FILE}"
    payload = {**(meta or {}), "models": results}
    outputs.write_text(path, json.dumps(payload, indent=1, allow_nan=True) + "\n", "--out")
    written.append(path)
    return written


def _check_arguments(settings: Settings, specs: list, labels: Sequence[str], checkpoint: str):
    for name in settings.analyses:
        if name not in ANALYSES:
            raise AnalysisError(f"unknown analysis {name!r}: expected {', '.join(ANALYSES)}")
    if not specs:
        raise AnalysisError("nothing to analyse: give --workdir and/or --init")
    if labels and len(labels) != len(specs):
        raise AnalysisError(f"{len(labels)} labels for {len(specs)} models")
    parse_which(checkpoint)


def run(
    workdirs: Sequence[str],
    inits: Sequence[str],
    out: str | Path,
    *,
    checkpoint: str = "best",
    settings: Settings | None = None,
    data_dir: str = "",
    impl: str = "scan",
    float64: bool = False,
    labels: Sequence[str] = (),
    prefix: str = "",
    log: Callable[[str], None] = print,
    command: str | None = None,
) -> list[Path]:
    """Load every subject, analyse it, write figures and JSON into ``out``."""
    settings = settings or Settings()
    specs = [("workdir", w) for w in workdirs] + [("init", c) for c in inits]
    _check_arguments(settings, specs, labels, checkpoint)
    outputs.check_folder(out, "--out")
    common = dict(split=settings.split, data_dir=data_dir, impl=impl)
    subjects = []
    for i, (kind, spec) in enumerate(specs):
        label = labels[i] if labels else ""
        if kind == "workdir":
            subjects.append(subject_from_workdir(spec, checkpoint, label=label, **common))
        else:
            subjects.append(subject_from_config(spec, label=label, **common))
    if float64:  # only after loading: see to_float64
        jax.config.update("jax_enable_x64", True)
        subjects = [to_float64(s) for s in subjects]
    results = []
    for (kind, spec), subject in zip(specs, subjects, strict=True):
        count = models.count_params(subject.params)
        log(f"{subject.label}: {subject.config.type}, {count:,} parameters ({kind} {spec})")
        results.append(analyse(subject, settings, log))
    meta = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": shlex.join(sys.argv) if command is None else command,
        "settings": dataclasses.asdict(settings),
        "jax_backend": jax.default_backend(),
        "float64": float64,
    }
    written = write_outputs(results, Path(out), prefix, meta)
    for path in written:
        log(f"wrote {path}")
    return written
