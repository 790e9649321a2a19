"""The Triton op's helpers under their old name, read by tests/kernel_cases.py until the
Mosaic-family files move: `rhhjax.kernels.triton.common`."""

from rhhjax.kernels.triton.common import dot_precision

__all__ = ["dot_precision"]
