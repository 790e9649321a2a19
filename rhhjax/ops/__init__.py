"""The op layer: arrays in, arrays out (no Flax modules).

    cells.py       one highway micro-step and the dropout masks.
    sequence_spec.py  `SequenceSpec` and `ModelFacts`: the plain types of a recurrence call.
    spec.py        `resolve`: the implementation decided once -> `SequenceSpec` (and "auto");
                   `IMPLEMENTATIONS`, the registry of whole-sequence implementations.
    recurrence.py  `highway_sequence`: the whole RHN / HyperRHN recurrence as one custom-VJP op,
                   running the loops of the implementation the spec names.
    fused.py       the XLA implementation's loops (one matmul + one fusion per micro-layer).
    pallas.py      the Pallas Triton implementation's loops (`rhhjax.kernels.triton`).
    mosaic.py      the Mosaic GPU implementation's loops (`rhhjax.kernels.mosaic`).
    persistent.py  the persistent Mosaic GPU implementation: one kernel per direction.
    persistent_cost.py  its cost model: the plan it runs (the lowest PREDICTED phase time)
                   and the step's PREDICTION table per layout (a command).
    loops.py       what the implementations share (packed saved rows, the forward scan).
    lowrank.py     the rank-d hyper update (scan step and whole-sequence op: the second
                   entry point, for hyper_rank > 0, under `fused`).

Models reach kernels only through these modules.
"""
