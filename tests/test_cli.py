"""rhhjax.cli: the help's default config, field hints and the JAX_PLATFORMS check,
in-process; and the one-line outputs of the programs as a user runs them (subprocesses: a
GPU platform asked of a CPU-only install, analyze's shared flag handling)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import PTB_CONFIG, ROOT
from test_analysis_subjects import make_workdir

from rhhjax import cli, configs
from rhhjax.errors import UserError

HAS_CUDA_PLUGIN = any("cuda" in name for name in cli.jax_plugins())


def run(args: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        env={**os.environ, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


# ----------------------------------------------------------------------------- help


def test_help_without_config_lists_the_installed_default_config():
    text = cli.help_text("Doc.", ["prog"])
    assert "cannot list" not in text
    assert "Variants of ptb: ptb, ptb:rhn" in text
    assert "Config fields of ptb " in text
    default = configs.load("ptb")
    assert f"  model.depth = {default.model.depth!r}" in text
    assert f"  train.learning_rate = {default.train.learning_rate!r}" in text


def test_help_of_a_given_config_file_lists_its_variant():
    text = cli.help_text("Doc.", ["prog", f"--config={PTB_CONFIG}:cpu"])
    assert f"  model.depth = {configs.load('ptb:cpu').model.depth!r}" in text
    missing = cli.help_text("Doc.", ["prog", "--config=nowhere/x.py"])
    assert "(cannot list the config fields: config file nowhere/x.py not found (or " in missing


# a few of each console command's own flags (its define_flags)
OWN_FLAGS = {
    "train": ["--config", "--workdir"],
    "evaluate": ["--workdir", "--split", "--text_files", "--data_dir", "--output"],
    "sample": ["--workdir", "--prompt", "--temperature", "--output"],
    "plot": ["--out", "--x", "--title"],
    "summary": ["--config"],
    "ablate": ["--config", "--sweep", "--variant", "--max_steps", "--at_steps", "--out"],
    "analyze": ["--workdir", "--lesion_chars", "--out"],
}


def test_every_console_command_help_lists_its_own_flags():
    """``rhhjax-evaluate --help`` (and sample, plot, analyze, ablate,
    summary) printed "Flags:" and nothing: absl's main-module help looks for flags defined in
    the console script, which defines none (``python -m`` found them)."""
    scripts = {name: Path(sys.executable).parent / f"rhhjax-{name}" for name in OWN_FLAGS}
    missing = [str(path) for path in scripts.values() if not path.is_file()]
    if missing:
        pytest.skip(f"console commands not installed: {', '.join(missing)}")
    procs = {
        name: subprocess.Popen([str(path), "--help"], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        for name, path in scripts.items()
    }  # fmt: skip
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, (name, err)
        flags_part = out.split("\nFlags:\n", 1)[1]
        for flag in OWN_FLAGS[name]:
            assert f"  {flag}: " in flags_part or f"  {flag} " in flags_part, (name, flag, out)


def _installed_copy(site: Path) -> None:
    """The package as a non-editable install lays it out (pyproject's packages and
    package-dir: configs/ becomes rhhjax/configs/), under ``site``."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = setup.get("package-dir", {})
    for package in setup["packages"]:
        # setuptools maps a package by the longest prefix in package-dir (rhhjax.kernels.mosaic
        # lies in kernels/mosaic/), else by its name
        prefix = max((p for p in folders if package == p or package.startswith(p + ".")),
                     key=len, default="")  # fmt: skip
        rest = package[len(prefix) :].lstrip(".").replace(".", "/")
        source = ROOT / folders[prefix] / rest if prefix else ROOT / rest
        target = site / package.replace(".", "/")
        target.mkdir(parents=True)
        for file in source.glob("*.py"):
            shutil.copy(file, target / file.name)


def test_help_lists_the_default_config_of_a_non_editable_install(tmp_path):
    _installed_copy(tmp_path / "site")
    code = "import rhhjax, sys; from rhhjax import cli; print(rhhjax.__file__); "
    code += "sys.stdout.write(cli.help_text('Doc.', ['prog']))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert out.startswith(str(tmp_path / "site" / "rhhjax" / "__init__.py"))  # not the checkout
    assert "Config fields of ptb " in out and "  model.depth = " in out


def test_an_installed_config_is_named_by_its_name_and_a_path_stays_a_path():
    """Outside the checkout --config=configs/ptb.py is not found and there was no short name."""
    resolved = cli.resolve_config_argument("ptb:cpu")
    assert resolved == f"{Path(configs.__file__).parent / 'ptb.py'}:cpu"
    assert cli.resolve_config_argument("enwik8").endswith("/enwik8.py")
    for kept in ("configs/ptb.py:cpu", "my.py", "wiki:x"):
        assert cli.resolve_config_argument(kept) == kept
    module, config = cli.load_config_file("ptb:tiny")
    assert config.to_dict() == configs.load("ptb:tiny").to_dict()
    assert cli.with_config_files(["p", "--config=ptb", "--config.model.depth=2"])[1:] == [
        f"--config={Path(configs.__file__).parent / 'ptb.py'}",
        "--config.model.depth=2",
    ]


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["p", "--config.train.max_steps=1"],
            "--config.train.max_steps=1 needs --config first, e.g. --config=ptb:cpu "
            "--config.train.max_steps=1 (--config=NAME[:VARIANT] of an installed config, or a "
            "file)",
        ),
        (
            ["p", "--config.model.depth=2", "--config=ptb"],
            "--config.model.depth=2 comes before --config: give --config first",
        ),
    ],
)
def test_an_override_without_config_first_says_config_comes_first(argv, message):
    """It said "Unknown command line flag 'config.train.max_steps'"."""
    with pytest.raises(cli.ConfigArgumentError) as info:
        cli.check_config_arguments(argv)
    assert str(info.value) == message
    cli.check_config_arguments(["p", "--config=ptb", "--config.model.depth=2"])  # the order


