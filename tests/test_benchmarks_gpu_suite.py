"""benchmarks/gpu_suite.sh without a GPU: its modes are the ones its header and
benchmarks/README.md describe, and a wrong mode is one usage line before anything runs.
(`bash benchmarks/gpu_suite.sh dry-run` rehearses every mode on a CPU in minutes.)"""

import re
import subprocess

from benchmark_scripts import BENCH

SUITE = BENCH / "gpu_suite.sh"


def _modes() -> list[str]:
    """The modes the script accepts: its first `case` line's alternatives."""
    line = next(line for line in SUITE.read_text().splitlines() if line.strip().endswith(") ;;"))
    return [mode.strip() for mode in line.strip().removesuffix(") ;;").split("|")]


def test_every_mode_is_in_the_header_and_the_readme():
    modes = _modes()
    assert modes == ["test", "tune", "bench", "profile", "train", "dry-run"]
    header = "".join(line for line in SUITE.read_text().splitlines() if line.startswith("#"))
    readme = (BENCH / "README.md").read_text()
    for mode in modes:
        assert re.search(rf"gpu_suite\.sh {mode}\b", header), mode
        assert f"gpu_suite.sh {mode}`" in readme, mode


def test_a_wrong_mode_is_one_usage_line_and_exit_2_before_anything_runs(tmp_path):
    out = tmp_path / "out"
    for argv in ([], ["check"], ["all"]):
        run = subprocess.run(
            ["bash", str(SUITE), *argv], env={"OUT": str(out), "PATH": "/usr/bin:/bin"},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert run.returncode == 2 and run.stdout == "", run.stderr
        assert run.stderr.startswith("usage: bash benchmarks/gpu_suite.sh test|")
        assert len(run.stderr.splitlines()) == 1 and not out.exists()
