# ruff: noqa: E501  (the dump fixtures below are real-length lines)
"""XLA's compile dumps read back (benchmarks/hlo/dumps.py): the thunk sequence."""

from __future__ import annotations

from benchmark_scripts import load

hlo_dumps = load("hlo.dumps")

THUNK_PASSES = """\
000: kCommandBuffer [source       | next=017 (1)]
    001: kCustomKernel [source       | next=002 (1)] loop_select_fusion_4 grid: [1, 1, 1] threads: [2, 1, 1]  shared_memory: 0 bytes
    012: kCopy         [prev=006 (6) | next=013 (1)] kCopy
017: kWhile         [prev=000 (1) | next=000 (1)]
condition:
    018: kCustomKernel [source | sink] loop_compare_fusion grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
  body:
    000: kCommandBuffer [source | sink]
        019: kCustomKernel [source       | next=023 (4)] loop_select_fusion grid: [256, 1, 1] threads: [128, 1, 1]  shared_memory: 0 bytes
        021: kCopy         [source       | next=023 (2)] kCopy
        023: kCustomKernel [prev=022 (1) | next=024 (1)] highway_forward grid: [4, 4, 1] threads: [128, 1, 1]  shared_memory: 65536 bytes
000: kCommandBuffer [prev=017 (1) | next=043 (1)]
    030: kCustomKernel [source       | next=031 (1) ] wrapped_transpose grid: [640, 1, 1] threads: [128, 1, 1]  shared_memory: 0 bytes
043: kWhile         [prev=000 (1) | next=000 (1)]
condition:
    044: kCustomKernel [source | sink] loop_compare_fusion grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
  body:
    045: kCustomKernel [source       | next=051 (6)] loop_pad_fusion_3 grid: [1024, 1, 1] threads: [128, 1, 1]  shared_memory: 0 bytes
    021: kDynamicSliceFusion [source       | next=000 (1)] params=1, results=1
        022: kCopy [source | sink] kCopy
    046: kGemm         [source       | next=051 (5)] gemm
"""


def test_thunk_loops_count_body_thunks_and_command_buffers():
    loops = hlo_dumps.parse_thunk_loops(THUNK_PASSES)
    assert loops == [
        {"body_thunks": 3, "condition_thunks": 1, "command_buffer": True},
        # the dynamic-slice fusion is one launch: the copy nested in it
        {"body_thunks": 3, "condition_thunks": 1, "command_buffer": False},
    ]
