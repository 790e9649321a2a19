"""Pallas kernels for rhhjax, installed as `rhhjax.kernels`; model code reaches them only
through `rhhjax.ops`.

Shared by every implementation:

    layout.py     `Geometry`: the padded layout of the whole-sequence recurrence.
    hardware.py   the GPU the kernels are built for, in one table (`H100`).

The Pallas Triton op (`rhhjax.kernels.triton`, its own facade):

    triton/       config.py, common.py, forward.py, backward.py, stacked.py.

The Mosaic GPU kernels (Hopper; `rhhjax.kernels.mosaic`):

    mosaic/       gemm.py, forward.py, backward.py, persistent_forward.py,
                  persistent_backward.py, plan.py, grid_barrier.py, interpret.py,
                  persistent_slots.py, rowgroup_layout.py, keep_mask.py.
"""
