"""The deviceless H100 compile's setup (benchmarks/hlo/deviceless.py) that needs no CUDA plugin:
the compile-only device written from the hardware table, the environment, the rows. The
compiles themselves are the ``gpu_compile`` tests of tests/test_gpu_report.py."""

from __future__ import annotations

import os

from benchmark_scripts import load
from rhhjax.kernels.hardware import H100

deviceless = load("hlo.deviceless")


def test_the_target_config_is_the_hardware_table():
    text = deviceless.target_config(H100)
    assert text == deviceless.H100_TARGET_CONFIG
    for line in (
        f"core_count: {H100.sms}",
        f"shared_memory_per_block_optin: {H100.smem_per_block_optin}",
        f"l2_cache_size: {H100.l2_bytes}",
        "cuda_compute_capability { major: 9 minor: 0 }",
        f'device_description_str: "{H100.device_kind}"',
    ):
        assert f"{line}\n" in text, line


def test_set_deviceless_env_hides_the_gpus_and_keeps_other_xla_flags(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0")
    for name in ("CUDA_VISIBLE_DEVICES", "JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "TF_CPP_MIN_LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    deviceless.set_deviceless_env(dump_dir="/tmp/dump", log_ptxas=False)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "-1"
    assert os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] == "1"
    assert "TF_CPP_MIN_LOG_LEVEL" not in os.environ
    assert os.environ["XLA_FLAGS"].split() == [
        "--xla_backend_optimization_level=0",
        "--xla_dump_to=/tmp/dump",
    ]


def test_cases_cross_every_choice_and_rank_only_the_hyperrhn():
    rows = deviceless.cases(["rhn", "hyperrhn"], ["fused"], ["float32"], [0, 4])
    assert {(c.model, c.rank) for c in rows} == {("rhn", 0), ("hyperrhn", 0), ("hyperrhn", 4)}


def test_cuda_plugin_available_says_why_not():
    ok, why = deviceless.cuda_plugin_available()
    assert ok == (why == "")
