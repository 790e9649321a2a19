"""`benchmarks/phase_timeline.py`: the table and stragglers of synthetic stamps whose numbers
are known, in either direction's phase order; the files it writes."""

import json

import numpy as np
from benchmark_scripts import load
from rhhjax.kernels.mosaic import phase_timeline as ptl

phase_timeline = load("phase_timeline")
SM = np.array([10, 11, 12], np.int32)


def _stamps(reverse: bool = False) -> np.ndarray:
    """4 phases x 3 blocks: events 10 cycles apart, block 2 twice as slow, block 0 three
    times at phase 0; the clock wraps inside each phase; phases 1000 ns apart (run last to
    first with ``reverse``)."""
    phases, blocks = 4, 3
    scale = np.ones((phases, blocks))
    scale[:, 2], scale[0, 0] = 2, 3
    clocks = 2**32 - 30 + scale[..., None] * 10 * np.arange(len(ptl.EVENTS))
    order = np.arange(phases)[::-1] if reverse else np.arange(phases)
    ns = (2**33 + order * 1000)[:, None] + np.arange(blocks)[None]  # a little apart
    words = [ns % 2**32, ns >> 32] + [clocks[..., e] for e in range(len(ptl.EVENTS))]
    return np.stack(words, axis=-1).astype(np.int64).astype(np.uint32).view(np.int32)


def test_the_table_is_median_and_p90_of_cycles_since_barrier_passed():
    s = phase_timeline.summarize(_stamps(), SM)
    assert s["barrier_passed"] == {"median": 0.0, "p90": 0.0}
    assert s["operands_ready"] == {"median": 10.0, "p90": 20.0}
    assert s["barrier_arrived"] == {"median": 50.0, "p90": 100.0}
    assert s["phase_ns"] == {"median": 1000.0, "p90": 1000.0}


def test_the_straggler_is_the_block_most_often_last_to_arrive_and_its_sm():
    s = phase_timeline.summarize(_stamps(), SM)
    assert s["straggler_blocks"] == [[2, 3], [0, 1]]
    assert s["straggler_sms"] == [[12, 3], [10, 1]]


def test_the_backwards_phases_are_timed_in_the_order_they_ran():
    s = phase_timeline.summarize(_stamps(reverse=True), SM)
    assert s["phase_ns"] == {"median": 1000.0, "p90": 1000.0}
    assert list(phase_timeline.execution_order(_stamps(reverse=True))) == [3, 2, 1, 0]


def test_main_writes_the_table_json_and_picture(tmp_path, capsys):
    path = tmp_path / "stamps.npz"
    np.savez(path, forward_stamps=_stamps(), forward_sm=SM, backward_stamps=_stamps(True),
             backward_sm=SM)  # fmt: skip
    assert phase_timeline.main([str(path), f"--out={tmp_path / 'out'}"]) == 0
    text = (tmp_path / "out" / "phase_timeline.md").read_text()
    assert "## forward" in text and "## backward" in text
    assert "| barrier_arrived (cycles) | 50 | 100 |" in text
    assert "slowest blocks: 2 (3 phases), 0 (1 phases)" in capsys.readouterr().out
    summary = json.loads((tmp_path / "out" / "phase_timeline.json").read_text())
    assert summary["backward"]["straggler_sms"][0] == [12, 3]
    assert (tmp_path / "out" / "phase_timeline.png").read_bytes()[:4] == b"\x89PNG"
