"""What the installed project provides: the kernels and configs under the rhhjax namespace, no
top-level module named ``kernels`` (a PyPI package of that name exists), and none of the
benchmarks' tooling (benchmarks/hlo/ stays in the checkout)."""

import json
import os
import subprocess
import sys

PROBE = """
import importlib.util, json
import rhhjax.kernels.mosaic, rhhjax.configs.ptb
print(json.dumps({
    "kernels_top_level": importlib.util.find_spec("kernels") is not None,
    "configs_top_level": importlib.util.find_spec("configs") is not None,
    "mosaic": rhhjax.kernels.mosaic.__name__,
    "hlo": [importlib.util.find_spec(name) is not None for name in ("hlo", "rhhjax.hlo")],
    "ptb_variants": list(rhhjax.configs.ptb.VARIANTS),
}))
"""


def test_installed_namespace_has_kernels_and_configs_and_no_top_level_kernels(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # run outside the checkout, so only what is installed can be imported
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    found = json.loads(out.stdout)
    assert found == {
        "kernels_top_level": False,
        "configs_top_level": False,
        "mosaic": "rhhjax.kernels.mosaic",
        "hlo": [False, False],
        "ptb_variants": ["", "rhn", "lstm", "fast", "cpu", "tiny"],
    }


def _install(target, source):
    """``pip install --no-deps --no-build-isolation --target target`` of a copy of the
    project (pip builds in the source tree: the checkout stays untouched)."""
    import shutil
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in ("rhhjax", "configs", "kernels"):
        shutil.copytree(root / name, source / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), str(source)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip


def test_the_installed_commands_run_from_anywhere_with_a_config_name(tmp_path):
    """After pip install, outside the checkout: --config=configs/ptb.py was not found, there
    was no short name, no console command and no python -m rhhjax.train. A non-editable
    install into a folder, run from another folder, trains the ptb:tiny config by name."""
    from helpers import write_text

    target, cwd = tmp_path / "site", tmp_path / "elsewhere"
    _install(target, tmp_path / "source")
    cwd.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target)}
    where = subprocess.run(
        [sys.executable, "-c", "import rhhjax; print(rhhjax.__file__)"],
        cwd=cwd, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert where.stdout.strip() == str(target / "rhhjax" / "__init__.py")  # not the checkout's
    text = write_text(cwd / "input.txt", 3_000)
    train = [
        str(target / "bin" / "rhhjax-train"),
        "--config=ptb:tiny",
        "--config.data.format=text",
        f"--config.data.text_files={text.name}",
        "--config.train.max_steps=1",
        "--config.eval.final_protocols=",
    ]
    proc = subprocess.run(train, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (cwd / "workdirs" / "ptb_tiny" / "results.json").is_file()
    again = subprocess.run(
        [sys.executable, "-m", "rhhjax.train", *train[1:]],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert again.returncode == 0 and "already finished at step 1" in again.stdout, again.stderr
    for command in ("evaluate", "sample", "plot", "summary", "ablate", "analyze"):
        assert (target / "bin" / f"rhhjax-{command}").is_file()
    authors = target / "rhhjax" / "data" / "authors"  # the curves rhhjax-plot draws beside a run
    assert {p.name for p in authors.iterdir()} >= {"hyperrhn_curve.csv", "rhn_curve.csv"}


def test_the_readme_and_the_docs_name_every_console_command_and_both_routes():
    """The quick start shows the checkout's route and the installed one; every console
    command in pyproject.toml is named in the README and docs/operations.md."""
    from pathlib import Path

    import pytest

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    root = Path(__file__).resolve().parents[1]
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    readme = (root / "README.md").read_text()
    operations = (root / "docs" / "operations.md").read_text()
    programs = ("train", "evaluate", "sample", "plot", "summary", "ablate", "analyze")
    assert set(scripts) == {f"rhhjax-{name}" for name in programs}
    for command in scripts:
        assert f"`{command}`" in readme and f"`{command}`" in operations, command
    quick_start = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "python train.py --config=configs/ptb.py:cpu" in quick_start
    assert "rhhjax-train --config=ptb:cpu" in quick_start


def test_pyproject_lists_every_package_folder():
    """A package folder missing from [tool.setuptools] packages is left out of a non-editable
    install (the checkout's editable install finds it anyway)."""
    from pathlib import Path

    import pytest

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    root = Path(__file__).resolve().parents[1]
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {
        "rhhjax": root / "rhhjax",
        **{k: root / v for k, v in setuptools["package-dir"].items()},
    }
    found = set()
    for name, folder in folders.items():
        for init in folder.rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                parts = init.parent.relative_to(folder).parts
                found.add(".".join((name, *parts)))
    assert sorted(setuptools["packages"]) == sorted(found)
