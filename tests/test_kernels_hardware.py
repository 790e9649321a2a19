"""The hardware table (kernels/hardware.py): the H100's figures, read by the Triton config's
shared-memory check, the CUDA lowering's abstract device, the persistent plan and the compile
report."""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest
from benchmark_scripts import load
from helpers import ROOT
from rhhjax.kernels.hardware import H100
from rhhjax.kernels.mosaic.plan import PersistentPlan
from rhhjax.kernels.triton import HighwayConfig, KernelConfigError, common

calibrate = load("hlo.calibrate")
dumps = load("hlo.dumps")


def test_h100_figures():
    assert (H100.sms, H100.compute_capability) == (132, (9, 0))
    assert H100.smem_per_block_optin == 227 * 1024 < H100.smem_per_sm
    assert H100.l2_bytes == 50 * 1024 * 1024
    assert H100.threads_per_sm // H100.threads_per_warp == 64
    with pytest.raises(dataclasses.FrozenInstanceError):
        H100.sms = 1


def test_one_table_for_the_kernels_and_the_compile_report():
    defaults = inspect.signature(common.cuda_lowering_device).parameters
    assert defaults["num_cores"].default == H100.sms
    assert defaults["device_kind"].default == H100.device_kind
    assert dumps.SMEM_PER_BLOCK_OPTIN == calibrate.SMEM_PER_SM == H100.smem_per_block_optin
    assert calibrate.SMS == H100.sms
    # a config one block's shared memory cannot hold is refused by the table's limit
    over = HighwayConfig(block_b=128, block_n=128, block_k=64, num_stages=4)
    assert over.smem_bytes("float32") > H100.smem_per_block_optin
    with pytest.raises(KernelConfigError, match=f"{H100.smem_per_block_optin} B per block"):
        over.validate("float32")


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
