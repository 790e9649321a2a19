"""Loads a ``benchmarks/`` script as a module by its path (benchmarks/ is a folder of
scripts, not a package; no ``sys.path`` change). A script that imports a sibling
(``kernel_blocks`` imports ``bench``) finds it in ``sys.modules`` once it is loaded."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str):
    """``benchmarks/<name>.py`` as module ``name`` (loaded once per session)."""
    if name in sys.modules and getattr(sys.modules[name], "__file__", "") == str(
        BENCH / f"{name}.py"
    ):
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
