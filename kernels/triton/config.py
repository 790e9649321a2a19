"""Block sizes and launch parameters of the Triton kernels, and their validation.

:class:`HighwayConfig` holds the tuning knobs (block sizes, Triton warps and stages); the
padded layout they produce for one problem size is :class:`rhhjax.kernels.layout.Geometry`.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from rhhjax.kernels.hardware import H100

from rhhjax.errors import UserError


class KernelConfigError(UserError):
    """A :class:`HighwayConfig` that Triton cannot lower or an H100 cannot run."""


@dataclasses.dataclass(frozen=True)
class HighwayConfig:
    """Tuning knobs of the highway kernels.

    Attributes:
      block_b: rows (batch) per program. Power of two, >= 16 (the M dim of ``tl.dot``).
      block_n: units per program; each program computes both the h and the t column block.
        Power of two, >= 16.
      block_k: K chunk of the matmul loops. Power of two, >= 16 (``tl.dot`` minimum).
      num_warps: Triton warps per program.
      num_stages: Triton software-pipelining stages of the K loops.
      allow_tf32: when ``w`` is f32, let the matmuls use TF32 tensor cores (faster, ~1e-3
        relative error). Default: exact f32 (``Precision.HIGHEST``). Ignored for bf16 weights.

    The defaults target n = 1000..1024, B = 256 on an H100: a (4, 32) grid of 128 programs,
    one wave on the H100's SMs (kernels/hardware.py), and compile for it without register
    spills (bf16 dots as Hopper ``wgmma``; exact f32 dots as FMA loops, ``allow_tf32`` for
    tensor cores); the compile facts and the spilling alternatives:
    results/README.md#pallas-triton-block-sizes-the-defaults-compile-facts. The block sizes
    are clamped down for small problems (never below 16).
    """

    block_b: int = 64
    block_n: int = 32
    block_k: int = 32
    num_warps: int = 4
    num_stages: int = 3
    allow_tf32: bool = False

    def smem_bytes(self, dot_dtype) -> int:
        """Predicted shared memory per program (bytes) of the largest kernel (the fused
        backward), a conservative model fitted to ptxas through XLA (H100):

            max(num_stages - 1, 1) * (2 * block_b * block_k * 4 + 2 * block_k * block_n * w)
              + block_b * block_n * 4

        Triton's pipeliner keeps ``num_stages - 1`` copies of one K step's operands (two f32
        row tiles, loaded as f32 and cast in registers; two weight tiles in the dot dtype of
        ``w`` bytes per element), plus one f32 output tile for layout conversions. It equals
        or exceeds every kernel measured (forward, backward, fused, state-grad; the figures
        are in the section named in the class docstring).
        """
        w_bytes = jnp.dtype(dot_dtype).itemsize
        per_stage = 2 * self.block_b * self.block_k * 4 + 2 * self.block_k * self.block_n * w_bytes
        return max(self.num_stages - 1, 1) * per_stage + self.block_b * self.block_n * 4

    def validate(self, dot_dtype=None) -> None:
        """Raises :class:`KernelConfigError` (one line) for block sizes Triton cannot lower,
        or (with ``dot_dtype``, the dtype of the weights) a config that needs more shared
        memory than an H100 block has. Every kernel wrapper and ``Geometry.make`` call it.
        """
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


DEFAULT_CONFIG = HighwayConfig()  # the kernels' default (an argument default: B008)


def _is_pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


def validate_config(config: HighwayConfig, dot_dtype=None) -> None:
    """Raises :class:`KernelConfigError` (one line) for a config Triton cannot lower or that
    needs more shared memory than an H100 block has with ``dot_dtype`` weights (checked when
    given). The same as ``config.validate(dot_dtype)``."""
    config.validate(dot_dtype)
