"""`python -m rhhjax.tools.summary`: the parameter table."""

import subprocess
import sys
from pathlib import Path

from rhhjax import models
from rhhjax.tools import summary

ROOT = Path(__file__).resolve().parents[1]


def test_rows_add_up_to_the_paper_count_and_table_ends_with_total():
    rows = summary.parameter_rows(models.ModelConfig())
    assert sum(size for _, _, size in rows) == 15_262_736
    assert ("core/cell/main/kernel_s", (7, 1000, 2000), 14_000_000) in rows
    assert summary.format_table(rows).splitlines()[-1] == "total_params 15262736"


def test_command_line_prints_total_and_rejects_bad_config():
    ok = subprocess.run(
        [sys.executable, "-m", "rhhjax.tools.summary", "--config=configs/ptb.py:rhn"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert ok.stdout.strip().splitlines()[-1] == "total_params 14121400"
    command = [sys.executable, "-m", "rhhjax.tools.summary", "--config=configs/ptb.py"]
    bad = subprocess.run(
        [*command, "--config.model.depth=0"], cwd=ROOT, capture_output=True, text=True
    )
    assert bad.returncode != 0
    assert bad.stderr.strip().splitlines()[-1] == "error: model.depth=0 must be a positive integer"
