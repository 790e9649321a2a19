"""The docs' GPU figures are their results files' figures: one table below, each figure as
the docs write it, the file it comes from and how to read it there. A figure edited in a doc
without its source (or a source re-measured without its doc) fails here.

- every row: the figure as written equals the file's value, rounded as written;
- every row: it is written in each doc it names (its one account and its summaries);
- README.md, docs/design.md and docs/limitations.md: every decimal pair ``A / B`` and every
  decimal time (``41.7 ms``, ``1.03 us``) is a figure of the table, so a drifted digit there
  matches no row. docs/persistent_design.md and the other docs are a design log full of
  PREDICTIONS: there only the rows that name them are checked."""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load(path: str) -> dict:
    return json.loads((ROOT / path).read_text())


def step_ms(path: str, impl: str, dtype: str, model: str = "hyperrhn", **match) -> float:
    """The median step time of the one paper-size row of ``path`` that matches."""
    rows = [
        r
        for r in load(path)["rows"]
        if r["impl"] == impl and r["dtype"] == dtype and r["model"] == model
        and r.get("size", "paper") == "paper"
        and all(v in str(r.get(k, "")) for k, v in match.items())
    ]  # fmt: skip
    assert len(rows) == 1, f"{path}: {len(rows)} rows for {impl} {dtype} {model} {match}"
    return rows[0]["step_ms_median"]


def bpc(path: str, split: str) -> float:
    return load(path)["final"][split]["windows"]["bpc"]


def valid_and_test(path: str) -> tuple[float, float]:
    """A run's results.json: its valid and test BPC (windows)."""
    return bpc(path, "valid"), bpc(path, "test")


def autotune_ms(variant: str, table: str = "") -> float:
    """The median step of one variant's row in an autotune table (AUTOTUNE by default)."""
    (row,) = [r for r in load(table or AUTOTUNE)["rows"] if r["variant"] == variant]
    return row["step_ms_median"]


def chars_per_second(run: str) -> float:
    """A training run's steady rate: the median progress line's characters a second."""
    lines = (ROOT / f"{run}/metrics.jsonl").read_text().splitlines()
    rates = [r["chars_per_sec"] for r in map(json.loads, lines) if r.get("kind") == "train"]
    return statistics.median(rates)


def steady_step_ms(run: str) -> float:
    """A training run's steady step: batch x seq_len over the median progress line's rate."""
    config = load(f"{run}/config.json")["train"]
    return config["batch_size"] * config["seq_len"] / chars_per_second(run) * 1e3


PTB_GPU = "results/ptb_gpu/results.json"
PTB_GPU_FAST = "results/ptb_gpu_fast/results.json"  # configs/ptb.py:fast, H200, 2026-11-27
FAST_PERSISTENT = "results/ptb_gpu_fast_persistent"  # the same with persistent, 2026-11-28
AUTOTUNE = "results/autotune_gpu_h200_2026-11-28.json"  # results/gpu_h200_2026-11-28.md
FAST_ROWGROUP = "results/ptb_gpu_fast_rowgroup"  # persistent in row groups, 2026-11-28b
AUTOTUNE_B = "results/autotune_gpu_h200_2026-11-28b.json"  # results/gpu_h200_2026-11-28b.md
CPU_RUN = "results/claims_cpu/hyperrhn_seed-0/results.json"
BENCH = "results/bench_gpu_h100.json"  # 2026-11-23: results/gpu_h100.md
FIRST = "results/bench_gpu_h100_persistent.json"  # 2026-11-26: results/gpu_h100_2026-11-26.md
KERNELS = "results/bench_gpu_h100_kernels_2026-11-26.json"  # later: gpu_h100_2026-11-26b.md
H200 = "results/bench_gpu_h200_2026-11-27.json"  # results/gpu_h200_2026-11-27.md
TOKEN = "results/calibrate_persistent_h100.json"
SIGNFLIP = "results/calibrate_persistent_h100_signflip.json"
GRID = "hyper_inside=0,layout=grid"  # the grid variant as the 2026-11-28 tables name it
APART, INSIDE = "HYPER_INSIDE=False", "defaults (HYPER_INSIDE=True"

README, LIMITATIONS, DESIGN = "README.md", "docs/limitations.md", "docs/design.md"
RESULTS = "results/README.md"  # the index of every measurement
PERSISTENT_DESIGN = "docs/persistent_design.md"


