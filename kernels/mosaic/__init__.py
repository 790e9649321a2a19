"""The Mosaic GPU kernels (Hopper: wgmma, TMA pipelines), each module with its reference;
reached through `rhhjax.ops.mosaic` and `rhhjax.ops.persistent`.

    gemm.py                 the pipelined GEMM into shared memory the kernels share.
    forward.py              one micro-layer forward per kernel, with its reference.
    backward.py             one micro-layer backward per kernel, with its reference.
    persistent_forward.py   the whole forward as ONE persistent kernel.
    persistent_backward.py  the whole backward as ONE persistent kernel.
    plan.py                 a persistent plan's resources, refusals and labelled prediction.
    grid_barrier.py         the persistent kernels' grid barrier (and interpret mode's
                            cluster barrier).
    interpret.py            GPU interpret mode's settings and limits (the kernels on a CPU).
"""
