"""Test-session settings.

The tests compile hundreds of small XLA programs on a CPU, and compilation, not running, is
most of their time. XLA's backend optimisation level 0 compiles about 1.7x faster; the
numbers the tests compare stay within their float32 / bfloat16 tolerances (the comparisons
are between implementations compiled the same way, or against references with explicit
tolerances). Set before jax is imported, and inherited by the tests' subprocesses. An
``XLA_FLAGS`` of your own is kept as it is.
"""

import os

import pytest

os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")
# On a GPU, XLA computes float32 dots in TF32 by default (about 1e-3 relative error, measured
# on an H100 on 2026-11-23: 14 float32 comparisons failed); the tests' float32 tolerances
# assume float32 arithmetic, which a CPU always does. bfloat16 tests keep their own looser
# tolerances. The Pallas kernels choose their own precision (HighwayConfig.allow_tf32).
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    """The data cache lives in ``tmp_path`` and any attempt to download fails loudly (use with
    ``pytestmark = pytest.mark.usefixtures("offline_cache")``)."""
    from rhhjax.data import cache

    monkeypatch.setenv("RHHJAX_CACHE", str(tmp_path / "cache"))

    def no_network(url, dest):
        raise AssertionError(f"test tried to download {url}")

    monkeypatch.setattr(cache, "fetch", no_network)
