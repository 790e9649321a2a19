"""The sample program (`rhhjax.tools.sample`) on the shared trained run: seeded, and greedy at
temperature 0.
"""

from __future__ import annotations

import subprocess
import sys

import train_cases

from rhhjax.tools import sample

text_file = train_cases.text_file  # a shared fixture (tests/train_cases.py)
trained = train_cases.trained  # a shared fixture (tests/train_cases.py)


def test_sample_from_checkpoint(trained):
    workdir, _, _, _ = trained
    a = sample.run(str(workdir), "the ", 40, 0.8, seed=0)
    b = sample.run(str(workdir), "the ", 40, 0.8, seed=0)
    assert a == b and a.startswith("the ") and len(a) == 44
    # "Thou": characters of Tiny Shakespeare and of the stand-in text used without shared/.
    greedy = sample.run(str(workdir), "Thou", 10, 0.0, seed=1)
    assert greedy == sample.run(str(workdir), "Thou", 10, 0.0, seed=2)  # seed-free


def test_sample_help_keeps_its_line_breaks():
    proc = subprocess.run(
        [sys.executable, "-m", "rhhjax.tools.sample", "--help"], capture_output=True, text=True
    )
    assert "--length=300 \\\n        --temperature=0.8" in proc.stdout, proc.stdout[:600]
