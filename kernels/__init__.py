"""Pallas kernels for rhhjax. Model code reaches them only through `rhhjax.recurrence`."""
