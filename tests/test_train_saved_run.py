"""rhhjax.train.saved_run.load_run: the checkpoint evaluate, sample and the analysis read, and
its one-line errors (a file or a missing folder as the workdir, an unknown step, moved data)."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import assert_trees_equal
from test_analysis_subjects import make_workdir

from rhhjax import data as data_lib
from rhhjax import models
from rhhjax.errors import UserError
from rhhjax.tools import evaluate, sample
from rhhjax.train import checkpoint as ckpt_lib
from rhhjax.train import checksums, saved_run


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A workdir whose best checkpoint (step 7) holds the init parameters x 1.5."""
    return make_workdir(tmp_path_factory.mktemp("saved"), "hyperrhn")


def test_best_and_step_load_the_saved_parameters_model_and_vocabulary(saved):
    workdir, cfg = saved
    with ckpt_lib.Checkpoints(workdir, read_only=True) as ckpts:
        params, meta = ckpts.restore_params("best")
    for which, used in [("best", "best"), (7, "step 7")]:
        run = saved_run.load_run(workdir, which)
        assert (run.checkpoint, run.step, run.epoch, run.workdir) == (used, 7, 0.25, workdir)
        assert_trees_equal(run.params, params)
        assert run.model == models.ModelConfig.from_config(meta["model"])
        assert run.vocab.to_dict() == meta["vocab"]
        assert run.config.to_dict() == meta["config"] and run.meta == meta
    # no latest checkpoint in this workdir: "latest" says so
    with pytest.raises(ckpt_lib.CheckpointError, match="no latest checkpoint"):
        saved_run.load_run(workdir, "latest")


def test_impl_override_changes_only_the_implementation(saved):
    workdir, _ = saved
    run = saved_run.load_run(workdir, impl="fused")
    trained = saved_run.load_run(workdir)
    assert run.model == dataclasses.replace(trained.model, impl="fused")


def test_corpus_is_the_runs_data_and_moved_data_is_checked(saved, tmp_path):
    workdir, cfg = saved
    run = saved_run.load_run(workdir)
    assert run.corpus().vocab.to_dict() == run.meta["vocab"]
    moved = tmp_path / "moved.txt"
    moved.write_bytes(open(cfg.data.text_files, "rb").read())
    again = saved_run.load_run(workdir, text_files=str(moved))
    assert again.config.data.text_files == str(moved)
    assert (again.corpus().split("valid") == run.corpus().split("valid")).all()
    other = tmp_path / "other.txt"
    other.write_text("xyz " * 2000)
    with pytest.raises(ckpt_lib.CheckpointError, match=r"vocabulary \(4 symbols\) differs"):
        saved_run.load_run(workdir, text_files=str(other)).corpus()
    with pytest.raises(data_lib.DataError, match="--data_dir is for PTB runs"):
        saved_run.load_run(workdir, data_dir=str(tmp_path))


def test_bad_workdirs_and_steps_are_one_line(saved, tmp_path):
    workdir, _ = saved
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    cases = [
        (a_file, "best", f"{a_file} is a file, not a training workdir"),
        (tmp_path / "missing", "best", f"workdir {tmp_path / 'missing'} does not exist"),
        (workdir, 8, f"no checkpoint of step 8 in {workdir} (saved: best/7)"),
        (workdir, "newest", f"--checkpoint=newest: expected {saved_run.CHECKPOINT_FLAG_HELP}"),
        (
            workdir,
            "checkpoints/7",
            f"no checkpoint of step 7 in {workdir}/checkpoints (saved: best/7)",
        ),
    ]
    for path, which, message in cases:
        with pytest.raises(ckpt_lib.CheckpointError) as info:
            saved_run.load_run(path, which)
        assert str(info.value) == message


