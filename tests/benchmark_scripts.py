"""Loads a ``benchmarks/`` script as a module by its path (benchmarks/ is a folder of
scripts, not a package; no ``sys.path`` change). A script that imports a sibling
(``kernel_blocks`` imports ``bench``) finds it in ``sys.modules`` once it is loaded. The
packages beside the scripts (``benchmarks/hlo/``, the compile report's library, not
installed) load the same way under their own name: ``load("hlo.deviceless")``, and every
script loaded here finds them; a fresh process finds them on `PYTHONPATH` (`BENCH`)."""

from __future__ import annotations

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
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
