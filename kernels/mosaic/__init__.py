"""The Mosaic GPU kernels (Hopper: wgmma, TMA), each with its reference; reached through
`rhhjax.ops.mosaic` and `rhhjax.ops.persistent`:
    gemm.py                 the pipelined GEMM into shared memory the kernels share.
    forward.py, backward.py  one micro-layer per kernel.
    persistent_forward.py, persistent_backward.py  the whole sequence as one kernel.
    persistent_pair.py, persistent_pair_backward.py  a HyperRHN's two cells, one launch.
    persistent_cell.py, persistent_backward_cell.py  one cell's phase inside them.
    persistent_backward_operands.py  the backward's operands, checks, shared memory.
    plan.py, persistent_slots.py  a persistent plan's resources; its buffers' order.
    rowgroup_layout.py, grid_barrier.py  launch layouts and the grid barrier.
    keep_mask.py, interpret.py, phase_timeline.py  dropout; interpret mode; phase stamps.
"""
