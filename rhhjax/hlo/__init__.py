"""The compile report's library: XLA's optimised GPU HLO and compile dumps read back, the
deviceless H100 compile and the cost models (the programs are in benchmarks/; the
persistent kernels' cost model is `rhhjax.ops.persistent_cost`).

    parse.py       HLO text -> computations and instructions.
    launches.py    time loops, launches per step, bytes and FLOPs per launch.
    cost.py        the stated cost model and the per-module summary it predicts from.
    dumps.py       ptxas register / spill reports and the thunk sequence.
    deviceless.py  the real training step compiled for an H100 without a GPU.
    calibrate.py   the cost model calibrated on measured GPU step times.
"""