# ----------------------------------------------------------------------------- field hints


def test_check_override_names_the_unknown_part_and_its_closest_field():
    """The hint itself is rhhjax.config_fields' (tests/test_config_fields.py)."""
    config = configs.load("ptb")
    cli.check_override(config, "model.depth")
    for name, message in [
        ("model.dept", "unknown config field model.dept (did you mean model.depth?)"),
        ("modle.depth", "unknown config field modle (did you mean model?)"),
        ("model.zzzzzz", "unknown config field model.zzzzzz"),
        (
            "model.depth.x",
            "config field model.depth is a value, not a section: cannot set model.depth.x",
        ),
    ]:
        with pytest.raises(cli.ConfigArgumentError) as info:
            cli.check_override(config, name)
        assert str(info.value) == message


# ----------------------------------------------------------------------------- JAX_PLATFORMS


@pytest.mark.parametrize("value", ["cuda", "gpu", "CUDA", "cuda,rocm"])
def test_gpu_platform_without_its_plugin_is_one_line_naming_the_install(value):
    with pytest.raises(UserError) as info:
        cli.check_platforms(value, plugins=set())
    message = str(info.value)
    assert "\n" not in message
    assert f"JAX_PLATFORMS={value} " in message and "no " in message
    assert 'pip install -e ".[cuda12]"' in message and "unset JAX_PLATFORMS" in message


@pytest.mark.parametrize(
    "value, plugins",
    [
        ("", set()),
        ("cpu", set()),
        ("cuda,cpu", set()),  # JAX falls back to the CPU
        ("cuda", {"jax_plugins.xla_cuda12"}),
        ("gpu", {"jax_cuda13_plugin"}),
        ("rocm", {"jax_plugins.xla_rocm7"}),
        ("metal", set()),  # a platform the check does not know: JAX decides
    ],
)
def test_platforms_that_can_start_pass_the_check(value, plugins):
    cli.check_platforms(value, plugins=plugins)


def test_tpu_without_libtpu_names_its_install(monkeypatch):
    monkeypatch.setattr(cli.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError, match=r'pip install "jax\[tpu\]"'):
        cli.check_platforms("tpu", plugins=set())


def test_backend_that_fails_to_start_is_one_line(monkeypatch):
    # JAX's failure when the plugin is installed but cannot start (no GPU visible): an
    # AssertionError raised in jax/_src/xla_bridge.py.
    code = compile("def backends():\n    assert None is not None\n", "xla_bridge.py", "exec")
    namespace: dict = {}
    exec(code, namespace)
    try:
        namespace["backends"]()
    except AssertionError as e:
        error = e
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    line = cli.backend_failure(error)
    assert line.startswith("JAX_PLATFORMS=cuda: JAX could not start that backend") and (
        "\n" not in line
    )
    assert cli.backend_failure(AssertionError("a bug elsewhere")) is None
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert cli.backend_failure(error) is None


@pytest.mark.skipif(HAS_CUDA_PLUGIN, reason="JAX's CUDA plugin is installed here")
@pytest.mark.parametrize(
    "args",
    [
        ["train.py", f"--config={PTB_CONFIG}:tiny", "--workdir=/nonexistent/w"],
        ["-m", "rhhjax.tools.evaluate", "--workdir=/nonexistent/w"],
    ],
    ids=["train", "evaluate"],
)
def test_cuda_platform_on_a_cpu_only_install_is_one_line(args):
    proc = run(args, JAX_PLATFORMS="cuda")
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "error: JAX_PLATFORMS=cuda but this JAX has no cuda backend installed (CPU only): "
        'install the CUDA one with pip install -e ".[cuda12]" (NVIDIA GPUs), or unset '
        "JAX_PLATFORMS to run on the CPU"
    ]


# ----------------------------------------------------------------------------- analyze


def test_analyze_help_exits_0_and_lists_its_flags():
    proc = run(["-m", "rhhjax.tools.analyze", "--help"])
    assert proc.returncode == 0, proc.stderr
    assert "--workdir" in proc.stdout and "--lesion_chars" in proc.stdout


def test_analyze_errors_are_one_line(tmp_path):
    workdir, _ = make_workdir(tmp_path, "rhn")  # a best checkpoint of step 7
    out = tmp_path / "out"
    typo = run(["-m", "rhhjax.tools.analyze", f"--wrkdir={workdir}", f"--out={out}"])
    assert typo.returncode == 1
    assert typo.stderr.splitlines() == [
        "error: Unknown command line flag 'wrkdir'. Did you mean: workdir ?"
    ]
    step = run(["-m", "rhhjax.tools.analyze", f"--workdir={workdir}@999", f"--out={out}"])
    assert step.returncode == 1
    assert step.stderr.splitlines() == [
        f"error: no checkpoint of step 999 in {workdir} (saved: best/7)"
    ]
    assert step.stdout == "" and not out.exists()
