"""The Triton kernels' block sizes and their validation (`kernels/triton/config.py`): one-line
errors for blocks Triton cannot lower and for shared memory an H100 block does not have."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from kernel_cases import (
    make_unpadded,
    pad_layer,
)
from rhhjax.kernels import triton
from rhhjax.kernels.hardware import H100

from rhhjax.errors import UserError


@pytest.mark.parametrize(
    "bad", [dict(block_k=24), dict(block_n=48), dict(block_b=8), dict(block_k=8), dict(num_warps=3)]
)
def test_invalid_config_rejected_with_a_user_error(bad):
    with pytest.raises(triton.KernelConfigError, match="HighwayConfig") as error:
        triton.Geometry.make(triton.HighwayConfig(**bad), 4, 16)
    assert isinstance(error.value, UserError) and "\n" not in str(error.value)


def test_shared_memory_overflow_rejected():
    """128/128/64 with 4 stages: ptxas reported 294,912 B for the f32 forward alone (over the
    H100's 232,448 B); the model (fused kernel, the largest) predicts more: rejected."""
    big = triton.HighwayConfig(block_b=128, block_n=128, block_k=64, num_stages=4)
    assert big.smem_bytes(jnp.float32) >= 294_912
    geo = triton.Geometry.make(big, 256, 1000)
    p = pad_layer(make_unpadded(jax.random.key(0), 256, 1000, "float32", False, False, False),
                  geo, jnp.float32)  # fmt: skip
    with pytest.raises(ValueError, match="shared memory"):
        triton.forward_padded(p["s"], p["w3"], None, p["bias2"], None, None, geo=geo, config=big)
    for dtype in (jnp.float32, jnp.bfloat16):
        assert triton.HighwayConfig().smem_bytes(dtype) <= H100.smem_per_block_optin
