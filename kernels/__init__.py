"""Pallas kernels for rhhjax; `rhhjax.kernels.highway` is their public API (one module per
kernel family behind it). Model code reaches them only through `rhhjax.ops.recurrence`."""
