"""What `model.original_first_step` changes: at init (paper HyperRHN) and on a trained model.

    python benchmarks/first_step_effect.py WORKDIR PTB_FOLDER

Prints the largest |logit difference| per time step between the option off and on for the
paper HyperRHN at init (8 random sequences of 20 characters), then the valid BPC of
WORKDIR's best checkpoint with the option off and on, under the windows and stream
protocols (batch 256, length 100).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from rhhjax import configs, data, evaluation, models
from rhhjax.train import checkpoint


def with_option(config: models.ModelConfig, on: bool) -> models.ModelConfig:
    return models.ModelConfig(**{**config.__dict__, "original_first_step": on})


def init_logit_differences(length: int = 20) -> np.ndarray:
    """[length] max |logits(off) - logits(on)| of the paper HyperRHN at init, per step."""
    config = models.ModelConfig.from_config(configs.load("ptb").model, vocab_size=50)
    model = models.build_model(config)
    params = models.init_params(model, jax.random.key(0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 50, (8, length)))
    off, _ = model.apply({"params": params}, tokens)
    on, _ = models.build_model(with_option(config, True)).apply({"params": params}, tokens)
    return np.abs(np.asarray(off) - np.asarray(on)).max(axis=(0, 2))


def trained_valid_bpc(workdir: Path, ptb_dir: str) -> dict[tuple[bool, str], float]:
    """{(option, protocol): valid BPC} of the workdir's best checkpoint."""
    saved = json.loads((workdir / "config.json").read_text())
    params, _, _ = checkpoint.load_for_inference(workdir, "best")
    corpus = data.load_corpus({**saved["data"], "dir": ptb_dir})
    base = models.ModelConfig.from_config(saved["model"])
    return {
        (on, protocol): evaluation.evaluate_tokens(
            with_option(base, on), params, corpus.valid, protocol, batch_size=256, seq_len=100
        )["bpc"]
        for on in (False, True)
        for protocol in ("windows", "stream")
    }


def main(argv: list[str]) -> None:
    if len(argv) != 3:
        raise SystemExit("usage: python benchmarks/first_step_effect.py WORKDIR PTB_FOLDER")
    diff = init_logit_differences()
    print("init paper HyperRHN max |logit diff| per step:", " ".join(f"{d:.1e}" for d in diff))
    for (on, protocol), bpc in trained_valid_bpc(Path(argv[1]), argv[2]).items():
        print(f"trained, original_first_step={on}, valid {protocol}: {bpc:.6f}")


if __name__ == "__main__":
    main(sys.argv)
