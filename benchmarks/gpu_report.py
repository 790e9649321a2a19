"""H100 compile report without a GPU: the real training step, compiled by XLA for an H100.

    /opt/venv-cuda/bin/python benchmarks/gpu_report.py --out=results/gpu_report_h100.json
    /opt/venv-cuda/bin/python benchmarks/gpu_report.py --quick --set=model.depth=2
    # keep the optimised HLO, then re-read it (new parser / cost model) without compiling
    /opt/venv-cuda/bin/python benchmarks/gpu_report.py --save-hlo=DIR --out=r.json
    python benchmarks/gpu_report.py --reanalyze=r.json --save-hlo=DIR --launch-us=2 --out=r2.json

For every impl x dtype x model (``hyperrhn`` once per ``--ranks`` value) it compiles
``rhhjax.train.step.make_train_step`` (model and optimizer from ``configs/ptb.py``) for a
compile-only H100 and reports launches per time step, in-loop data movement, bytes per
step, compiled peak memory and a predicted step time from a stated cost model (setup and
definitions: benchmarks/README.md). ``hlo/deviceless.py`` compiles, ``hlo/dumps.py`` reads
ptxas and the thunk sequence, ``hlo/launches.py`` / ``hlo/cost.py`` count and predict, this
file is the command line and the table. A config the model config rejects is a row with
``status: "unsupported"``, a compile error one with ``status: "compile_error"``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from hlo import cost as hlo_cost
from hlo.deviceless import (
    DTYPES,
    IMPL_CHOICES,
    IMPLS,
    MODELS,
    Case,
    ReportError,
    build_configs,
    capture_fd2,
    cases,
    compile_step,
    cuda_plugin_available,
    h100_mesh,
    set_deviceless_env,
)
from hlo.dumps import thunk_check

from rhhjax.errors import UserError

# ----------------------------------------------------------------------------- one row


@dataclasses.dataclass
class Options:
    overrides: dict
    cost: hlo_cost.CostModel
    keep_dumps: str = ""  # directory to keep XLA's dumps in ("" = temporary)
    save_hlo: str = ""  # directory to write each config's optimised HLO text to


def run_case(case: Case, mesh, opts: Options) -> dict:
    """Compile one config and summarise it; never raises for a config or compile error."""

    row: dict = {"model": case.model, "impl": case.impl, "dtype": case.dtype}
    if case.model == "hyperrhn":
        row["hyper_rank"] = case.rank
    try:
        mc, oc, seed, batch, seq_len = build_configs(case, opts.overrides)
    except UserError as e:
        return {**row, "status": "unsupported", "reason": str(e)}
    row.update(batch=batch, seq_len=seq_len, depth=mc.depth, hidden=mc.hidden)
    if case.model == "hyperrhn":
        row["hyper_hidden"] = mc.hyper_hidden
    dump_root = opts.keep_dumps or tempfile.mkdtemp(prefix="rhhjax_gpu_report_")
    dump_dir = os.path.join(dump_root, re.sub(r"\W+", "_", case.label))
    # The PTX of every kernel (ptxas -v below): since jax 0.11 XLA writes it only for the
    # "ptx" emitter, if xla_dump_emitter_re names it (0.10.2 always did).
    options = {
        "xla_dump_to": dump_dir,
        "xla_dump_hlo_module_re": "step_fn",
        "xla_dump_emitter_re": "ptx",
    }
    try:
        with capture_fd2() as log:
            compiled, seconds = compile_step(mc, oc, seed, batch, seq_len, mesh, options)
    except Exception as e:  # a compile error is a result of the report, not a crash
        msg = " ".join(str(e).split())
        smem = re.search(r"[Ss]hared memory[^.]*?(\d{4,})[^.]*?(\d{4,})", msg)
        out = {**row, "status": "compile_error", "error": msg[:2000]}
        if smem:
            out["smem_requested"], out["smem_available"] = int(smem.group(1)), int(smem.group(2))
        out["compile_log_tail"] = log[0][-2000:]
        if not opts.keep_dumps:
            shutil.rmtree(dump_root, ignore_errors=True)
        return out
    text = compiled.as_text()
    if opts.save_hlo:
        Path(opts.save_hlo).mkdir(parents=True, exist_ok=True)
        hlo_file(opts.save_hlo, case).write_text(text)
    summary = hlo_cost.summarize(text, seq_len, mc.hidden, opts.cost)
    mem = compiled.memory_analysis()
    thunks = thunk_check(dump_dir, summary, text)
    if not opts.keep_dumps:
        shutil.rmtree(dump_root, ignore_errors=True)
    peak = None
    if mem is not None:
        from rhhjax.train.step import peak_bytes  # jax is initialised by now

        peak = getattr(mem, "peak_memory_in_bytes", None) or peak_bytes(mem)
    return {
        **row,
        "status": "ok",
        "compile_s": round(seconds, 1),
        **summary,
        "memory": {
            "peak_bytes": int(peak) if peak is not None else None,
            "argument_bytes": getattr(mem, "argument_size_in_bytes", None),
            "output_bytes": getattr(mem, "output_size_in_bytes", None),
            "alias_bytes": getattr(mem, "alias_size_in_bytes", None),
            "temp_bytes": getattr(mem, "temp_size_in_bytes", None),
        },
        "thunks": thunks,
    }


# ----------------------------------------------------------------------------- output


def format_table(rows: list[dict]) -> str:
    """One line per row: launches per time step (total; hyper fwd / hyper bwd / main fwd /
    main bwd), in-loop launches that only pad / convert / copy, launches containing a pad,
    launches that pad / convert a weight-sized array, MB moved per time step, GB per training
    step (old / corrected rule), compiled peak memory, predicted step time."""
    head = (
        f"{'config':<28} {'status':<13} {'launch/step':>11} {'hf/hb/mf/mb':>15} "
        f"{'pad/cvt/copy':>12} {'w/pad':>5} {'W pad/cvt':>9} {'MB/step':>8} "
        f"{'GB/train step':>15} {'peak GB':>7} {'pred ms':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        label = Case(r["model"], r["impl"], r["dtype"], r.get("hyper_rank", 0)).label
        if r["status"] != "ok":
            lines.append(f"{label:<28} {r['status']:<13}")
            continue
        sp = r["launches_split"]
        split = "/".join(
            str(sp.get(k, 0))
            for k in ("hyper_forward", "hyper_backward", "main_forward", "main_backward")
        )
        mv = r["movement_per_step"]
        moves = f"{mv.get('pad', 0)}/{mv.get('convert', 0)}/{mv.get('copy', 0)}"
        wo = r.get("weight_sized_ops_per_step", {})
        wmoves = f"{wo.get('pad', 0)}/{wo.get('convert', 0)}"
        peak = (r.get("memory") or {}).get("peak_bytes")
        peak_gb = f"{peak / 1e9:.2f}" if peak else "?"
        step_gb = (
            f"{r['bytes_per_train_step'] / 1e9:.1f}/{r['bytes_per_train_step_read'] / 1e9:.1f}"
        )
        lines.append(
            f"{label:<28} {r['status']:<13} {r['launches_per_step']:>11} {split:>15} "
            f"{moves:>12} {r['launches_with_op_per_step'].get('pad', 0):>5} {wmoves:>9} "
            f"{r['bytes_per_step'] / 1e6:>8.1f} {step_gb:>15} {peak_gb:>7} "
            f"{r['predicted_step_ms']:>8.2f}"
        )
    return "\n".join(lines)


# The summary's fields (hlo_cost.DEFINITIONS), then the report's own.
DEFINITIONS = {
    **hlo_cost.DEFINITIONS,
    "thunks": "cross-check from XLA's dumped thunk sequence (after thunk passes): thunks "
    "per iteration in each time loop's body (what the GPU runs; matched = equal to the HLO "
    "count) and whether the body is a command buffer (CUDA graph)",
    "memory.peak_bytes": "compiled.memory_analysis(): arguments + outputs - aliased + temps",
}


def _parse_list(value: str, allowed: tuple, name: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise ReportError(f"--{name}={value!r}: each must be one of {', '.join(allowed)}")
    return items


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="", help="write the rows as JSON to this file")
    p.add_argument("--impls", default=",".join(IMPLS), help=f"of {','.join(IMPL_CHOICES)}")
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--ranks", default="0,4", help="hyper ranks of the hyperrhn rows")
    p.add_argument(
        "--quick",
        action="store_true",
        help="fast iteration: hyperrhn rank 0, fused and persistent, both dtypes (unless "
        "--impls/--dtypes/--models/--ranks are given)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="config override, e.g. --set=model.depth=2 --set=train.seq_len=10 (int/float)",
    )
    p.add_argument("--launch-us", type=float, default=4.0, help="assumed cost per launch")
    p.add_argument("--hbm-gbs", type=float, default=3350.0, help="assumed HBM GB/s")
    p.add_argument("--bf16-tflops", type=float, default=989.0, help="assumed bf16 rate")
    p.add_argument("--f32-mm-tflops", type=float, default=494.7, help="assumed f32 gemm rate")
    p.add_argument("--f32-simt-tflops", type=float, default=66.9, help="assumed f32 SIMT rate")
    p.add_argument("--keep-dumps", default="", help="keep XLA's dumps in this directory")
    p.add_argument("--save-hlo", default="", help="write each optimised HLO text here")
    p.add_argument(
        "--reanalyze",
        default="",
        metavar="JSON",
        help="recompute the HLO figures of a report's rows from the HLO texts in --save-hlo "
        "(no compile; compile time, memory and thunk figures are kept)",
    )
    args = p.parse_args(argv)
    explicit = {a.split("=")[0] for a in (argv if argv is not None else sys.argv[1:])}
    if args.quick:
        if "--models" not in explicit:
            args.models = "hyperrhn"
        if "--impls" not in explicit:
            args.impls = "fused,persistent"
        if "--ranks" not in explicit:
            args.ranks = "0"
    return args


def _override_value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def resolve(args: argparse.Namespace) -> tuple[list[Case], Options]:
    """Validated cases and options; raises ReportError (one line) before any compile."""
    models = _parse_list(args.models, MODELS, "models")
    impls = _parse_list(args.impls, IMPL_CHOICES, "impls")
    dtypes = _parse_list(args.dtypes, DTYPES, "dtypes")
    try:
        ranks = [int(r) for r in args.ranks.split(",") if r.strip()]
    except ValueError:
        raise ReportError(f"--ranks={args.ranks!r} must be comma-separated integers") from None
    if not ranks or any(r < 0 for r in ranks):
        raise ReportError(f"--ranks={args.ranks!r} must be non-negative integers")
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or "." not in key or key.split(".")[0] not in ("model", "train"):
            raise ReportError(f"--set={item!r} must be model.KEY=VALUE or train.KEY=VALUE")
        overrides[key] = _override_value(value)
    rates = ("bf16_tflops", "f32_mm_tflops", "f32_simt_tflops")
    for name in ("launch_us", "hbm_gbs", *rates):
        if not getattr(args, name) > 0:
            raise ReportError(f"--{name.replace('_', '-')} must be > 0")
    if args.out and not Path(args.out).resolve().parent.is_dir():
        raise ReportError(f"--out={args.out}: directory does not exist")
    cost = hlo_cost.CostModel(
        bf16_matmul_flops=args.bf16_tflops * 1e12,
        f32_matmul_flops=args.f32_mm_tflops * 1e12,
        f32_simt_flops=args.f32_simt_tflops * 1e12,
        hbm_bytes_per_s=args.hbm_gbs * 1e9,
        launch_s=args.launch_us * 1e-6,
    )
    opts = Options(overrides, cost, args.keep_dumps, args.save_hlo)
    return cases(models, impls, dtypes, ranks), opts


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        todo, opts = resolve(args)
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.reanalyze:
        return reanalyze(args.reanalyze, opts, args.out)
    set_deviceless_env()  # before the plugin or jax initialise anything
    ok, why = cuda_plugin_available()
    if not ok:
        print(f"error: {why}", file=sys.stderr)
        return 2
    import jax

    mesh = h100_mesh()
    rows = []
    for case in todo:
        print(f"compiling {case.label} ...", file=sys.stderr, flush=True)
        row = run_case(case, mesh, opts)
        rows.append(row)
        print(format_table([row]).splitlines()[-1], file=sys.stderr, flush=True)
        if args.out:
            write_json(args.out, rows, opts, jax)
    print(format_table(rows))
    if args.out:  # written after each row
        print(f"wrote {args.out}")
    return 0


def hlo_file(directory: str, case: Case) -> Path:
    return Path(directory) / (re.sub(r"\W+", "_", case.label) + ".hlo.txt")


def reanalyze(report_json: str, opts: Options, out: str) -> int:
    """Recompute the HLO-derived fields of a report from saved HLO texts (no compile)."""
    if not opts.save_hlo:
        print("error: --reanalyze needs --save-hlo=DIR (where the HLO texts are)", file=sys.stderr)
        return 2
    try:
        report = json.loads(Path(report_json).read_text())
    except (OSError, json.JSONDecodeError) as e:
        print(f"error: cannot read {report_json}: {e}", file=sys.stderr)
        return 2
    for row in report["rows"]:
        if row.get("status") != "ok":
            continue
        case = Case(row["model"], row["impl"], row["dtype"], row.get("hyper_rank", 0))
        path = hlo_file(opts.save_hlo, case)
        if not path.exists():
            print(f"error: {path} not found", file=sys.stderr)
            return 2
        text = path.read_text()
        row.update(hlo_cost.summarize(text, row["seq_len"], row["hidden"], opts.cost))
    meta = report["meta"]
    meta["cost_model_parameters"] = dataclasses.asdict(opts.cost)
    meta["assumptions"], meta["definitions"] = hlo_cost.ASSUMPTIONS, DEFINITIONS
    meta["reanalyzed"] = " ".join([Path(sys.executable).name, *sys.argv])
    print(format_table(report["rows"]))
    if out:
        Path(out).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {out}")
    return 0


def write_json(path: str, rows: list[dict], opts: Options, jax) -> None:
    import rhhjax
    from rhhjax.ops import persistent

    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "host": f"{platform.node()} ({os.cpu_count()} CPUs, no GPU)",
        "jax": jax.__version__,
        "target": "NVIDIA H100 80GB HBM3 (compile-only topology, sm_90a)",
        "source_tree": str(Path(rhhjax.__file__).resolve().parents[1]),
        "git_commit": _git_commit(Path(rhhjax.__file__).resolve().parents[1]),
        "overrides": opts.overrides,
        "persistent_variant": persistent.PersistentVariant().text(),
        "cost_model_parameters": dataclasses.asdict(opts.cost),
        "assumptions": hlo_cost.ASSUMPTIONS,
        "definitions": DEFINITIONS,
    }
    Path(path).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")


def _git_commit(tree: Path) -> str:
    run = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    return run.stdout.strip() if run.returncode == 0 else ""


if __name__ == "__main__":
    sys.exit(main())
