"""`rhhjax.train.autotune`: the candidates, the choice (fastest of those that agree with the
first, within the budget), its cache, and the trainer running the winner."""

from __future__ import annotations

import dataclasses
import json

import pytest
from helpers import tiny_run_config, write_text

from rhhjax import models
from rhhjax.ops import persistent
from rhhjax.train import autotune, trainer
from rhhjax.train import step as step_lib
from rhhjax.train.config import default_train_config
from rhhjax.train.optim import OptimizerConfig

TINY = models.ModelConfig(vocab_size=12, embed_dim=4, hidden=16, hyper_hidden=8, depth=2)
OC = OptimizerConfig.from_config(default_train_config(), batches_per_epoch=10)
PAPER_BF16 = models.ModelConfig(dtype="bfloat16")


class FakeTimer:
    """``measure_fn`` whose step time, loss and grad norm come from a table by label, and a
    clock that each measurement advances by ``seconds``."""

    def __init__(self, ms: dict, loss: dict | None = None, seconds: float = 1.0):
        self.ms, self.loss, self.seconds, self.now, self.calls = ms, loss or {}, seconds, 0.0, []

    def clock(self) -> float:
        return self.now

    def __call__(self, mc, oc, args):
        label = autotune.Candidate(mc.impl, mc.persistent.text()).label()
        self.calls.append(label)
        self.now += self.seconds
        if label not in self.ms:
            raise RuntimeError(f"{label} does not compile")
        return [self.ms[label] / 1e3] * 3, self.loss.get(label, 2.5), 10.0


def fused_and_persistent(count: int = 3) -> list[autotune.Candidate]:
    return autotune.candidates(TINY, 4)[:count]


def test_candidates_start_with_autos_pick_then_every_persistent_variant():
    found = autotune.candidates(PAPER_BF16, 256)
    assert found[0] == autotune.Candidate("fused")
    assert found[1] == autotune.Candidate("persistent", "layout=rowgroup")  # the default
    assert found[2] == autotune.Candidate("persistent", "layout=rowgroup,stages=6")
    assert len(found) == len(set(found)) == 3  # no twins; the count: the test below


def test_candidates_leave_out_the_variants_no_gpu_has_tested():
    """sharing multicast and split_k, the epilogue in registers, the paired layout: timed by
    `gpu_suite.sh tune`, not in a user's run."""
    variants = persistent.variant_candidates(256, 1000, 128, "bfloat16")
    tested = ("none", "shared_memory", "rowgroup")
    untested = [v.text() for v in variants if (v.sharing, v.epilogue, v.layout) != tested]
    found = [c.variant for c in autotune.candidates(PAPER_BF16, 256)]
    assert untested and not set(untested) & set(found)
    assert len(found) == 1 + len(variants) - len(untested)


def test_models_persistent_cannot_run_have_autos_pick_alone():
    lstm = dataclasses.replace(PAPER_BF16, type="lstm")
    rank_d = dataclasses.replace(PAPER_BF16, hyper_rank=2)
    assert autotune.candidates(lstm, 256) == [autotune.Candidate("scan")]
    assert autotune.candidates(rank_d, 256) == [autotune.Candidate("fused")]
    assert len(autotune.candidates(dataclasses.replace(PAPER_BF16, type="rhn"), 256)) == 3


def test_the_fastest_candidate_that_agrees_wins_and_is_cached(tmp_path):
    found = fused_and_persistent()
    labels = [c.label() for c in found]
    timer = FakeTimer(dict(zip(labels, (40.0, 30.0, 20.0), strict=True)), {labels[2]: 2.9})
    path = tmp_path / "autotune.json"
    choice = autotune.choose(TINY, OC, 4, 5, 60.0, path=path, measure_fn=timer, clock=timer.clock)
    # labels[2] is fastest but its loss is 16% off the first's: a broken kernel, not chosen
    assert (choice.impl, choice.variant) == (found[1].impl, found[1].variant)
    entry = next(iter(json.loads(path.read_text()).values()))
    assert [r["status"] for r in entry["rows"][:3]] == ["ok", "ok", "mismatch"]
    again = autotune.choose(TINY, OC, 4, 5, 60.0, path=path, measure_fn=None)
    assert (again.impl, again.variant) == (choice.impl, choice.variant)
    assert again.line.endswith("(cached)")


