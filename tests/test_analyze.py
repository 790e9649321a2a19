"""The analysis CLI: gradient curve, gates, lesioning, weight norms, files written.

Tiny models (hidden 16, depth 2) on synthetic tokens, except the command-line test, which reads
real PTB from $RHHJAX_PTB_DIR (default ../shared/data/ptb beside the repo) and is skipped when
it is absent.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from rhhjax import analysis as analyze
from rhhjax import data as data_lib
from rhhjax import models
from rhhjax.train import checkpoint as ckpt_lib
from rhhjax.train import loop as trainer

ROOT = Path(__file__).resolve().parents[1]
PTB_DIR = Path(
    os.environ.get("RHHJAX_PTB_DIR", Path(__file__).resolve().parents[2] / "shared/data/ptb")
)
VOCAB = 13
TYPES = ("rhn", "hyperrhn", "lstm")


def tiny_config(model_type: str, **kw) -> models.ModelConfig:
    # dropout stays at the configs' default (gate, keep 0.65): the analysis must not use it
    fields = dict(
        type=model_type, vocab_size=VOCAB, embed_dim=5, hidden=16, hyper_hidden=8, depth=2
    )
    fields.update(kw)
    return models.ModelConfig(**fields)


@pytest.fixture(scope="module")
def tokens() -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.integers(0, VOCAB, size=3000).astype(np.uint8)


def subject(model_type: str, tokens: np.ndarray, **kw) -> analyze.Subject:
    mc = tiny_config(model_type, **kw)
    params = analyze.init_params(mc, seed=1)
    return analyze.Subject(label=model_type, config=mc, params=params, tokens=tokens)


def explicit_input_gradient_norms(mc, params, inputs, targets) -> np.ndarray:
    """||d loss_{T-1} / d x_t|| for every row and t: one jax.grad per (row, t), each w.r.t.
    the embedded input of step t alone, through the model's own core and head."""
    model = models.build_model(mc)
    embedding = params["embed"]["embedding"]

    def forward(module, x):
        outputs, _ = module.core(x, module.initial_carry(x.shape[0]), None)
        return module.head(outputs)

    def grad_at(x_row, target, t):
        def loss_of_xt(xt):
            x = jax.lax.dynamic_update_slice(x_row, xt[None, None, :], (0, t, 0))
            logits = model.apply({"params": params}, x, method=forward)
            return -jax.nn.log_softmax(logits[0, -1])[target]

        return jax.grad(loss_of_xt)(x_row[0, t])

    # one separate gradient per (row, t); vmapped so that it compiles once
    steps = jnp.arange(inputs.shape[1])
    per_row = jax.vmap(grad_at, in_axes=(None, None, 0))
    x_rows = jnp.take(embedding, jnp.asarray(inputs), axis=0)[:, None]  # [B, 1, T, E]
    grads = jax.jit(jax.vmap(per_row, in_axes=(0, 0, None)))(
        x_rows, jnp.asarray(targets[:, -1]), steps
    )  # [B, T, E]
    return np.linalg.norm(np.asarray(grads, np.float64), axis=-1)


@pytest.mark.parametrize("model_type", TYPES)
def test_gradient_curve_equals_explicit_per_step_grad(model_type, tokens):
    s = subject(model_type, tokens)
    seq_len, rows = 12, 4
    inputs, targets, _ = analyze.heldout_windows(tokens, rows, seq_len)
    expected = explicit_input_gradient_norms(s.config, s.params, inputs, targets)
    assert np.all(expected > 0)
    # batch_size 2 < rows: the curve is assembled from two chunks
    curve = analyze.input_gradients(s, rows, seq_len, batch_size=2)
    assert curve["t"] == list(range(seq_len)) and curve["sequences"] == rows
    np.testing.assert_allclose(curve["mean_norm"], expected.mean(axis=0), rtol=2e-4)
    norms, _ = analyze.make_input_gradient_norms(s.config)(s.params, inputs[2:], targets[2:])
    np.testing.assert_allclose(np.asarray(norms), expected[2:], rtol=2e-4)


@pytest.mark.parametrize("model_type", ["rhn", "hyperrhn"])
def test_gate_recomputation_matches_the_model(model_type, tokens):
    s = subject(model_type, tokens)
    inputs, _, _ = analyze.heldout_windows(tokens, 3, 10)
    trace = analyze.make_gate_trace(s.config)(s.params, inputs)
    model = models.build_model(s.config)

    def core_outputs(module, tokens):
        out, _ = module.core(module.embed(tokens), module.initial_carry(tokens.shape[0]), None)
        return out

    reference = model.apply({"params": s.params}, inputs, method=core_outputs)
    np.testing.assert_allclose(trace["outputs"], reference, rtol=1e-5, atol=1e-6)
    assert trace["main"].shape == (3, 2, 10, 16)
    assert float(trace["main"].min()) > 0 and float(trace["main"].max()) < 1
    gates = analyze.gate_activity(s, inputs, sequences=2)
    assert len(gates["main"]["sequences"]) == 2
    assert np.asarray(gates["main"]["sequences"][0]["activity"]).shape == (2, 10)
    assert ("hyper" in gates) == (model_type == "hyperrhn")


