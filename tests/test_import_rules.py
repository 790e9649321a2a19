"""The import rules the docs state (docs/design.md, "Import rules"; kernels/__init__.py and
rhhjax/ops/__init__.py: models reach the kernels through ops), checked on every module of the
installed package (rhhjax/, kernels/ as rhhjax.kernels, configs/ as rhhjax.configs), parsed
with ``ast``: every import statement, at module level or inside a function, and every module
named by a string to ``importlib.import_module`` or ``__import__``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Each folder of the installed package and its name under rhhjax (pyproject's package-dir).
FOLDERS = {"rhhjax": "rhhjax", "kernels": "rhhjax.kernels", "configs": "rhhjax.configs"}


def module_name(path: Path) -> str:
    """The installed name of the module at ``path`` (``kernels/layout.py``:
    ``rhhjax.kernels.layout``; a package's ``__init__.py``: the package)."""
    folder, *parts = path.relative_to(ROOT).with_suffix("").parts
    parts = [p for p in parts if p != "__init__"]
    return ".".join([FOLDERS[folder], *parts])


def modules() -> dict[str, Path]:
    """Every module of the installed package: {installed name: path}."""
    found = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" not in path.parts:
                found[module_name(path)] = path
    return found


def imports(source: str, name: str, is_package: bool = False) -> set[str]:
    """The modules the source of module ``name`` imports: ``import a.b`` -> a.b; ``from a
    import b`` -> a and a.b (b may be a module); relative imports resolved; and the string
    given to ``import_module`` / ``__import__`` (an f-string: its text up to the first field,
    ``f"rhhjax.configs.{x}"`` -> rhhjax.configs)."""
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and node.args and _is_import_call(node.func):
            named = _leading_text(node.args[0])
            if named:
                found.add(named)
    return found


def _is_import_call(func: ast.expr) -> bool:
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name in ("import_module", "__import__")


def _leading_text(arg: ast.expr) -> str:
    """A string constant, or an f-string's text before its first field, less a trailing dot."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return str(arg.values[0].value).rstrip(".")
    return ""


def under(imported: set[str], *packages: str) -> list[str]:
    """The names of ``imported`` that are ``packages`` or lie under them."""
    return sorted(n for n in imported for p in packages if n == p or n.startswith(p + "."))


def breaking(imported: dict[str, set[str]], where, *packages: str) -> dict[str, list[str]]:
    """{module: what it imports of ``packages``} for the modules ``where(name)`` selects
    that import any of them."""
    found = {name: under(names, *packages) for name, names in imported.items() if where(name)}
    return {name: names for name, names in found.items() if names}


@pytest.fixture(scope="module")
def imported() -> dict[str, set[str]]:
    """{installed module name: the modules it imports}."""
    return {
        name: imports(path.read_text(), name, path.name == "__init__.py")
        for name, path in modules().items()
    }


def test_the_parser_sees_imports_of_every_form():
    source = (
        "import rhhjax.kernels.mosaic\nfrom rhhjax import configs\n"
        "from . import sibling\nfrom ..ops import spec\n"
        "def f(x):\n    import benchmarks\n    importlib.import_module(f'hlo.{x}')\n"
        "    return importlib.import_module('rhhjax.configs.ptb'), find_spec('rhhjax.tools')\n"
    )
    found = imports(source, "rhhjax.models.config")
    assert {"rhhjax.kernels.mosaic", "rhhjax.configs", "rhhjax.models.sibling"} <= found
    assert {"rhhjax.ops.spec", "benchmarks", "rhhjax.configs.ptb", "hlo"} <= found
    assert "rhhjax.tools" not in found  # a look-up, not an import


def test_every_module_is_parsed_and_the_rules_have_something_to_check(imported):
    assert "rhhjax.ops.mosaic" in imported and "rhhjax.kernels.layout" in imported
    assert "rhhjax.configs.ptb" in imported and "rhhjax.train.trainer" in imported
    assert under(imported["rhhjax.ops.mosaic"], "rhhjax.kernels")  # ops do reach the kernels


def test_models_reach_the_kernels_only_through_ops(imported):
    """kernels/__init__.py, rhhjax/ops/__init__.py: models reach the kernels through ops."""
    in_models = lambda name: name.startswith("rhhjax.models")  # noqa: E731
    models = breaking(imported, in_models, "rhhjax.kernels", "kernels")
    assert not models, models


def test_the_library_imports_configs_only_in_the_config_loader(imported):
    """docs/design.md: the config files import the library; the library imports them only in
    rhhjax/config_files.py (the one loader), never as the checkout's top-level ``configs``."""

    def library(name: str) -> bool:
        return not name.startswith("rhhjax.configs") and name != "rhhjax.config_files"

    importers = breaking(imported, library, "rhhjax.configs", "configs")
    assert not importers, importers
    assert under(imported["rhhjax.config_files"], "rhhjax.configs")  # the loader does


def test_train_does_not_import_the_tools(imported):
    """rhhjax.train (the training program included) sits below rhhjax.tools: what both use
    is rhhjax.cli."""
    train = breaking(imported, lambda n: n.startswith("rhhjax.train"), "rhhjax.tools")
    assert not train, train


def test_nothing_installed_imports_the_benchmarks(imported):
    """benchmarks/ (its scripts and the compile report's library, imported as ``hlo``) and the
    tests' helpers are not installed: the package cannot import them."""
    tooling = ("benchmarks", "hlo", "rhhjax.hlo", "benchmark_scripts", "tests")
    importers = breaking(imported, lambda n: True, *tooling)
    assert not importers, importers
