"""The op layer: arrays in, arrays out (no Flax modules); models reach kernels only here.

cells.py            one highway micro-step and the dropout masks.
sequence_spec.py    `SequenceSpec`, `ModelFacts`: the plain types of a recurrence call.
spec.py             `resolve`, `IMPLEMENTATIONS` (the registry) and what each runs.
recurrence.py       `highway_sequence`: the whole recurrence as one custom-VJP op.
fused.py, mosaic.py  XLA and Mosaic GPU loops per micro-layer.
persistent.py       one persistent Mosaic GPU kernel per direction; persistent_plans.py
                    its plan, persistent_variant.py how it runs (`PersistentVariant`).
loops.py            what the implementations share (saved rows, the forward scan).
lowrank.py          the rank-d hyper update (hyper_rank > 0, under `fused`).
"""
