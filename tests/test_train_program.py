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


def test_a_second_run_on_a_workdir_in_use_is_refused_before_jax_is_imported(tmp_path):
    """A second train on a workdir in use was refused only after 17 s (the
    trainer takes the lock after loading data and initialising)."""
    import fcntl

    from helpers import write_text

    text = write_text(tmp_path / "t.txt", 10_000)
    workdir = tmp_path / "w"
    workdir.mkdir()
    with open(workdir / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("4242\n")
        held.flush()
        proc = run([sys.executable, "-X", "importtime", str(ROOT / "train.py"),
                    "--config=ptb:tiny", "--config.data.format=text",
                    f"--config.data.text_files={text}", f"--workdir={workdir}"])  # fmt: skip
    lines = proc.stderr.splitlines()
    errors = [line for line in lines if not line.startswith("import time:")]
    assert proc.returncode == 1 and errors == [
        f"error: workdir {workdir} is in use by another run (process 4242); wait for it to "
        f"finish or use another --workdir"
    ], proc.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import")}
    assert "jax" not in imported and "numpy" not in imported
    assert sorted(p.name for p in workdir.iterdir()) == [".lock"]  # nothing written


def test_train_py_of_a_checkout_shadowing_a_non_editable_install_says_pip_install_e(tmp_path):
    """``python train.py`` in a checkout whose rhhjax is installed
    non-editable failed with "No module named 'rhhjax.configs'" (the checkout's rhhjax/ comes
    first on the path and has no configs/). ``python -S`` leaves out the editable install's
    finder, as a non-editable install has none."""
    import shutil
    import sysconfig

    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT / "rhhjax", checkout / "rhhjax",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    shutil.copytree(ROOT / "configs", checkout / "configs")
    shutil.copy(ROOT / "train.py", checkout / "train.py")
    proc = subprocess.run(
        [sys.executable, "-S", "train.py", "--config=configs/ptb.py:tiny"],
        env={**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"]},
        cwd=checkout, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f"error: {checkout / 'rhhjax'} has no rhhjax.configs: this checkout is not installed "
        f"editable (a non-editable install does not serve its train.py): run pip install -e . "
        f"in {checkout}"
    ]


def test_the_install_check_passes_an_install_with_its_configs():
    program.check_install()  # this checkout: installed editable
    with pytest.raises(program.UserError, match=r"run pip install -e \. in "):
        program.check_install(find_spec=lambda name: None)
