"""Data parallelism (rhhjax.parallel) on 4 simulated CPU devices against one device.

The device count is fixed when jax starts, so each run is a subprocess of this file with
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` (``python tests/test_parallel.py MODE``).
One tiny HyperRHN run (4 steps, batch 8, validation at steps 2 and 4, final evaluation on the
windows and stream protocols) is made on 4 devices and on 1; then one process with 1 device
resumes both to step 6 (the 4-device checkpoint restored on 1 device).

Tolerance: the 4-device step sums the loss and gradients in another order (per device, then
across devices), so numbers agree to float32 rounding, not bitwise: losses / BPC within
``RTOL`` relative, parameters within ``ATOL`` absolute after 4 (and 6) Adam steps.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT, assert_trees_close, tiny_run_config, write_text

RTOL = 1e-5  # losses, BPC, accuracy: relative
ATOL = 1e-5  # parameters: absolute (values are O(0.1..1); Adam steps are lr = 1e-3)
STEPS = 4


# ----------------------------------------------------------------------------- child side


def _config(text_file: str, **overrides):
    small = dict(
        train__batch_size=8,
        train__max_steps=STEPS,
        train__eval_every_steps=2,
        train__log_every_steps=1,
        eval__batch_size=8,
        eval__final_protocols="windows,stream",
    )
    return tiny_run_config(text_file, **{**small, **overrides})


def _child(mode: str, text_file: str, out: str, four: str = "") -> None:
    """``train``: the 4-step run in ``out/run`` (on 4 devices also an FSDP run and the
    batch-size errors). With ``four`` (the 4-device child's ``out``): then wait for it,
    copy both runs to ``out/both`` and resume them to step 6 here (one compilation)."""
    import jax

    from rhhjax import parallel
    from rhhjax.train import step as step_lib
    from rhhjax.train import trainer

    parallel.maybe_initialize_distributed()  # multi: from the env, before jax.device_count
    out = Path(out)
    report: dict = {"devices": jax.device_count()}
    if mode == "train":
        seen = []
        make = step_lib.make_train_step

        def spy(*args, **kwargs):  # record the layout of the first step's inputs / outputs
            step = make(*args, **kwargs)

            def run(*a):
                result = step(*a)
                if not seen:
                    seen.append(
                        {
                            "inputs": [len(s.data.devices()) for s in a[3].addressable_shards],
                            "input_shard_rows": a[3].addressable_shards[0].data.shape[0],
                            "params_replicated": all(
                                x.sharding.is_fully_replicated for x in jax.tree.leaves(result[0])
                            ),
                            "carry_shard_rows": [
                                x.addressable_shards[0].data.shape[0]
                                for x in jax.tree.leaves(result[2])
                            ],
                            "loss_replicated": result[3].sharding.is_fully_replicated,
                        }
                    )
                return result

            return run

        step_lib.make_train_step = spy
        report["results"] = trainer.train_and_evaluate(
            _config(text_file), out / "run", log=lambda m: None
        )
        step_lib.make_train_step = make
        report["layout"] = seen[0]
        if four:
            report["resume_log"] = _resume(text_file, out, Path(four))
            (out / f"report_{mode}.json").write_text(json.dumps(report, default=str))
            return
        # FSDP: 2 steps with parameters / optimizer state split over the devices
        fsdp = _config(
            text_file,
            train__fsdp=True,
            train__max_steps=2,
            train__eval_every_steps=0,
            eval__final_protocols="",
        )
        trainer.train_and_evaluate(fsdp, out / "fsdp", log=lambda m: None)
        # not divisible by the 4 devices: one-line errors before anything is compiled
        report["errors"] = []
        for key in ("train__batch_size", "eval__batch_size"):
            try:
                trainer.train_and_evaluate(
                    _config(text_file, **{key: 6}), out / key, log=lambda m: None
                )
            except parallel.ParallelError as e:
                report["errors"].append(str(e))
        report["bad_workdir_written"] = any(
            (out / k).exists() for k in ("train__batch_size", "eval__batch_size")
        )
    elif mode == "multi":  # one of 2 processes x 2 devices (jax.distributed, env variables)
        report["process"] = jax.process_index()
        try:  # a config that differs between the processes: the same one-line error on both
            cfg = _config(text_file, seed=jax.process_index())
            trainer.train_and_evaluate(cfg, out / "mismatch", log=lambda m: None)
        except parallel.ParallelError as e:
            report["mismatch"] = str(e)
        lines: list[str] = []
        report["results"] = trainer.train_and_evaluate(
            _config(text_file), out / "run", log=lines.append
        )
        report["lines"] = len(lines)
        out = out / f"p{jax.process_index()}"
        out.mkdir()
    (out / f"report_{mode}.json").write_text(json.dumps(report, default=str))


def _resume(text_file: str, out: Path, four: Path) -> list[str]:
    """Copies of this run and the 4-device run (at step 4) continued to step 6 here."""
    import time

    from rhhjax.train import trainer

    deadline = time.time() + 280
    while not (four / "report_train.json").exists():
        if time.time() > deadline:
            raise TimeoutError("the 4-device run did not finish")
        time.sleep(0.2)
    shutil.copytree(out / "run", out / "both" / "run1")
    shutil.copytree(four / "run", out / "both" / "run4")
    lines: list[str] = []
    for name in ("run1", "run4"):
        cfg = _config(text_file, train__max_steps=STEPS + 2, eval__final_protocols="")
        trainer.train_and_evaluate(cfg, out / "both" / name, log=lines.append)
    return lines


# ----------------------------------------------------------------------------- test side


def _run_children(specs, text_file: Path, timeout: float = 300) -> None:
    """Start ``[(mode, devices, out)]`` children at once; fail with their stderr."""
    procs = []
    for mode, devices, out, *extra in specs:
        env = dict(os.environ)
        if extra and isinstance(extra[0], dict):
            env.update(extra.pop(0))
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
        env["JAX_PLATFORMS"] = "cpu"
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        cmd = [sys.executable, __file__, mode, str(text_file), str(out), *map(str, extra)]
        procs.append(
            subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        )
    for (mode, devices, *_), p in zip(specs, procs, strict=True):
        _, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, f"{mode} on {devices} device(s) failed:\n{err.decode()[-3000:]}"


def _records(workdir: Path, kind: str) -> list[dict]:
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def _params(workdir: Path, step: int):
    from rhhjax.train import checkpoint as ckpt_lib

    with ckpt_lib.Checkpoints(workdir, read_only=True) as c:
        params, _ = c.restore_params("latest", step)  # no template: on one device
    return params


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("parallel")
    text_file = write_text(root / "shake.txt")
    one, four = root / "one", root / "four"
    # the 1-device child then resumes copies of both runs (step 4) to step 6
    _run_children([("train", 4, four), ("train", 1, one, four)], text_file)
    reports = {
        n: json.loads((d / "report_train.json").read_text()) for n, d in (("1", one), ("4", four))
    }
    return {"one": one / "run", "four": four / "run", "both": one / "both", "reports": reports}


def test_four_devices_used(runs):
    r1, r4 = runs["reports"]["1"], runs["reports"]["4"]
    assert r1["devices"] == 1 and r4["devices"] == 4
    layout = r4["layout"]
    assert layout["inputs"] == [1, 1, 1, 1]  # the batch is split, one block per device
    assert layout["input_shard_rows"] == 2  # 8 rows / 4 devices
    assert layout["carry_shard_rows"] == [2, 2]  # HyperRHN carry (hyper, main) split as well
    assert layout["params_replicated"] and layout["loss_replicated"]
    assert r1["layout"]["input_shard_rows"] == 8


def test_training_matches_one_device(runs):
    t1, t4 = _records(runs["one"], "train"), _records(runs["four"], "train")
    assert [r["step"] for r in t4] == list(range(1, STEPS + 1)) == [r["step"] for r in t1]
    for a, b in zip(t1, t4, strict=True):
        np.testing.assert_allclose(b["loss"], a["loss"], rtol=RTOL)
        np.testing.assert_allclose(b["grad_norm"], a["grad_norm"], rtol=1e-4)
    for step in (2, STEPS):
        assert_trees_close(
            _params(runs["four"], step), _params(runs["one"], step), atol=ATOL, rtol=0
        )


def test_evaluation_matches_one_device(runs):
    v1, v4 = _records(runs["one"], "valid"), _records(runs["four"], "valid")
    assert [r["step"] for r in v1] == [2, STEPS] == [r["step"] for r in v4]
    for a, b in zip(v1, v4, strict=True):
        assert a["chars"] == b["chars"]
        np.testing.assert_allclose(b["bpc"], a["bpc"], rtol=RTOL)
        np.testing.assert_allclose(b["acc"], a["acc"], rtol=RTOL)
    f1 = runs["reports"]["1"]["results"]["final"]
    f4 = runs["reports"]["4"]["results"]["final"]
    assert f1.keys() == f4.keys() == {"valid", "test"}
    for split in f1:
        assert f1[split].keys() == f4[split].keys() == {"windows", "stream"}
        for protocol, m in f1[split].items():
            assert f4[split][protocol]["chars"] == m["chars"]
            np.testing.assert_allclose(f4[split][protocol]["bpc"], m["bpc"], rtol=RTOL)


def test_fsdp_matches_one_device(runs):
    fsdp = runs["four"].parent / "fsdp"
    assert_trees_close(_params(fsdp, 2), _params(runs["one"], 2), atol=ATOL, rtol=0)


def test_four_device_checkpoint_resumes_on_one(runs):
    log = runs["reports"]["1"]["resume_log"]
    assert sum("resuming" in line and f"from step {STEPS}" in line for line in log) == 2
    p1 = _params(runs["both"] / "run1", STEPS + 2)
    p4 = _params(runs["both"] / "run4", STEPS + 2)
    assert_trees_close(p4, p1, atol=2 * ATOL, rtol=0)


def test_batch_not_divisible(runs):
    r4 = runs["reports"]["4"]
    assert len(r4["errors"]) == 2
    train, evaluation = r4["errors"]
    assert "train.batch_size=6 does not divide by the 4 devices" in train
    assert "eval.batch_size=6 does not divide by the 4 devices" in evaluation
    assert all("\n" not in e for e in r4["errors"])
    assert not r4["bad_workdir_written"]


def test_helpers_on_one_process():
    import jax

    from rhhjax import parallel

    mesh = parallel.make_mesh(jax.devices()[:1])
    assert parallel.host_rows(8, mesh) == slice(0, 8)
    assert parallel.state_spec((16, 27), 4, fsdp=True) == jax.sharding.PartitionSpec("data")
    assert parallel.state_spec((27, 16), 4, fsdp=True) == jax.sharding.PartitionSpec(None, "data")
    assert parallel.state_spec((27,), 4, fsdp=True) == jax.sharding.PartitionSpec()
    assert parallel.state_spec((16, 16), 4, fsdp=False) == jax.sharding.PartitionSpec()
    parallel.assert_same_across_processes("anything")  # one process: nothing to compare
    with pytest.raises(parallel.ParallelError, match="eval.batch_size=3 does not divide"):
        parallel.check_batch_divisible("eval.batch_size", 3, types.SimpleNamespace(size=2))


if __name__ == "__main__":
    _child(*sys.argv[1:])


@pytest.mark.skipif(
    not os.environ.get("RHHJAX_TEST_MULTIPROCESS"),
    reason="set RHHJAX_TEST_MULTIPROCESS=1: 2 jax processes x 2 CPU devices (~30 s more)",
)
def test_two_processes_match_one_device(runs, tmp_path):
    """jax.distributed on localhost: 2 processes of 2 devices each, from the env variables."""
    import socket

    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        port = sock.getsockname()[1]
    env = {"JAX_COORDINATOR_ADDRESS": f"localhost:{port}", "JAX_NUM_PROCESSES": "2"}
    text_file = runs["one"].parents[1] / "shake.txt"
    specs = [("multi", 2, tmp_path, {**env, "JAX_PROCESS_ID": str(i)}) for i in (0, 1)]
    _run_children(specs, text_file)
    reports = [json.loads((tmp_path / f"p{i}" / "report_multi.json").read_text()) for i in (0, 1)]
    for i, r in enumerate(reports):
        assert r["process"] == i and r["devices"] == 4
        assert "the config differs between processes" in r["mismatch"]
    assert reports[0]["lines"] > 0 and reports[1]["lines"] == 0  # only process 0 logs
    assert not (tmp_path / "mismatch").exists()
    t1, t2 = _records(runs["one"], "train"), _records(tmp_path / "run", "train")
    assert len(t1) == len(t2) == STEPS  # metrics.jsonl written once (process 0)
    for a, b in zip(t1, t2, strict=True):
        np.testing.assert_allclose(b["loss"], a["loss"], rtol=RTOL)
    assert_trees_close(
        _params(tmp_path / "run", STEPS), _params(runs["one"], STEPS), atol=ATOL, rtol=0
    )
    f1 = runs["reports"]["1"]["results"]["final"]
    for r in reports:  # every process computes the same (replicated) metrics
        for split, by_protocol in f1.items():
            for protocol, m in by_protocol.items():
                np.testing.assert_allclose(
                    r["results"]["final"][split][protocol]["bpc"], m["bpc"], rtol=RTOL
                )
