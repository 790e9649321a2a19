r"""Generate text from a trained model.

    python -m rhhjax.sample --workdir=workdirs/ptb --prompt="the " --length=300 \
        --temperature=0.8 [--seed=0] [--checkpoint=best|latest]

Only the checkpoint is read (its vocabulary travels with it): no data folder is needed.

The prompt is run through the model in one call (the state carried to its end), then
``length`` characters are drawn one at a time, each fed back with the carried state; the whole
generation is one jitted ``lax.scan`` over the single-step model. ``temperature=0`` picks the
most likely character (greedy). The reserved unknown symbol (``data.unk=True``) is never drawn.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from rhhjax import data as data_lib
from rhhjax import models


@functools.lru_cache(maxsize=16)
def make_generate(
    model_config: models.ModelConfig, length: int, greedy: bool, unk_id: int | None
) -> Callable:
    """Jitted ``(params, prompt [1, P] int32, key, temperature) -> tokens [length] int32``."""
    model = models.build_model(model_config)

    def pick(logits, key, temperature):
        logits = logits.astype(jnp.float32)
        if unk_id is not None:
            logits = logits.at[..., unk_id].set(-jnp.inf)
        if greedy:
            return jnp.argmax(logits, axis=-1).astype(jnp.int32)
        return jax.random.categorical(key, logits / temperature, axis=-1).astype(jnp.int32)

    def generate(params, prompt, key, temperature):
        logits, carry = model.apply({"params": params}, prompt, None, train=False)

        def body(state, step_key):
            carry, last_logits = state
            token = pick(last_logits, step_key, temperature)  # [1]
            logits, carry = model.apply({"params": params}, token[:, None], carry, train=False)
            return (carry, logits[:, -1]), token[0]

        keys = jax.random.split(key, length)
        _, tokens = jax.lax.scan(body, (carry, logits[:, -1]), keys)
        return tokens

    return jax.jit(generate)


def generate(
    model_config: models.ModelConfig,
    params,
    vocab: data_lib.Vocab,
    prompt: str,
    length: int,
    temperature: float = 1.0,
    seed: int = 0,
) -> str | bytes:
    """``length`` characters (``str``; ``bytes`` for a byte vocabulary) continuing ``prompt``."""
    if length < 1:
        raise data_lib.DataError(f"length must be >= 1, got {length}")
    if not temperature >= 0:
        raise data_lib.DataError(f"temperature must be >= 0, got {temperature}")
    if not prompt:
        raise data_lib.DataError("the prompt must not be empty")
    text = prompt if vocab.kind == "char" else prompt.encode("utf-8")
    try:
        ids = vocab.encode(text, split="prompt").astype(np.int32)[None, :]
    except data_lib.DataError:
        known = set(vocab.symbols)
        bad = next(c for c in text if c not in known)
        raise data_lib.DataError(
            f"the prompt's {bad!r} is not in the model's vocabulary ({len(vocab.symbols)} symbols)"
        ) from None
    fn = make_generate(model_config, int(length), temperature == 0, vocab.unk_id)
    key = jax.random.key(seed)
    tokens = fn(params, ids, key, jnp.float32(max(temperature, 1e-6)))
    return vocab.decode(np.asarray(tokens))


def run(
    workdir: str,
    prompt: str,
    length: int,
    temperature: float,
    seed: int = 0,
    which: str = "best",
) -> str:
    """Prompt + generated text from a checkpoint of ``workdir`` (bytes decoded as UTF-8)."""
    from rhhjax import checkpoint as ckpt_lib

    params, meta, _ = ckpt_lib.load_for_inference(workdir, which)
    vocab = data_lib.Vocab.from_dict(meta["vocab"])
    model_config = models.ModelConfig.from_config(meta["model"])
    out = generate(model_config, params, vocab, prompt, length, temperature, seed)
    if isinstance(out, bytes):
        out = out.decode("utf-8", errors="replace")
    return prompt + out


def main(argv: list[str]) -> int:
    from absl import app, flags, logging

    from rhhjax import checkpoint as ckpt_lib

    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    f = flags.FLAGS
    if not f["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    try:
        text = run(f.workdir, f.prompt, f.length, f.temperature, f.seed, f.checkpoint)
    except (data_lib.DataError, models.ConfigError, ckpt_lib.CheckpointError) as e:
        sys.exit(f"error: {' '.join(str(e).split())}")
    print(text)
    return 0


def _define_flags() -> None:
    from absl import flags

    flags.DEFINE_string("workdir", None, "Training workdir holding checkpoints.", required=True)
    flags.DEFINE_string("prompt", "the ", "Text to start from (every character in the vocab).")
    flags.DEFINE_integer("length", 300, "Characters to generate.")
    flags.DEFINE_float("temperature", 0.8, "Softmax temperature; 0 = greedy.")
    flags.DEFINE_integer("seed", 0, "Sampling seed.")
    flags.DEFINE_enum("checkpoint", "best", ["best", "latest"], "Which checkpoint.")


if __name__ == "__main__":
    from absl import app

    from rhhjax import cli

    _define_flags()
    app.run(main, flags_parser=lambda argv: cli.parse_flags(argv, __doc__, flag=None))
