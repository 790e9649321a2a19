# ruff: noqa: E501  (the dump fixtures below are real-length lines)
"""XLA's compile dumps read back (benchmarks/hlo/dumps.py): ptxas reports, XLA's spill
warnings, the thunk sequence."""

from __future__ import annotations

from benchmark_scripts import load

hlo_dumps = load("hlo.dumps")

# ----------------------------------------------------------------------------- kernel logs

THUNKS = """\
    023: kCustomKernel [prev=022 (1) | next=024 (1)] highway_forward grid: [4, 4, 1] threads: [128, 1, 1]  shared_memory: 65536 bytes
    051: kCustomKernel [prev=050 (1) | next=052 (1)] highway_forward__2 grid: [4, 32, 1] threads: [128, 1, 1]  shared_memory: 294912 bytes
    083: kCustomKernel [prev=082 (1) | next=084 (1)] loop_add_fusion grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
"""

PTXAS = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'highway_forward' for 'sm_90a'
ptxas info    : Function properties for highway_forward
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 124 registers, used 1 barriers
ptxas info    : Compiling entry function 'highway_forward__2' for 'sm_90a'
ptxas info    : Function properties for highway_forward__2
    152 bytes stack frame, 164 bytes spill stores, 144 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 16 bytes smem
"""

LOG = (
    "I1122 18:55:25.511677 9842 subprocess_compilation.cc:349] ptxas warning : Registers are "
    "spilled to local memory in function 'highway_forward__2', 164 bytes spill stores, 144 "
    "bytes spill loads\n"
)


def test_kernel_log_parsers():
    thunks = hlo_dumps.parse_thunk_kernels(THUNKS)
    assert thunks["highway_forward__2"] == {
        "grid": [4, 32, 1],
        "threads": [128, 1, 1],
        "shared_memory": 294912,
    }
    ptx = hlo_dumps.parse_ptxas_verbose(PTXAS)
    assert ptx["highway_forward"]["registers"] == 124
    assert ptx["highway_forward"]["spill_stores"] == 0
    assert ptx["highway_forward__2"] == {
        "stack": 152,
        "spill_stores": 164,
        "spill_loads": 144,
        "registers": 255,
        "static_smem": 16,
    }
    assert hlo_dumps.parse_spill_log(LOG) == {
        "highway_forward__2": {"spill_stores": 164, "spill_loads": 144}
    }


def test_kernel_stats_flag_spills_and_shared_memory_overflow(tmp_path):
    (tmp_path / "m.thunk_sequence.txt").write_text(THUNKS)
    hlo = (
        '%k = f32[4]{0} custom-call(%a), custom_call_target="__gpu$xla.gpu.triton", '
        'backend_config={name = "highway_forward", num_warps = 4 : i32}'
    )
    stats = {k["kernel"]: k for k in hlo_dumps.kernel_stats(str(tmp_path), hlo, LOG)}
    assert set(stats) == {"highway_forward", "highway_forward__2"}  # not XLA's own fusion
    assert stats["highway_forward__2"]["spills"] and stats["highway_forward__2"]["smem_overflow"]
    assert not stats["highway_forward"]["spills"]
    assert not stats["highway_forward"]["smem_overflow"]


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