@pytest.mark.parametrize("model_type", ["rhn", "hyperrhn"])
def test_lesioning_a_layer_changes_the_loss(model_type, tokens):
    s = subject(model_type, tokens)
    inputs, _, _ = analyze.heldout_windows(tokens, 2, 10)
    result = analyze.lesion(s, chars=600, seq_len=20, batch_size=8, gate_inputs=inputs)
    cells_expected = 2 if model_type == "hyperrhn" else 1
    assert len(result["layers"]) == 2 * cells_expected
    base = result["baseline"]["nats"]
    for record in result["layers"]:
        assert record["max_gate"] < 1e-6  # the lesioned layer only carries
        assert np.isfinite(record["nats"])
        assert record["delta_nats"] == pytest.approx(record["nats"] - base)
    assert any(abs(r["delta_nats"]) > 1e-4 for r in result["layers"] if r["cell"] == "main")
    # only the t-half of one layer's bias moves, and the original params are untouched
    lesioned = analyze.lesion_params(s.config, s.params, "main", 1)
    path = dict(analyze.gated_cells(s.config))["main"]
    before, after = s.params, lesioned
    for key in path:
        before, after = before[key], after[key]
    diff = np.asarray(after) - np.asarray(before)
    assert np.all(diff[1, 16:] == analyze.LESION_BIAS) and np.all(diff[1, :16] == 0)
    assert np.all(diff[0] == 0)


def test_lstm_has_no_gates(tokens):
    s = subject("lstm", tokens)
    with pytest.raises(analyze.AnalysisError):
        analyze.lesion_params(s.config, s.params, "main", 0)
    settings = analyze.Settings(seq_len=10, grad_sequences=2, lesion_chars=300, batch_size=4)
    result = analyze.analyse(s, settings, log=lambda m: None)
    assert "gates" not in result and "lesion" not in result
    assert result["input_gradients"] and result["weight_norms"]


def test_weight_norms_one_per_layer(tokens):
    s = subject("hyperrhn", tokens)
    norms = analyze.weight_norms(s.params)
    names = [w["name"] for w in norms]
    assert names[0] == "embed/embedding" and names[-1] == "head/kernel"
    assert not any("bias" in n for n in names)
    cell = s.params["core"]["cell"]
    main_w = [w for w in norms if w["name"] == "core/cell/main/kernel_s"]
    assert [w["layer"] for w in main_w] == [0, 1]
    for w in main_w:
        expected = np.linalg.norm(np.asarray(cell["main"]["kernel_s"][w["layer"]]))
        assert w["fro"] == pytest.approx(expected, rel=1e-6)
        assert w["shape"] == [16, 32]
    # forward order inside the cell: hyper, projections, main
    blocks = list(dict.fromkeys(w["block"] for w in norms))
    assert blocks == ["embed", "hyper", "proj", "main", "head"]
    lstm = analyze.weight_norms(subject("lstm", tokens).params)
    assert [w["label"] for w in lstm] == [
        "embed E", "layers_0 Wx", "layers_0 Wh", "layers_1 Wx", "layers_1 Wh", "head out"
    ]  # fmt: skip


def make_workdir(tmp_path: Path, model_type: str) -> tuple[Path, ml_collections.ConfigDict]:
    """A workdir with config.json and a best checkpoint (init params x 1.5), on a text file."""
    text = tmp_path / "text.txt"
    rng = np.random.default_rng(0)
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "ran"]
    text.write_text(" ".join(rng.choice(words, size=3000)))
    cfg = trainer.prepare_config(analyze.load_config_spec(f"{ROOT}/configs/ptb.py:tiny"))
    cfg.data.format = "text"
    cfg.data.text_files = str(text)
    cfg.data.hutter_holdout = 2000
    cfg.model.type = model_type
    corpus = data_lib.load_corpus(cfg.data.to_dict())
    cfg.model.vocab_size = corpus.vocab.size
    mc = models.ModelConfig.from_config(cfg.model)
    params = analyze.init_params(mc, int(cfg.seed))
    trained = jax.tree.map(lambda a: a * 1.5, params)
    workdir = tmp_path / model_type
    workdir.mkdir()
    (workdir / trainer.CONFIG_FILE).write_text(trainer.config_to_json(cfg))
    meta = {
        "version": ckpt_lib.META_VERSION,
        "vocab": corpus.vocab.to_dict(),
        "model": dataclasses.asdict(mc),  # as the trainer writes it
        "config": cfg.to_dict(),
        "step": 7,
        "epoch": 0.25,
    }
    with ckpt_lib.Checkpoints(workdir) as ckpts:
        ckpts.save_best(7, trained, meta)
    return workdir, cfg