def test_programs_say_a_file_is_not_a_workdir(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for call in (
        lambda: evaluate.run(str(a_file), log=lambda m: None),
        lambda: sample.run(str(a_file), "a", 3, 0.8),
    ):
        with pytest.raises(ckpt_lib.CheckpointError, match="is a file, not a training workdir"):
            call()


def test_evaluate_refuses_a_negative_batch_size_before_loading(saved):
    workdir, _ = saved
    with pytest.raises(UserError, match=r"--batch_size must be >= 1 .* got -3"):
        evaluate.run(str(workdir), batch_size=-3, log=lambda m: None)


def test_evaluate_and_sample_read_the_same_checkpoint(saved):
    workdir, _ = saved
    out = evaluate.run(str(workdir), protocol="windows", batch_size=4, log=lambda m: None)
    assert (out["step"], out["checkpoint"]) == (7, "best")
    assert set(out["results"]["valid"]) == {"windows"}
    text = sample.run(str(workdir), "the ", 5, 0.0)
    assert text.startswith("the ") and len(text) == 9


def _with_latest(tmp_path, saved, steps=(3, 7)):
    """A copy of the saved workdir with latest checkpoints at ``steps`` besides best/7."""
    import shutil

    import jax.numpy as jnp

    workdir = tmp_path / "w"
    shutil.copytree(saved[0], workdir)
    with ckpt_lib.Checkpoints(workdir, read_only=True) as ckpts:
        params, meta = ckpts.restore_params("best")
    with ckpt_lib.Checkpoints(workdir, keep=5) as ckpts:
        for step in steps:
            ckpts.save_latest(step, params, params, jnp.zeros(1), {**meta, "step": step})
    return workdir


def _truncate(step_dir):
    files = [p for p in (step_dir / "params").rglob("*") if p.is_file()]
    target = max(files, key=lambda p: p.stat().st_size)
    target.write_bytes(target.read_bytes()[:10])


@pytest.mark.parametrize(
    "flag,used,step",
    [("3", "step 3", 3), ("checkpoints/7", "step 7", 7), ("best/7", "step 7", 7),
     ("latest", "latest", 7), ("best", "best", 7)],
)  # fmt: skip
def test_any_saved_checkpoint_can_be_chosen(saved, tmp_path, flag, used, step):
    """evaluate / sample took --checkpoint=best|latest only: checkpoints/3 was refused."""
    run = saved_run.load_run(_with_latest(tmp_path, saved), flag)
    assert (run.checkpoint, run.step) == (used, step)


def test_a_damaged_checkpoint_names_the_exact_flag_of_each_undamaged_one(saved, tmp_path):
    """A damaged best listed every other checkpoint, damaged ones too, with no flag to use."""
    workdir = _with_latest(tmp_path, saved)
    _truncate(workdir / "best" / "7")
    damaged = f"checkpoint {workdir}/best/7 is damaged (params/"
    with pytest.raises(ckpt_lib.CheckpointError) as info:
        saved_run.load_run(workdir, "best")
    assert str(info.value).startswith(damaged)
    assert str(info.value).endswith(
        "; use an undamaged one: --checkpoint=checkpoints/7 or --checkpoint=3"
    )
    _truncate(workdir / "checkpoints" / "3")
    with pytest.raises(ckpt_lib.CheckpointError) as info:
        saved_run.load_run(workdir, "best/7")
    assert str(info.value).endswith("; use an undamaged one: --checkpoint=checkpoints/7")
    _truncate(workdir / "checkpoints" / "7")
    with pytest.raises(ckpt_lib.CheckpointError) as info:
        saved_run.load_run(workdir, "best")
    assert str(info.value).endswith(f"; no undamaged checkpoint is left in {workdir}")


@pytest.mark.parametrize("table", ["{}\n", "", "[1, 2]"])
def test_damage_in_the_checksum_file_itself_is_a_readable_line(saved, tmp_path, table):
    """An empty checksums.json ({}) beside a truncated file let orbax read it and end in
    '<bound method pybind11_detail_function_record_v1_...'; now the checksum file is named."""
    workdir = _with_latest(tmp_path, saved, steps=(3,))
    _truncate(workdir / "best" / "7")
    (workdir / "best" / "7" / checksums.CHECKSUMS_FILE).write_text(table)
    with pytest.raises(ckpt_lib.CheckpointError) as info:
        saved_run.load_run(workdir, "best")
    message = str(info.value)
    assert "bound method" not in message and "\n" not in message
    assert f"is damaged (its {checksums.CHECKSUMS_FILE} " in message
    assert message.endswith("; use an undamaged one: --checkpoint=3")


@pytest.mark.parametrize("how", ["edited", "garbled", "deleted"])
def test_evaluate_sample_and_analyze_warn_once_when_config_json_disagrees(
    saved, tmp_path, capfd, how
):
    """They ran from the checkpoint with no word about an edited, garbled or deleted
    config.json; now one warning line, and the checkpoint's model is what runs."""
    import json
    import shutil

    workdir = tmp_path / "w"
    shutil.copytree(saved[0], workdir)
    path = workdir / "config.json"
    if how == "edited":
        config = json.loads(path.read_text())
        config["model"]["hidden"] = 32
        path.write_text(json.dumps(config))
    elif how == "garbled":
        path.write_text("{")
    else:
        path.unlink()
    capfd.readouterr()
    run = saved_run.load_run(workdir)
    (line,) = capfd.readouterr().err.splitlines()
    assert line.startswith(f"warning: {path} ") and line.endswith(
        "following the checkpoint of step 7"
    )
    assert run.model.hidden == 16
    if how == "edited":
        assert "in model.hidden (32 there, 16 in the checkpoint)" in line


def test_a_config_json_that_agrees_gives_no_warning(saved, capfd):
    capfd.readouterr()
    saved_run.load_run(saved[0])
    assert capfd.readouterr().err == ""


def test_the_readme_and_the_flags_offer_any_saved_step():
    from helpers import ROOT

    readme = (ROOT / "README.md").read_text()
    assert readme.count("`--checkpoint=best\\|latest\\|STEP`") >= 1
    for command in ("evaluate", "sample"):
        assert "STEP" in (ROOT / "rhhjax" / "tools" / f"{command}.py").read_text()
