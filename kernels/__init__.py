"""Pallas kernels for rhhjax, installed as `rhhjax.kernels`; model code reaches them only
through `rhhjax.ops`.

Shared by every implementation:

    layout.py     `Geometry`: the padded layout of the whole-sequence recurrence.
    hardware.py   the GPU the kernels are built for, in one table (`H100`).

The Pallas Triton op (`rhhjax.kernels.triton`, its own facade):

    triton/       config.py, common.py, forward.py, backward.py, stacked.py.

The Mosaic GPU kernels (Hopper):

    mosaic_gemm.py           the pipelined GEMM into shared memory the kernels share.
    mosaic_forward.py        one micro-layer forward per kernel, with its reference.
    mosaic_backward.py       one micro-layer backward per kernel, with its reference.
    persistent_forward.py    the whole forward as ONE persistent kernel.
    persistent_backward.py   the whole backward as ONE persistent kernel.
    persistent_plan.py       a persistent plan's resources, refusals and labelled prediction.
    persistent_slots.py      the layer-major order of the kernels' GEMM operand buffers.
    rowgroup_layout.py       the persistent kernels as one cluster per row group.
    grid_barrier.py          the persistent kernels' grid barrier (and interpret mode's
                             cluster barrier).
    gpu_interpret.py         GPU interpret mode's settings and limits (the kernels on a CPU).
    common.py                the Triton helpers' old name (read by tests/kernel_cases.py).
"""


def __getattr__(name: str):
    """`rhhjax.kernels.highway`, the Triton API's old name, still read by the Mosaic-family
    ops and tests until they move beside it: the same module as `rhhjax.kernels.triton`."""
    if name == "highway":
        import importlib

        return importlib.import_module("rhhjax.kernels.triton")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