class Figure(NamedTuple):
    written: str  # the numbers as the docs write them: "34.2 / 33.1"
    source: str  # the results file
    values: Callable[[], tuple[float, ...]]  # read from it
    docs: tuple[str, ...]  # where the figure must be written


FIGURES = [
    Figure("1.3791 / 1.3424", PTB_GPU, lambda: valid_and_test(PTB_GPU), (RESULTS,)),
    Figure("1.3632 / 1.3271", PTB_GPU_FAST, lambda: valid_and_test(PTB_GPU_FAST),
           (README, RESULTS)),
    Figure("1.3384 / 1.3032", f"{FAST_PERSISTENT}/results.json",
           lambda: valid_and_test(f"{FAST_PERSISTENT}/results.json"), (RESULTS,)),
    Figure("29.2", f"{FAST_PERSISTENT}/metrics.jsonl", lambda: (steady_step_ms(FAST_PERSISTENT),),
           (RESULTS,)),
    Figure("1.3324 / 1.2964", f"{FAST_ROWGROUP}/results.json",
           lambda: valid_and_test(f"{FAST_ROWGROUP}/results.json"),
           (README, LIMITATIONS, RESULTS)),
    Figure("27.0", f"{FAST_ROWGROUP}/metrics.jsonl", lambda: (steady_step_ms(FAST_ROWGROUP),),
           (README, RESULTS)),
    Figure("0.95", f"{FAST_ROWGROUP}/metrics.jsonl",
           lambda: (chars_per_second(FAST_ROWGROUP) / 1e6,), (README,)),
    Figure("28.2", AUTOTUNE_B,
           lambda: (autotune_ms("hyper_inside=0,layout=rowgroup,status=poison", AUTOTUNE_B),),
           (README, LIMITATIONS, PERSISTENT_DESIGN)),
    Figure("30.5", AUTOTUNE_B, lambda: (autotune_ms(f"{GRID},status=poison", AUTOTUNE_B),),
           (PERSISTENT_DESIGN,)),
    Figure("31.3", AUTOTUNE_B, lambda: (autotune_ms(GRID, AUTOTUNE_B),), (PERSISTENT_DESIGN,)),
    Figure("31.9", H200, lambda: (step_ms(H200, "persistent", "bfloat16"),),
           (PERSISTENT_DESIGN, RESULTS)),
    Figure("40.2", H200, lambda: (step_ms(H200, "fused", "bfloat16"),),
           (README, LIMITATIONS, PERSISTENT_DESIGN, RESULTS)),
    Figure("1.7188 / 1.6730", CPU_RUN, lambda: valid_and_test(CPU_RUN), (README,)),
    Figure("41.7 / 50.4", BENCH,
           lambda: (step_ms(BENCH, "fused", "bfloat16"), step_ms(BENCH, "fused", "float32")),
           (RESULTS,)),
    Figure("41.7", BENCH, lambda: (step_ms(BENCH, "fused", "bfloat16"),), (DESIGN,)),
    Figure("119.1", BENCH, lambda: (step_ms(BENCH, "scan", "bfloat16"),), (DESIGN,)),
    Figure("59.8", FIRST, lambda: (step_ms(FIRST, "persistent", "bfloat16"),), (RESULTS,)),
    Figure("42.0", FIRST, lambda: (step_ms(FIRST, "fused", "bfloat16"),), (RESULTS,)),
    Figure("20.8", TOKEN, lambda: (load(TOKEN)["measured"]["barrier_us"],), (RESULTS,)),
    Figure("1.03", SIGNFLIP, lambda: (load(SIGNFLIP)["measured"]["barrier_us"],),
           (PERSISTENT_DESIGN, RESULTS)),
    Figure("34.2 / 33.1", KERNELS,
           lambda: (step_ms(KERNELS, "persistent", "bfloat16", variant=APART),
                    step_ms(KERNELS, "persistent", "float32", variant=APART)),
           (DESIGN, PERSISTENT_DESIGN, RESULTS)),
    Figure("40.5 / 38.5", KERNELS,
           lambda: (step_ms(KERNELS, "persistent", "bfloat16", variant=INSIDE),
                    step_ms(KERNELS, "persistent", "float32", variant=INSIDE)),
           (PERSISTENT_DESIGN, RESULTS)),
    Figure("41.7 / 50.4", KERNELS,  # the same figures, re-measured beside the kernels
           lambda: (step_ms(KERNELS, "fused", "bfloat16"), step_ms(KERNELS, "fused", "float32")),
           (RESULTS,)),
    Figure("48.9", KERNELS, lambda: (step_ms(KERNELS, "mosaic", "bfloat16"),), (DESIGN, RESULTS)),
]  # fmt: skip