def test_no_candidate_starts_once_the_budget_cannot_hold_the_slowest_so_far(tmp_path):
    labels = [c.label() for c in fused_and_persistent(4)]
    timer = FakeTimer(dict.fromkeys(labels, 30.0), seconds=10.0)
    choice = autotune.choose(
        TINY, OC, 4, 5, 25.0, path=tmp_path / "a.json", measure_fn=timer, clock=timer.clock
    )
    assert timer.calls == labels[:2]  # 0 + 10 <= 25, then 20 + 10 > 25
    assert "skipped" in choice.line and choice.impl == "fused"


def test_a_failing_candidate_is_a_row_and_the_others_still_compete(tmp_path):
    labels = [c.label() for c in fused_and_persistent()]
    timer = FakeTimer({labels[0]: 40.0, labels[2]: 35.0})
    path = tmp_path / "a.json"
    choice = autotune.choose(TINY, OC, 4, 5, 60.0, path=path, measure_fn=timer, clock=timer.clock)
    assert choice.variant == fused_and_persistent()[2].variant
    assert f"{len(autotune.candidates(TINY, 4)) - 2} failed" in choice.line
    rows = next(iter(json.loads(path.read_text()).values()))["rows"]
    assert rows[1]["error"].startswith("RuntimeError: ")


@pytest.mark.parametrize("damage", ["{not json", '["a list"]', '{"KEY": {"impl": "nope"}}'])
def test_a_damaged_cache_is_timed_again_and_rewritten(tmp_path, damage):
    path = tmp_path / "autotune.json"
    key = autotune.cache_key(TINY, 4, 5, "cpu")
    path.write_text(damage.replace("KEY", key))
    timer = FakeTimer({c.label(): 1.0 for c in fused_and_persistent()})
    found = fused_and_persistent(1)
    choice = autotune.choose(TINY, OC, 4, 5, 1.5, path=path, measure_fn=timer, clock=timer.clock)
    assert timer.calls[0] == found[0].label() and choice.impl == found[0].impl
    assert isinstance(json.loads(path.read_text()), dict)


def test_real_steps_of_scan_and_fused_agree_and_are_timed():
    found = [autotune.Candidate("scan"), autotune.Candidate("fused")]
    rows = autotune.time_candidates(TINY, OC, 4, 5, found, 600.0)
    assert [r.status for r in rows] == ["ok", "ok"], rows
    assert all(r.step_ms > 0 for r in rows)
    assert rows[1].loss == pytest.approx(rows[0].loss, rel=1e-5)
    assert rows[1].grad_norm == pytest.approx(rows[0].grad_norm, rel=1e-4)


def test_autotune_is_off_unless_auto_on_one_gpu_with_seconds():
    gpu = ("gpu",)
    assert autotune.off_reason(TINY, 60.0, 1, *gpu) is None
    assert "asked for" in autotune.off_reason(dataclasses.replace(TINY, impl="fused"), 60, 1, *gpu)
    assert "autotune_seconds=0" in autotune.off_reason(TINY, 0.0, 1, *gpu)
    assert "2 devices" in autotune.off_reason(TINY, 60.0, 2, *gpu)
    assert "cpu" in autotune.off_reason(TINY, 60.0, 1, "cpu")


def test_the_trainer_runs_the_winner_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("RHHJAX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(autotune, "off_reason", lambda *args: None)
    found = [autotune.Candidate("fused"), autotune.Candidate("scan")]
    monkeypatch.setattr(autotune, "candidates", lambda *args: found)
    made, real = [], step_lib.make_train_step
    monkeypatch.setattr(step_lib, "make_train_step", lambda mc, *a: made.append(mc) or real(mc, *a))
    cfg = tiny_run_config(write_text(tmp_path / "t.txt"), train__max_steps=2)
    lines = []
    trainer.train_and_evaluate(cfg, tmp_path / "w", log=lines.append)
    tuned = [line for line in lines if line.startswith("autotune: the training step runs ")]
    assert len(tuned) == 1 and (tmp_path / "cache" / autotune.CACHE_FILE).is_file()
    winner = tuned[0].removeprefix("autotune: the training step runs ").split()[0]
    assert made[-1].impl == winner


def test_a_cache_that_cannot_be_written_still_gives_the_choice(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the cache folder would be
    labels = [c.label() for c in fused_and_persistent(2)]
    timer = FakeTimer(dict(zip(labels, (40.0, 30.0), strict=True)), seconds=30.0)
    path = blocker / "autotune.json"
    choice = autotune.choose(TINY, OC, 4, 5, 70.0, path=path, measure_fn=timer, clock=timer.clock)
    assert choice.impl == "persistent" and "(not cached: " in choice.line
    assert list(tmp_path.iterdir()) == [blocker]
