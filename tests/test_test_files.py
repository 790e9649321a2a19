"""The tests mirror the package: every module has its own test file, named by its path
(``rhhjax/<package>/<module>.py`` -> ``tests/test_<package>_<module>.py``,
``rhhjax/<module>.py`` -> ``test_<module>.py``, ``kernels/mosaic/<module>.py`` ->
``test_kernels_mosaic_<module>.py``, a package's ``__init__.py`` -> ``test_<package>.py``),
or is listed in ``WITHOUT_A_TEST_FILE`` below with the reason. A new module without either
fails here; so does an entry whose module is gone or has a test file by now."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
# The folders of the installed package, and the name each has under rhhjax.
SOURCES = {"rhhjax": "", "kernels": "kernels", "configs": "configs"}

FACE = "the package's face: a docstring naming its modules and re-exports of their names"
WITHOUT_A_TEST_FILE = {
    "rhhjax/__init__.py": FACE,
    "rhhjax/analysis/__init__.py": FACE,
    "rhhjax/data/__init__.py": FACE,
    "rhhjax/models/__init__.py": FACE,
    "rhhjax/ops/__init__.py": FACE,
    "rhhjax/train/__init__.py": FACE,
    "kernels/mosaic/__init__.py": FACE + "; its modules have their files",
    "rhhjax/tools/__init__.py": FACE,
    "kernels/__init__.py": FACE,
    "rhhjax/train/__main__.py": "python -m rhhjax.train, which calls trainer.console: run by "
    "tests/test_packaging.py",
    "configs/ptb.py": "a config file: tests/test_configs.py loads every config and variant",
    "configs/hutter.py": "the recipe of enwik8 and text8: tests/test_configs.py",
    "configs/enwik8.py": "a config file: tests/test_configs.py",
    "configs/text8.py": "a config file: tests/test_configs.py",
    "kernels/mosaic/persistent_cell.py": "the phase of the persistent forward kernel's cells, "
    "run by its tests (tests/test_kernels_mosaic_persistent_forward_run.py)",
    "kernels/mosaic/persistent_backward_cell.py": "the phase of the persistent backward "
    "kernel's cells, run by its tests (tests/test_kernels_mosaic_persistent_backward_run.py)",
    "kernels/mosaic/persistent_backward_operands.py": "the persistent backward kernel's "
    "operands, checks and shared-memory count, tested with the kernel "
    "(tests/test_kernels_mosaic_persistent_backward.py)",
}


def modules() -> list[str]:
    """Every module of the package, as a path from the repository's root."""
    found = []
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" not in path.parts:
                found.append(path.relative_to(ROOT).as_posix())
    return found


def expected_test_file(module: str) -> str:
    """The test file named by ``module``'s path."""
    folder, *rest = module[: -len(".py")].split("/")
    parts = [SOURCES[folder], *rest]
    parts = [p for p in parts if p and p != "__init__"]
    return "test_" + "_".join(p.strip("_") for p in parts) + ".py"


def test_every_module_has_its_test_file_or_a_reason():
    missing = [
        f"{m} (no tests/{expected_test_file(m)})"
        for m in modules()
        if not (TESTS / expected_test_file(m)).is_file() and m not in WITHOUT_A_TEST_FILE
    ]
    assert not missing, "add the test file, or the module and why to WITHOUT_A_TEST_FILE"


def test_the_list_holds_only_modules_without_a_test_file():
    present = set(modules())
    for module, reason in WITHOUT_A_TEST_FILE.items():
        assert module in present, f"{module} is gone: remove it from the list"
        assert not (TESTS / expected_test_file(module)).is_file(), f"{module} has its test file now"
        for named in re.findall(r"tests/(\w+\.py)", reason):
            assert (TESTS / named).is_file(), f"{module}: {named} does not exist"


def test_the_names_follow_the_paths():
    assert expected_test_file("rhhjax/ops/fused.py") == "test_ops_fused.py"
    assert expected_test_file("rhhjax/errors.py") == "test_errors.py"
    assert expected_test_file("kernels/mosaic/gemm.py") == "test_kernels_mosaic_gemm.py"
    assert expected_test_file("configs/__init__.py") == "test_configs.py"
    assert expected_test_file("rhhjax/train/__main__.py") == "test_train_main.py"


# The files that name test files for someone to run: CI, the GPU suite, the docs.
RUNNERS = (".ci/run", "benchmarks/*.sh", "README.md", "docs/*.md", "benchmarks/README.md")
NAMED_TEST_FILE = re.compile(r"\btests/[\w*]+\.py\b")


def _named_test_files() -> dict[str, set[str]]:
    """Every ``tests/...py`` path (a glob where it has a ``*``) named in RUNNERS, by file."""
    named: dict[str, set[str]] = {}
    for pattern in RUNNERS:
        for path in sorted(ROOT.glob(pattern)):
            found = set(NAMED_TEST_FILE.findall(path.read_text()))
            named[str(path.relative_to(ROOT))] = found
    return named


def test_every_test_file_a_script_or_doc_names_exists():
    """A renamed or deleted test file is renamed in the scripts and docs that run it too (a
    glob matches at least one file)."""
    named = _named_test_files()
    assert ".ci/run" in named and "benchmarks/gpu_suite.sh" in named
    missing = sorted(
        f"{runner}: {name}"
        for runner, names in named.items()
        for name in names
        if not any(ROOT.glob(name))
    )
    assert not missing, "test files named but not in tests/:\n" + "\n".join(missing)
