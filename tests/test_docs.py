"""Docs that cannot drift: every registered implementation, config variant, program and
module is named where a reader looks for it. The lists come from the code (the registry of
``rhhjax.ops.spec``, each config file's ``VARIANTS``, the programs in ``rhhjax/tools/`` and
``benchmarks/``, the package folders), so something new fails here until the docs name it:
the README (commands, configs, the layout by folder), docs/design.md (implementations, the
one module map), benchmarks/README.md, the ``--impl`` help of evaluate and each package's
``__init__`` (its own modules)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_test_files import SOURCES

from rhhjax.ops import spec

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DESIGN = (ROOT / "docs" / "design.md").read_text()


def section(text: str, heading: str) -> str:
    """The text under ``heading`` (a markdown heading line) up to the next heading as high."""
    level = heading.split(" ")[0]
    start = text.index(heading + "\n") + len(heading) + 1
    end = re.search(rf"^{'#' * len(level)} ", text[start:], re.M)
    return text[start:] if end is None else text[start : start + end.start()]


def code_block(text: str) -> str:
    """The first ``` block of ``text``."""
    return text.split("```", 2)[1]


def packages() -> list[Path]:
    """Every package folder (one with an ``__init__.py``)."""
    return sorted(p.parent for folder in SOURCES for p in (ROOT / folder).rglob("__init__.py"))


def members(package: Path) -> list[str]:
    """The modules (``x.py``) and subpackages (``x/``) of ``package``."""
    names = [p.name for p in package.glob("*.py") if p.name != "__init__.py"]
    return sorted(
        names + [p.name + "/" for p in package.iterdir() if (p / "__init__.py").is_file()]
    )


def entries(block: str) -> dict[str, str]:
    """The entries of a layout block: the first word of a line at column 0 -> its text."""
    out: dict[str, str] = {}
    key = None
    for line in block.splitlines():
        if line[:1].strip():
            key = line.split()[0].rstrip(",")
            out[key] = line
        elif key is not None:
            out[key] += "\n" + line
    return out


# ----------------------------------------------------------------------------- implementations


def test_every_implementation_is_in_the_readme_design_and_models_docs():
    commands = section(README, "## Commands")
    assert "--impl=" + "\\|".join(spec.CHOICES) + "`" in commands
    implementations = section(DESIGN, "## Implementations: `model.impl`")
    registry = re.search(r"the only table of implementations: ([^)]*)\)", implementations)
    assert registry and re.findall(r"`(\w+)`", registry.group(1)) == list(spec.IMPLEMENTATIONS)
    models_doc = ast.get_docstring(ast.parse((ROOT / "rhhjax/models/__init__.py").read_text()))
    for name in spec.IMPLS:
        assert f"\n- `{name}`" in implementations, f"docs/design.md: no bullet for {name}"
        assert f"`{name}`" in models_doc, f"rhhjax/models/__init__.py does not name {name}"
        assert f"`{name}`" in README, name