# Figures from outside this project's results files, with where they come from.
NOT_OURS = {"1.21 / 1.19": "the paper's valid / test BPC after ~660 epochs (Suarez 2017)"}

SCANNED = (README, DESIGN, LIMITATIONS)


def normalized(doc: str) -> str:
    """A doc's text with bold marks and line breaks gone, so figures read as one line."""
    return " ".join((ROOT / doc).read_text().replace("**", "").split())


def numbers(written: str) -> list[str]:
    return written.split(" / ")


def ids(figure: Figure) -> str:
    return f"{figure.written}@{Path(figure.source).name}"


@pytest.mark.parametrize("figure", FIGURES, ids=ids)
def test_each_figure_is_its_sources(figure):
    values = figure.values()
    places = [len(n.split(".")[1]) for n in numbers(figure.written)]
    assert len(values) == len(places), figure
    read = " / ".join(f"{v:.{p}f}" for v, p in zip(values, places, strict=True))
    assert read == figure.written, f"{figure.source} reads {read}, the docs write {figure.written}"


# Between a pair's numbers: "34.2 / 33.1", "34.2 ms bf16 / 33.1 ms f32",
# "valid 1.3791 / test 1.3424".
BETWEEN = r"(?: ms| us| GB)?(?: bf16| f32)? / (?:test )?"


@pytest.mark.parametrize("figure", FIGURES, ids=ids)
def test_each_figure_is_written_where_it_is_named(figure):
    pattern = r"(?<![\d.])" + BETWEEN.join(map(re.escape, numbers(figure.written))) + r"(?!\d)"
    for doc in figure.docs:
        assert re.search(pattern, normalized(doc)), f"{doc} does not write {figure.written}"


PAIR = re.compile(r"(?<![\d.])(\d+\.\d+)" + BETWEEN + r"(\d+\.\d+)(?![\d.])")
TIME = re.compile(r"(?<![\d./-])(\d+\.\d+) ?(?:ms|us)\b")


@pytest.mark.parametrize("doc", SCANNED)
def test_every_gpu_figure_of_the_summaries_is_in_the_table(doc):
    """Every decimal pair and every decimal time in the README, the design and the
    limitations is a row's figure (a pair a whole row, a time any row's number)."""
    pairs = {f.written for f in FIGURES} | set(NOT_OURS)
    singles = {n for f in FIGURES for n in numbers(f.written)}
    text = normalized(doc)
    unsourced = sorted(
        {f"{a} / {b}" for a, b in PAIR.findall(text) if f"{a} / {b}" not in pairs}
        | {t for t in TIME.findall(text) if t not in singles}
    )
    assert not unsourced, (
        f"{doc} writes figures that tests/test_docs_figures.py's table does not source: "
        f"{unsourced} (add a row naming the results file, or correct the figure)"
    )


def test_the_readme_counts_the_untimed_variants_of_the_autotune_tables():
    """ "N of its M bf16 variants are untimed": M the paper bf16 step's candidates today, N
    those that no autotune table timed (a text timed before names today's variant of it)."""
    from rhhjax.ops import persistent

    match = re.search(r"(\d+) of its (\d+) bf16 variants are untimed", normalized(README))
    assert match, "README.md no longer counts the untimed variants"
    candidates = persistent.variant_candidates(256, 1000, 128, "bfloat16")
    timed = {
        _variant_or_none(persistent, row["variant"])
        for table in (AUTOTUNE, AUTOTUNE_B)
        for row in load(table)["rows"]
        if (row["size"], row["dtype"], row["status"]) == ("paper", "bfloat16", "ok")
    }
    untimed = [v for v in candidates if v not in timed]
    assert (int(match[1]), int(match[2])) == (len(untimed), len(candidates))


def _variant_or_none(persistent, text: str):
    """The variant a table's text names today, or None where it names a removed option."""
    try:
        return persistent.parse_variant(text)
    except persistent.VariantError:
        return None


def test_the_design_counts_the_paper_candidates():
    from rhhjax.ops import persistent

    match = re.search(
        r"At the paper size, (\d+) in bf16 and (\d+) in f32", normalized(PERSISTENT_DESIGN)
    )
    assert match, "docs/persistent_design.md no longer counts the candidates"
    dtypes = ("bfloat16", "float32")
    counts = [len(persistent.variant_candidates(256, 1000, 128, d)) for d in dtypes]
    assert [int(match[1]), int(match[2])] == counts
