"""Block sizes and launch parameters of the Triton kernels (`HighwayConfig`), validated."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from rhhjax.kernels.hardware import H100

from rhhjax.errors import UserError


class KernelConfigError(UserError):
    """A :class:`HighwayConfig` that Triton cannot lower or an H100 cannot run."""


@dataclasses.dataclass(frozen=True)
class HighwayConfig:
    """Tuning knobs of the highway kernels: block_b, block_n, block_k (powers of two,
    >= 16), Triton warps and stages, ``allow_tf32`` for f32 weights. The defaults suit
    n ~ 1000, B = 256 on an H100 (docs/design.md, module notes); blocks clamp to small
    problems."""

    block_b: int = 64
    block_n: int = 32
    block_k: int = 32
    num_warps: int = 4
    num_stages: int = 3
    allow_tf32: bool = False

    def smem_bytes(self, dot_dtype) -> int:
        """Predicted shared memory per program of the largest kernel (a conservative fit)."""
        w_bytes = jnp.dtype(dot_dtype).itemsize
        per_stage = 2 * self.block_b * self.block_k * 4 + 2 * self.block_k * self.block_n * w_bytes
        return max(self.num_stages - 1, 1) * per_stage + self.block_b * self.block_n * 4

    def validate(self, dot_dtype=None) -> None:
        """Raises `KernelConfigError` for blocks Triton cannot lower or, with ``dot_dtype``,
        more shared memory than an H100 block has."""
        for name in ("block_b", "block_n", "block_k"):
            value = getattr(self, name)
            if not _is_pow2(value) or value < 16:
                raise KernelConfigError(
                    f"HighwayConfig.{name} must be a power of two >= 16, got {value}."
                )
        if not _is_pow2(self.num_warps):
            raise KernelConfigError(
                f"HighwayConfig.num_warps must be a power of two, got {self.num_warps}."
            )
        if self.num_stages < 1:
            raise KernelConfigError(
                f"HighwayConfig.num_stages must be >= 1, got {self.num_stages}."
            )
        if dot_dtype is not None:
            need, limit = self.smem_bytes(dot_dtype), H100.smem_per_block_optin
            if need > limit:
                raise KernelConfigError(
                    f"HighwayConfig {self} needs ~{need} B of shared memory with "
                    f"{jnp.dtype(dot_dtype).name} weights, over the H100's "
                    f"{limit} B per block: lower num_stages or the block sizes."
                )


DEFAULT_CONFIG = HighwayConfig()


def _is_pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


def validate_config(config: HighwayConfig, dot_dtype=None) -> None:
    """``config.validate(dot_dtype)``."""
    config.validate(dot_dtype)
