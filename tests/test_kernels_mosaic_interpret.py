"""GPU interpret mode's settings (`kernels/mosaic/interpret.py`): where it exists, its
parameters, and the one-line refusals of a cluster larger than the interpreter can run here.
The kernels executed in it: the `TestInterpret` classes of tests/test_kernels_mosaic_*.py,
test_ops_mosaic.py and test_ops_persistent.py."""

import jax
import pytest
from rhhjax.kernels.mosaic import interpret as gpu_interpret


def test_available_is_whether_jax_has_interpret_gpu_params():
    from jax.experimental.pallas import mosaic_gpu as plgpu

    assert gpu_interpret.available() == hasattr(plgpu, "InterpretGPUParams")
    reason = gpu_interpret.unavailable("X")
    if gpu_interpret.available():
        assert reason is None
        params = gpu_interpret.params()
        assert params.detect_races and params.inline_mgpu == "error"
        assert not gpu_interpret.params(detect_races=False).detect_races
    else:
        assert reason.startswith("X needs jax >= 0.11.2") and jax.__version__ in reason
        assert "\n" not in reason and "pip install 'jax>=0.11.2'" in reason
        with pytest.raises(RuntimeError, match="needs jax >= 0.11.2"):
            gpu_interpret.params()


@pytest.mark.parametrize(("nproc", "most"), [("2", 1), ("3", 2), ("17", 16), ("64", 24)])
def test_the_most_blocks_are_the_pool_threads_beside_the_launching_one(monkeypatch, nproc, most):
    monkeypatch.setenv("NPROC", nproc)
    assert gpu_interpret.pool_threads() == int(nproc)
    assert gpu_interpret.max_blocks() == most
    assert gpu_interpret.cluster_too_large(most) is None
    assert gpu_interpret.cluster_too_large(1) is None  # one block needs no thread of its own


def test_a_cluster_past_the_pool_is_one_line_naming_the_nproc_that_runs_it(monkeypatch):
    monkeypatch.setenv("NPROC", "2")
    line = gpu_interpret.cluster_too_large(4)
    assert "\n" not in line and "NPROC=5" in line and "the pool has 2 here" in line
    monkeypatch.setenv("NPROC", "5")
    assert gpu_interpret.cluster_too_large(4) is None


def test_a_cluster_past_what_ran_here_is_one_line_asking_for_fewer_blocks(monkeypatch):
    monkeypatch.setenv("NPROC", "100")
    line = gpu_interpret.cluster_too_large(gpu_interpret.MAX_BLOCKS + 1)
    assert "\n" not in line and f"at most {gpu_interpret.MAX_BLOCKS} blocks" in line
    assert "NPROC" not in line


def test_without_nproc_the_pool_has_one_thread_per_usable_core(monkeypatch):
    import os

    monkeypatch.delenv("NPROC", raising=False)
    assert gpu_interpret.pool_threads() == len(os.sched_getaffinity(0))
