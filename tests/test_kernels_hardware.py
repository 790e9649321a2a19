"""The hardware table (kernels/hardware.py): the H100's figures, read by the Triton config's
shared-memory check, the CUDA lowering's abstract device and the compile report."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from rhhjax.kernels.hardware import H100
from rhhjax.kernels.triton import HighwayConfig, KernelConfigError, common

from rhhjax.hlo import calibrate, dumps


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
