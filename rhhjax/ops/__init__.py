"""The op layer: arrays in, arrays out (no Flax modules).

`cells` holds one highway micro-step and the dropout masks; `recurrence` runs a whole HyperRHN /
RHN sequence as one op (`fused` custom VJP or the `pallas` kernels of `rhhjax.kernels`);
`lowrank` is the rank-d hyper update. Models reach kernels only through these modules.
"""
