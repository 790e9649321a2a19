"""Loads a ``benchmarks/`` script as a module by its path (benchmarks/ is a folder of
scripts, not a package; no ``sys.path`` change). The siblings a script imports at its top
level (``bench`` imports ``gemm_rate``) load first, so it finds them in ``sys.modules``. The
packages beside the scripts (``benchmarks/hlo/``, the compile report's library, not
installed) load the same way under their own name: ``load("hlo.deviceless")``, and every
script loaded here finds them; a fresh process finds them on `PYTHONPATH` (`BENCH`)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
PACKAGES = ("hlo",)  # the folders of benchmarks/ the scripts import as packages


def _package(name: str):
    """``benchmarks/<name>/`` as package ``name`` (loaded once per session)."""
    init = BENCH / name / "__init__.py"
    if getattr(sys.modules.get(name), "__file__", "") == str(init):
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, init, submodule_search_locations=[str(init.parent)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _siblings(path: Path) -> list[str]:
    """The ``benchmarks/`` scripts that ``path`` imports at its top level."""
    names = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return [name for name in names if (BENCH / f"{name}.py").exists()]


def load(name: str):
    """``benchmarks/<name>.py`` as module ``name`` (loaded once per session); a dotted
    ``name`` (``hlo.launches``) or a package's (``hlo``): that module of ``benchmarks/hlo/``."""
    top, _, rest = name.partition(".")
    for package in PACKAGES:
        _package(package)
    if top in PACKAGES:
        return importlib.import_module(name) if rest else sys.modules[top]
    if name in sys.modules and getattr(sys.modules[name], "__file__", "") == str(
        BENCH / f"{name}.py"
    ):
        return sys.modules[name]
    path = BENCH / f"{name}.py"
    for sibling in _siblings(path):
        load(sibling)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
