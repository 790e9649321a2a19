"""The training program (rhhjax/train/program.py: train.py, rhhjax-train, python -m
rhhjax.train): its default workdir, a missing --config as one line, --help. Signals and
resuming through the command line: tests/test_tools_command_lines.py."""

import os
import subprocess
import sys

import pytest
from helpers import PTB_CONFIG, ROOT

from rhhjax.train import program


@pytest.mark.parametrize(
    "config, workdir",
    [("configs/ptb.py:cpu", "workdirs/ptb_cpu"), ("ptb", "workdirs/ptb"),
     ("/x/enwik8.py", "workdirs/enwik8")],
)  # fmt: skip
def test_the_default_workdir_is_named_after_the_config(config, workdir):
    assert program.default_workdir(config) == workdir


def run(args):
    return subprocess.run(args, env=dict(os.environ), cwd=ROOT, capture_output=True, text=True,
                          timeout=240)  # fmt: skip


def test_a_missing_config_is_one_line():
    proc = run([sys.executable, str(ROOT / "train.py")])
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: --config is required, e.g. --config=ptb:cpu or --config=FILE.py"
    ]


def test_help_lists_variants_and_fields_and_exits_0():
    proc = run([sys.executable, str(ROOT / "train.py"), f"--config={PTB_CONFIG}:cpu", "--help"])
    assert proc.returncode == 0, proc.stderr
    assert "Exit status:" in proc.stdout and f"{PTB_CONFIG}:tiny" in proc.stdout
    assert "  model.depth = 3" in proc.stdout  # the cpu variant's value
    assert "  train.checkpoint_every_minutes = " in proc.stdout
