"""The GPU compile report's command line (benchmarks/gpu_report.py, benchmarks/hlo/deviceless.py).

The argument tests run everywhere. The tests marked
``gpu_compile`` compile the Pallas kernels for an H100 without a GPU; they need the JAX CUDA
plugin (a second venv, see benchmarks/README.md "GPU compile report") and skip without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from benchmark_scripts import BENCH, load
from hlo_cases import HIDDEN, HLO, SEQ
from kernel_cases import compile_deviceless

deviceless = load("hlo.deviceless")


report = load("gpu_report")
compare_reports = load("gpu_report_compare")


# ----------------------------------------------------------------------------- command line


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--impls=scan,cuda"], "--impls"),
        (["--dtypes=float16"], "--dtypes"),
        (["--models=lstm"], "--models"),
        (["--ranks=-1"], "--ranks"),
        (["--ranks=a"], "--ranks"),
        (["--set=depth=3"], "--set"),
        (["--launch-us=0"], "--launch-us"),
        (["--out=/nonexistent/dir/x.json"], "--out"),
    ],
)
def test_bad_arguments_are_one_line_errors_before_any_compile(argv, message, capsys):
    assert report.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err


def test_quick_mode_and_cases():
    args = report.parse_args(["--quick"])
    todo, opts = report.resolve(args)
    assert {(c.model, c.impl, c.rank) for c in todo} == {
        ("hyperrhn", "fused", 0),
        ("hyperrhn", "pallas", 0),
    }
    assert {c.dtype for c in todo} == {"float32", "bfloat16"}
    full, _ = report.resolve(report.parse_args([]))
    # rhn: 3 impls x 2 dtypes; hyperrhn: 2 ranks x 3 impls x 2 dtypes
    assert len(full) == 6 + 12
    assert opts.cost.launch_s == pytest.approx(4e-6)


def test_table_has_one_row_per_config():
    rows = [
        {
            "model": "hyperrhn",
            "impl": "pallas",
            "dtype": "float32",
            "hyper_rank": 4,
            "status": "unsupported",
        },
    ]
    text = report.format_table(rows)
    assert text.splitlines()[-1].split()[:5] == [
        "hyperrhn",
        "r4",
        "pallas",
        "float32",
        "unsupported",
    ]


# ----------------------------------------------------------------------------- H100 compile

_PLUGIN, _WHY = deviceless.cuda_plugin_available()
needs_cuda = pytest.mark.skipif(not _PLUGIN, reason=f"no JAX CUDA plugin here: {_WHY}")


@pytest.fixture(scope="module")
def kernel_report(tmp_path_factory):
    """The Pallas train step of a depth-3 HyperRHN at the paper widths (main n = 1000, hyper
    h = 128, batch 256: the kernels' shapes at the paper size; depth 3 has every kernel
    variant: the first micro-layer with the input projection, a middle one, the top one),
    2 time steps, compiled for an H100 in a fresh process (the deviceless environment must be
    set before JAX starts)."""
    out = tmp_path_factory.mktemp("gpu_report") / "kernels.json"
    cmd = [
        sys.executable,
        str(BENCH / "gpu_report.py"),
        "--models=hyperrhn",
        "--impls=pallas",
        "--ranks=0",
        "--dtypes=float32,bfloat16",
        "--set=model.depth=3",
        "--set=train.seq_len=2",
        f"--out={out}",
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=out.parent, env=dict(os.environ))
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(out.read_text())["rows"]


@pytest.mark.gpu_compile
@needs_cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_pallas_kernels_compile_for_h100_without_spills_or_smem_overflow(kernel_report, dtype):
    row = next(r for r in kernel_report if r["dtype"] == dtype)
    assert row["status"] == "ok", row.get("error", row)
    kernels = row["pallas_kernels"]
    names = {k["kernel"].split("__")[0] for k in kernels}
    # forward and backward kernels (hyper and main sizes) were found and measured
    assert any(n.startswith("highway_forward") for n in names), names
    assert any(n.startswith("highway_backward") for n in names), names
    assert all("registers" in k for k in kernels), "ptxas -v gave no register counts"
    spilled = [k for k in kernels if k["spills"]]
    assert not spilled, f"Pallas kernels spill registers at the default HighwayConfig: {spilled}"
    over = [k for k in kernels if k["smem_overflow"]]
    assert not over, f"Pallas kernels exceed the H100's 232448 B shared memory: {over}"


@pytest.mark.gpu_compile
@needs_cuda
def test_shared_memory_overflow_is_reported_as_a_compile_error(tmp_path):
    """The check can fail: a too-large block config must come back as a compile error.

    The kernels' own shared-memory check (`HighwayConfig.validate`) rejects the config before
    any compile, so the probe switches it off to reach XLA's compile; the probe exits non-zero
    if that method is gone or still rejects the config, and the error must come from the
    compile, not from the config check."""
    code = """
