"""The compile report's library (benchmarks/hlo/, not installed: the scripts beside it import
it as ``hlo``): XLA's optimised GPU HLO and compile dumps read back, the deviceless H100
compile and the cost models (the programs are in benchmarks/).

    parse.py       HLO text -> computations and instructions.
    launches.py    time loops, launches per step, bytes and FLOPs per launch.
    cost.py        the stated cost model and the per-module summary it predicts from.
    dumps.py       the thunk sequence beside the HLO's launch count.
    deviceless.py  the real training step compiled for an H100 without a GPU.
"""
