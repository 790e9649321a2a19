"""Test-session settings.

The tests compile hundreds of small XLA programs on a CPU, and compilation, not running, is
most of their time. XLA's backend optimisation level 0 compiles about 1.7x faster; the
numbers the tests compare stay within their float32 / bfloat16 tolerances (the comparisons
are between implementations compiled the same way, or against references with explicit
tolerances). Set before jax is imported, and inherited by the tests' subprocesses. An
``XLA_FLAGS`` of your own is kept as it is.
"""

import os
from importlib import metadata

import pytest


def _version_at_least(package: str, release: tuple[int, ...]) -> bool:
    """Whether the installed ``package`` is at least ``release`` (read without importing)."""
    try:
        parts = metadata.version(package).split(".")
    except metadata.PackageNotFoundError:
        return False
    numbers = tuple(int(p) for p in parts[: len(release)] if p.isdigit())
    return numbers >= release


os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")
# On a GPU, XLA computes float32 dots in TF32 by default (about 1e-3 relative error, measured
# on an H100 on 2026-11-23: 14 float32 comparisons failed); the tests' float32 tolerances
# assume float32 arithmetic, which a CPU always does. bfloat16 tests keep their own looser
# tolerances. The Mosaic GPU kernels choose their own precision.
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
# GPU interpret mode (jax >= 0.11.2: the interpreted Mosaic GPU tests) runs each block of a
# cluster as a thread that holds a thread of XLA's CPU pool while it waits at a barrier;
# NPROC, read when jax starts, sets that pool's size (default: one per core, which runs a
# one-block cluster only). 17 runs the tests' clusters of up to 16 blocks.
if _version_at_least("jax", (0, 11, 2)):
    os.environ.setdefault("NPROC", "17")


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    """The data cache lives in ``tmp_path`` and any attempt to download fails loudly (use with
    ``pytestmark = pytest.mark.usefixtures("offline_cache")``)."""
    from rhhjax.data import cache

    monkeypatch.setenv("RHHJAX_CACHE", str(tmp_path / "cache"))

    def no_network(url, dest):
        raise AssertionError(f"test tried to download {url}")

    monkeypatch.setattr(cache, "fetch", no_network)


def pytest_generate_tests(metafunc):
    """A test class's ``CASES`` (argument name -> list of values) parametrizes its tests that
    take that argument: the Mosaic GPU test classes keep their tests in one class and let a
    subclass per mode (compiled, interpreted) choose its own shapes
    (`kernel_cases.MosaicGpuMode`)."""
    for name, values in getattr(metafunc.cls, "CASES", {}).items():
        if name in metafunc.fixturenames:
            metafunc.parametrize(name, values, ids=[_case_id(v) for v in values])


def _case_id(value) -> str:
    if isinstance(value, tuple):
        return "-".join(_case_id(v) for v in value)
    return str(value)


def pytest_runtest_logreport(report):
    """With ``RHHJAX_FAILURE_LOG`` set, each failure's report is appended to that file as
    soon as it happens (under xdist too): a GPU test command cut short, or watched while it
    runs, shows its failures before pytest's summary (`benchmarks/gpu_suite.sh test`)."""
    path = os.environ.get("RHHJAX_FAILURE_LOG")
    if path and report.failed:
        with open(path, "a", encoding="utf-8") as log:
            log.write(f"==== {report.nodeid} ({report.when})\n{report.longreprtext}\n")