import sys
from rhhjax.kernels import triton as hw
mesh = g.h100_mesh()
config = hw.HighwayConfig(block_b=128, block_n=128, block_k=64, num_stages=4)
try:
    config.validate(jnp.float32)
    sys.exit("HighwayConfig.validate accepts the probe's config: no overflow to compile")
except hw.KernelConfigError:
    pass
geo = hw.Geometry.make(config, 256, 1000)  # n_pad = 1024
hw.HighwayConfig.validate = lambda self, dot_dtype=None: None  # reach the compile
def f(s, w3, z, bias2):
    return hw.forward_padded(s, w3, z, bias2, None, None, geo=geo, config=config)
try:
    args = sds((256, 1024)), sds((1024, 2, 1024)), sds((256, 1024)), sds((2, 1024))
    with g.lowering_device(mesh):
        lowered = jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",))
    lowered.compile()
    print(json.dumps({"compiled": True}))
except Exception as e:
    print(json.dumps({"compiled": False, "type": type(e).__name__,
                      "error": " ".join(str(e).split())[:500]}))
"""
    result, _ = compile_deviceless(code, tmp_path)  # fails where the probe could not run
    assert not result["compiled"]
    assert result["type"] != "KernelConfigError", result
    assert "shared memory" in result["error"].lower(), result["error"]


def test_reanalyze_recomputes_hlo_figures_from_saved_hlo(tmp_path, capsys):
    case = report.Case("hyperrhn", "fused", "float32", 0)
    hlo_dir = tmp_path / "hlo"
    hlo_dir.mkdir()
    report.hlo_file(str(hlo_dir), case).write_text(HLO)
    row = {"model": "hyperrhn", "impl": "fused", "dtype": "float32", "hyper_rank": 0}
    row.update(status="ok", seq_len=SEQ, hidden=HIDDEN, launches_per_step=-1, memory={})
    skipped = {"model": "rhn", "impl": "pallas", "dtype": "float32", "status": "unsupported"}
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"meta": {}, "rows": [row, skipped]}))
    out = tmp_path / "new.json"
    argv = [f"--reanalyze={old}", f"--save-hlo={hlo_dir}", f"--out={out}", "--launch-us=7"]
    assert report.main(argv) == 0
    new = json.loads(out.read_text())
    assert new["rows"][0]["launches_per_step"] == 18
    assert new["rows"][0]["launches_split"]["main_forward"] == 11
    assert new["rows"][1] == skipped
    assert new["meta"]["cost_model_parameters"]["launch_s"] == pytest.approx(7e-6)
    assert "hyperrhn r0 fused float32" in capsys.readouterr().out
    # a missing HLO file is a one-line error
    report.hlo_file(str(hlo_dir), case).unlink()
    assert report.main(argv) == 2


@pytest.mark.skipif(_PLUGIN, reason="the CUDA plugin is installed here")
def test_without_the_cuda_plugin_the_command_says_so_and_exits_2():
    run = subprocess.run(
        [sys.executable, str(BENCH / "gpu_report.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1].startswith("error: the JAX CUDA plugin")


def test_compare_table_pairs_configs_and_shows_before_and_after():
    def row(impl, launches, spill):
        return {
            "model": "hyperrhn", "hyper_rank": 0, "impl": impl, "dtype": "bfloat16",
            "status": "ok", "launches_per_step": launches,
            "launches_split": {"hyper_forward": 1, "hyper_backward": 2, "main_forward": 3,
                               "main_backward": 4},
            "weight_sized_ops_per_step": {"pad": 7, "convert": 2} if launches > 100 else {},
            "bytes_per_step": 5e6, "memory": {"peak_bytes": 7.5e9}, "predicted_step_ms": 40.0,
            "pallas_kernels": [{"registers": 90, "spill_stores": spill}],
        }  # fmt: skip

    table = compare_reports.compare(
        [row("pallas", 154, 8), row("fused", 129, 0)],
        [row("pallas", 56, 0), {"model": "rhn", "impl": "scan", "dtype": "f", "status": "ok"}],
    )
    lines = table.splitlines()
    assert len(lines) == 3  # header, separator, the one config in both reports
    assert "| hyperrhn r0 pallas bfloat16 | 154 -> 56 | 1 / 2 / 3 / 4 | 9 -> 0 |" in lines[2]
    assert "90 / 8 B -> 90 / 0 B" in lines[2]
