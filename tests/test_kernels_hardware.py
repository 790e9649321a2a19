"""The hardware table (kernels/hardware.py): the H100's figures, read by the CUDA lowering's
abstract device, the persistent plan and the compile report."""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest
from benchmark_scripts import load
from helpers import ROOT
from rhhjax.kernels.hardware import H100
from rhhjax.kernels.mosaic.plan import PersistentPlan

deviceless = load("hlo.deviceless")


def test_h100_figures():
    assert (H100.sms, H100.compute_capability) == (132, (9, 0))
    assert H100.smem_per_block_optin == 227 * 1024 < H100.smem_per_sm
    assert H100.l2_bytes == 50 * 1024 * 1024
    assert H100.threads_per_sm // H100.threads_per_warp == 64
    with pytest.raises(dataclasses.FrozenInstanceError):
        H100.sms = 1


def test_one_table_for_the_kernels_and_the_compile_report():
    assert inspect.signature(deviceless.lowering_device).parameters["gpu"].default is H100
    assert f"core_count: {H100.sms}" in deviceless.H100_TARGET_CONFIG


def test_the_persistent_plan_reads_the_table():
    """SMs, the shared memory a block may opt in to and Mosaic GPU's scratch alignment."""
    plan = PersistentPlan(batch=64, width=32, units=16, col_blocks=2)
    assert (PersistentPlan.sm_count, PersistentPlan.smem_limit) == (
        H100.sms,
        H100.smem_per_block_optin,
    )
    assert plan.smem_bytes() % 8 == 0 and (plan.smem_bytes() - 8 * 10) % H100.smem_alignment == 0


# A hardware figure written as a literal outside kernels/hardware.py (comments included): the
# SM count, the opt-in shared memory per block, Mosaic GPU's scratch alignment, the L2 size.
HARDWARE_LITERALS = re.compile(
    r"\b132\b|\b232_?448\b|\bSMEM_ALIGNMENT\b|\b52_?428_?800\b|\b50 ?MiB\b|\b227 ?KiB\b"
)
# float32 under a short name anywhere but kernels/layout.py
F32_DEFINITION = re.compile(r"^\s*_?F32\s*=", re.MULTILINE)


def _package_sources():
    for folder in ("rhhjax", "kernels", "configs", "benchmarks"):
        yield from sorted((ROOT / folder).rglob("*.py"))
    yield ROOT / "train.py"


def test_hardware_figures_are_written_in_the_table_only():
    """The package and the benchmarks read the H100's figures from `H100` and float32 from
    `layout.F32`."""
    table, layout = ROOT / "kernels" / "hardware.py", ROOT / "kernels" / "layout.py"
    written = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _package_sources()
        if path != table
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if HARDWARE_LITERALS.search(line)
    ]
    assert not written, "hardware figures outside kernels/hardware.py:\n" + "\n".join(written)
    f32 = [
        str(path.relative_to(ROOT))
        for path in _package_sources()
        if path != layout and F32_DEFINITION.search(path.read_text())
    ]
    assert not f32, f"F32 defined outside kernels/layout.py: {f32}"