def test_the_impl_help_of_evaluate_names_every_choice():
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    run = subprocess.run(
        [sys.executable, "-m", "rhhjax.tools.evaluate", "--help"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    help_text = " ".join(run.stdout.split())
    assert f"--impl: Override model.impl ({' | '.join(spec.CHOICES)})." in help_text


# ----------------------------------------------------------------------------- configs


def config_files() -> list[str]:
    return sorted(p.stem for p in (ROOT / "configs").glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", config_files())
def test_every_config_variant_is_in_the_readme_and_its_file(name):
    module = importlib.import_module(f"rhhjax.configs.{name}")
    variants = getattr(module, "VARIANTS", None)
    if variants is None:  # a recipe the config files share, named by them
        assert f"`configs/{name}.py`" in README
        return
    configs_table = section(README, "## Configs")
    for variant in variants:
        ref = f"configs/{name}.py" + (f":{variant}" if variant else "")
        assert f"`{ref}`" in configs_table, f"README's Configs table has no row for {ref}"
        assert ref in (module.__doc__ or ""), f"{ref} is not in its file's docstring"


# ----------------------------------------------------------------------------- programs


def test_every_program_is_in_the_readme_or_the_benchmarks_readme():
    commands = section(README, "## Commands")
    assert "python train.py" in commands
    for path in sorted((ROOT / "rhhjax" / "tools").glob("*.py")):
        if "def console(" in path.read_text():
            assert f"python -m rhhjax.tools.{path.stem}" in commands, path.name
    benchmarks = (ROOT / "benchmarks" / "README.md").read_text()
    for path in sorted((ROOT / "benchmarks").glob("*.*")):
        if path.suffix in (".py", ".sh"):
            assert f"benchmarks/{path.name}" in benchmarks, path.name
    for path in sorted((ROOT / "rhhjax").glob("*/*.py")):  # a program inside a library
        if path.parent.name in ("tools", "train") or path.name == "__main__.py":
            continue  # the programs of the README's Commands
        if 'if __name__ == "__main__":' in path.read_text():
            assert f"python -m rhhjax.{path.parent.name}.{path.stem}" in benchmarks, path.name


RUN_MODULE = re.compile(r"python -m (rhhjax(?:\.\w+)+)")


def test_every_module_the_docs_run_exists():
    """README.md, docs/, benchmarks/README.md and results/README.md run library modules by
    name (``python -m rhhjax.tools.evaluate``): each is there, so a module that moves is
    renamed there."""
    docs = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]
    docs += [ROOT / "README.md", ROOT / "results" / "README.md"]
    named = {name for doc in docs for name in RUN_MODULE.findall(doc.read_text())}
    assert "rhhjax.tools.evaluate" in named
    missing = sorted(name for name in named if importlib.util.find_spec(name) is None)
    assert not missing, f"the docs run modules that are not there: {missing}"


# ----------------------------------------------------------------------------- modules


@pytest.mark.parametrize("package", packages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_package_init_names_its_modules(package):
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    missing = [name for name in members(package) if name not in doc]
    assert not missing, f"{package.relative_to(ROOT)}/__init__.py does not name {missing}"


NAMED_FILE = re.compile(r"[\w/]*\w\.py\b")


def test_the_module_map_names_every_module():
    block = entries(code_block(section(DESIGN, "## Module map")))
    for package in packages():
        where = package.relative_to(ROOT).as_posix()
        if where == "rhhjax":  # the top-level modules: on the lines of rhhjax/<module>.py
            text = "\n".join(v for k, v in block.items() if k.startswith("rhhjax/") and
                             k.endswith(".py"))  # fmt: skip
            names = [n for n in members(package) if n.endswith(".py")]
            assert all(n in text for n in names), names
            continue
        assert f"{where}/" in block, f"the module map has no entry {where}/"
        missing = [n for n in members(package) if n.endswith(".py") and n not in block[f"{where}/"]]
        assert not missing, f"docs/design.md, {where}/: {missing}"


def test_every_file_the_module_map_names_exists():
    """A module that moves or goes is renamed or struck in the map too: a bare ``name.py``
    is in the entry's folder, a path (``tests/kernel_cases.py``) from the root."""
    named = NAMED_FILE.findall
    stale = [
        f"{folder} {name}"
        for folder, text in entries(code_block(section(DESIGN, "## Module map"))).items()
        if folder.endswith("/")
        for name in named(text)
        if not (ROOT / name).exists() and not (ROOT / folder / name).exists()
    ]
    assert not stale, f"docs/design.md's module map names files that are not there: {stale}"


def test_every_source_path_the_docs_name_exists():
    """README.md, docs/ and benchmarks/README.md name source files by their path from the root
    (``kernels/mosaic/forward.py``): each is there."""
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    docs.append(ROOT / "benchmarks" / "README.md")
    stale = sorted(
        {
            f"{doc.relative_to(ROOT)}: {name}"
            for doc in docs
            for name in NAMED_FILE.findall(doc.read_text())
            if "/" in name and not name.startswith("/") and not (ROOT / name).exists()
        }
    )
    assert not stale, f"paths to files that are not there: {stale}"


def test_the_readme_layout_is_by_folder_and_points_to_the_one_module_list():
    """The module list has one home, docs/design.md's module map (checked above); the
    README's layout names every top-level folder and the subpackages of each, and points
    there instead of repeating it."""
    text = section(README, "## Layout")
    layout = entries(code_block(text))
    assert "](docs/design.md#module-map)" in text
    for package in packages():
        top, *rest = package.relative_to(ROOT).parts
        assert f"{top}/" in layout, f"README's layout has no entry {top}/"
        if len(rest) == 1:
            assert f"{rest[0]}/" in layout[f"{top}/"], f"README's layout, {top}/: no {rest[0]}/"
    for folder in ("benchmarks", "tests", "results", "docs"):
        assert f"{folder}/" in layout, folder
    assert not NAMED_FILE.search(layout["rhhjax/"] + layout["kernels/"]), (
        "README's layout names modules: they belong in docs/design.md's module map"
    )


# An issue tracker's number (the word issue, then a number, "#" optional): comments say what
# and why instead.
ISSUE_NUMBER = re.compile(r"\bissues? ?#?[0-9]+", re.IGNORECASE)
CODE = ("rhhjax", "kernels", "configs", "tests", "benchmarks")


def test_no_issue_numbers_in_code_or_tests():
    paths = [ROOT / "train.py", ROOT / ".ci" / "run"]
    for folder in CODE:
        paths += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".sh")]
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted(paths)
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if ISSUE_NUMBER.search(line)
    ]
    assert not found, f"issue numbers in code: {found}"


# How GPU time was obtained is no user's business: these words said it, in code and docs.
WORKSHOP = re.compile(r"\b(loans?|loaned|leases?|LEASE_\w+|levers?|LEVERS)\b", re.I)
RECORDS = (".json", ".log", ".jsonl")  # machine output as it ran (commands, paths)


def test_the_project_speaks_a_users_words():
    """No workshop word anywhere in the tree but machine records, and no link to the
    ``../shared/docs`` folder outside the repository (tests may still read ../shared/data)."""
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    found = []
    for name in tracked:
        path = ROOT / name
        if path.suffix in RECORDS or path.suffix in (".png", ".npy") or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if WORKSHOP.search(line) or "shared/docs" in line:
                found.append(f"{name}:{number}")
    found = [f for f in found if not f.startswith("tests/test_docs.py:")]
    assert not found, f"workshop words or links outside the repository: {found}"
