"""The Mosaic GPU kernels (Hopper: wgmma, TMA pipelines), each module with its reference;
reached through `rhhjax.ops.mosaic` and `rhhjax.ops.persistent`.

    gemm.py                 the pipelined GEMM into shared memory the kernels share.
    forward.py              one micro-layer forward per kernel, with its reference.
    backward.py             one micro-layer backward per kernel, with its reference.
    persistent_forward.py   the whole forward as ONE persistent kernel (with the HyperRHN's
                            hyper cell inside it, optionally).
    persistent_cell.py      one cell's phase inside that kernel.
    persistent_backward.py  the whole backward as ONE persistent kernel.
    persistent_backward_cell.py  one cell's phase inside that kernel.
    persistent_backward_operands.py  that kernel's operand bundles, checks and shared
                            memory count.
    plan.py                 a persistent plan's resources, shared memory and refusals.
    persistent_slots.py     the layer-major order of the persistent kernels' GEMM buffers.
    rowgroup_layout.py      the persistent kernels launched as one cluster per row group.
    keep_mask.py            gate-dropout masks as uint8 keep decisions (kernel and reference).
    grid_barrier.py         the persistent kernels' grid barrier (and interpret mode's
                            cluster barrier).
    interpret.py            GPU interpret mode's settings and limits (the kernels on a CPU).
"""