def test_run_writes_figures_and_numbers(tmp_path):
    rhn_dir, _ = make_workdir(tmp_path, "rhn")
    out = tmp_path / "out"
    settings = analyze.Settings(
        seq_len=20, grad_sequences=4, gate_sequences=2, lesion_chars=400, batch_size=4
    )
    written = analyze.run(
        [str(rhn_dir), f"{rhn_dir}@init"],
        [],
        out,
        settings=settings,
        prefix="x_",
        log=lambda m: None,
    )
    names = sorted(p.name for p in written)
    assert names == sorted(
        [
            "x_weight_norms.png",
            "x_input_gradients.png",
            "x_gates_rhn_step_7_ep_0.25.png",
            "x_gates_rhn_init.png",
            "x_lesion.png",
            "x_analysis.json",
        ]
    )
    for p in written:
        assert p.stat().st_size > 1000, p
    result = json.loads((out / "x_analysis.json").read_text())
    models_out = result["models"]
    assert [m["source"]["checkpoint"] for m in models_out] == ["best", "init"]
    assert [m["source"]["step"] for m in models_out] == [7, 0]
    trained, init = models_out[0]["weight_norms"], models_out[1]["weight_norms"]
    for a, b in zip(trained, init, strict=True):  # the checkpoint holds init x 1.5
        assert a["fro"] == pytest.approx(1.5 * b["fro"], rel=1e-5)
    assert len(models_out[0]["input_gradients"]["t"]) == 20
    assert models_out[0]["lesion"]["layers"][0]["max_gate"] == 0.0


def test_step_and_errors(tmp_path):
    workdir, _ = make_workdir(tmp_path, "rhn")
    s = analyze.subject_from_workdir(f"{workdir}@7")
    assert s.source == {"workdir": str(workdir), "checkpoint": "step 7", "step": 7, "epoch": 0.25}
    with pytest.raises(analyze.AnalysisError, match="no checkpoint of step 8"):
        analyze.subject_from_workdir(f"{workdir}@8")
    with pytest.raises(analyze.AnalysisError, match="does not exist"):
        analyze.subject_from_workdir(str(tmp_path / "missing"))
    with pytest.raises(analyze.AnalysisError, match="checkpoint must be"):
        analyze.parse_which("newest")
    assert analyze.split_workdir_spec("runs/a@b", "best") == ("runs/a@b", "best")


@pytest.mark.skipif(
    not (PTB_DIR / "ptb.valid.txt").is_file(),
    reason=f"real PTB not found in {PTB_DIR} (set RHHJAX_PTB_DIR to the folder of ptb.*.txt)",
)
def test_command_line_at_init_on_real_ptb(tmp_path):
    out = tmp_path / "figs"
    cmd = [
        sys.executable,
        "-m",
        "rhhjax.tools.analyze",
        "--init=configs/ptb.py:tiny,model.type=rhn",
        "--init=configs/ptb.py:tiny,model.type=lstm,model.hidden=12",
        f"--data_dir={PTB_DIR}",
        f"--out={out}",
        "--seq_len=20",
        "--grad_sequences=4",
        "--gate_sequences=2",
        "--lesion_chars=500",
        "--labels=rhn,lstm",
        "--float64",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    files = {p.name: p.stat().st_size for p in out.iterdir()}
    for name in ("weight_norms.png", "input_gradients.png", "gates_rhn.png", "lesion.png"):
        assert files.get(name, 0) > 1000, files
    result = json.loads((out / "analysis.json").read_text())
    assert [m["model"]["vocab_size"] for m in result["models"]] == [50, 50]
    assert result["models"][1]["model"]["hidden"] == 12
    assert "lesion" not in result["models"][1] and "gates" not in result["models"][1]
    assert result["float64"] and result["models"][0]["model"]["dtype"] == "float64"
    # float64 computes from the float32 init a training run starts from (x64 is enabled only
    # after initialising: under x64 the orthogonal init draws different matrices)
    reference = analyze.subject_from_config(
        f"{ROOT}/configs/ptb.py:tiny,model.type=rhn", data_dir=str(PTB_DIR)
    )
    expected = [w["fro"] for w in analyze.weight_norms(reference.params)]
    got = [w["fro"] for w in result["models"][0]["weight_norms"]]
    np.testing.assert_allclose(got, expected, rtol=1e-6)
