"""The op layer: arrays in, arrays out (no Flax modules).

    cells.py       one highway micro-step and the dropout masks.
    spec.py        `resolve`: the implementation decided once -> `SequenceSpec` (and "auto");
                   `IMPLEMENTATIONS`, the registry of whole-sequence implementations.
    recurrence.py  `highway_sequence`: the whole RHN / HyperRHN recurrence as one custom-VJP op,
                   running the loops of the implementation the spec names.
    fused.py       the XLA implementation's loops (one matmul + one fusion per micro-layer).
    pallas.py      the Pallas implementation's loops (the kernels of `rhhjax.kernels`).
    loops.py       what the implementations share (packed saved rows, the forward scan).
    lowrank.py     the rank-d hyper update (scan step and whole-sequence op).

Models reach kernels only through these modules.
"""
