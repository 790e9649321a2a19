"""Evaluation: cross-entropy (``nats``), ``bpc``, ``ppl``, ``acc`` and ``chars`` of a model on
a split under the protocols of ``rhhjax.data.eval_batches`` (docs/design.md)."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rhhjax import data as data_lib
from rhhjax import models, parallel

PROTOCOLS = data_lib.EVAL_PROTOCOLS
PAPER_TEST_MASK = 95
PAPER_VALID_MASK = 50
MASK95_LABEL = "paper_test_mask95"


@functools.lru_cache(maxsize=32)
def make_eval_step(
    model_config: models.ModelConfig, mesh: jax.sharding.Mesh | None = None
) -> Callable:
    """Jitted ``(params, carry, inputs, targets, mask, reset) -> (carry, [nll, hits, count])``,
    sums over masked positions; with ``mesh`` the carry is split over ``"data"``."""
    model = models.build_model(model_config)

    def step(params, carry, inputs, targets, mask, reset):
        carry = jax.tree.map(lambda c: jnp.where(reset, jnp.zeros_like(c), c), carry)
        logits, carry = model.apply({"params": params}, inputs, carry, train=False)
        logits = logits.astype(jnp.float32)
        logp = jax.nn.log_softmax(logits, axis=-1)
        nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
        hits = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
        sums = jnp.stack([jnp.sum(nll * mask), jnp.sum(hits * mask), jnp.sum(mask)])
        if mesh is not None:
            carry = parallel.constrain_batch(carry, mesh)
            sums = parallel.constrain_replicated(sums, mesh)
        return carry, sums

    return jax.jit(step)


def zero_carry(model_config: models.ModelConfig, params, batch: int):
    model = models.build_model(model_config)
    return model.apply({"params": params}, batch, method=models.CharLM.initial_carry)


def metrics_from_sums(nll: float, hits: float, count: float) -> dict:
    nll, hits, count = float(nll), float(hits), float(count)
    chars = int(round(count))
    if chars <= 0:
        raise data_lib.DataError("nothing to score: the evaluation scored 0 characters")
    nats = nll / count
    return {
        "nats": nats,
        "bpc": nats / math.log(2.0),
        "ppl": math.exp(nats) if nats < 700 else float("inf"),
        "acc": hits / count,
        "chars": chars,
    }


def evaluate_tokens(
    model_config: models.ModelConfig,
    params,
    tokens: np.ndarray,
    protocol: str,
    *,
    batch_size: int,
    seq_len: int,
    min_context: int = 50,
    paper_mask: int = PAPER_VALID_MASK,
    should_stop: Callable[[], bool] | None = None,
    mesh: jax.sharding.Mesh | None = None,
    max_chunk: int = data_lib.MAX_CHUNK,
) -> dict:
    """Metrics of the model on ``tokens`` under ``protocol``; ``should_stop`` is polled
    between batches (raises ``KeyboardInterrupt``)."""
    step = make_eval_step(model_config, mesh)
    carry = zero_carry(model_config, params, batch_size)
    if mesh is not None:
        parallel.check_batch_divisible("eval.batch_size", batch_size, mesh)
        if not parallel.on_mesh(params, mesh):
            params = parallel.put_state(params, mesh)
        carry = parallel.shard_batch(carry, mesh)
    sums = []
    batches = data_lib.eval_batches(
        tokens,
        protocol,
        batch_size,
        seq_len,
        min_context=min_context,
        paper_mask=paper_mask,
        max_chunk=max_chunk,
    )
    for batch in batches:
        if should_stop is not None and should_stop():
            raise KeyboardInterrupt("evaluation interrupted")
        if mesh is None:
            carry, s = step(params, carry, batch.inputs, batch.targets, batch.mask, batch.reset)
        else:
            arrays = parallel.shard_batch((batch.inputs, batch.targets, batch.mask), mesh)
            (reset,) = parallel.put_scalars((np.bool_(batch.reset),), mesh)
            carry, s = step(params, carry, *arrays, reset)
        sums.append(s)
        if len(sums) > 1:  # at most two batches in flight: memory does not grow with the split
            jax.block_until_ready(sums[-2])
    if not sums:
        raise data_lib.DataError(f"no evaluation batches for {len(tokens)} tokens ({protocol})")
    total = np.sum(np.asarray(jax.device_get(sums), dtype=np.float64), axis=0)
    return metrics_from_sums(*total)


def evaluate_splits(
    model_config: models.ModelConfig,
    params,
    corpus: data_lib.Corpus,
    eval_config,
    splits: Sequence[str] = ("valid", "test"),
    protocols: Iterable[str] = PROTOCOLS,
    log: Callable[[str], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    mesh: jax.sharding.Mesh | None = None,
) -> dict:
    """{split: {protocol: metrics}}; on test also ``paper_test_mask95``."""
    results: dict = {}
    for split in splits:
        tokens = corpus.split(split)
        results[split] = {}
        runs = []
        for protocol in protocols:
            runs.append((protocol, protocol, PAPER_VALID_MASK))
            if protocol == "paper" and split == "test":
                runs.append((MASK95_LABEL, "paper", PAPER_TEST_MASK))
        for label, protocol, mask in runs:
            start = time.time()
            metrics = evaluate_tokens(
                model_config,
                params,
                tokens,
                protocol,
                batch_size=int(eval_config.batch_size),
                seq_len=int(eval_config.seq_len),
                min_context=int(eval_config.min_context),
                paper_mask=mask,
                should_stop=should_stop,
                mesh=mesh,
            )
            results[split][label] = metrics
            if log is not None:
                log(
                    f"  {split:<5} {label:<18} bpc {metrics['bpc']:.4f}  "
                    f"({metrics['chars']:,} chars, {time.time() - start:.1f}s)"
                )
    return results


def format_table(results: dict) -> str:
    header = f"{'split':<6} {'protocol':<18} {'BPC':>8} {'ppl':>8} {'acc':>8} {'chars':>12}"
    lines = [header, "-" * len(header)]
    for split, by_protocol in results.items():
        for label, m in by_protocol.items():
            lines.append(
                f"{split:<6} {label:<18} {m['bpc']:>8.4f} {m['ppl']:>8.4f} "
                f"{100 * m['acc']:>7.2f}% {m['chars']:>12,}"
            )
    return "\n".join(lines)


def parse_protocols(text: str) -> list[str]:
    if text.strip() == "all":
        return list(PROTOCOLS)
    items = [p.strip() for p in text.split(",") if p.strip()]
    for p in items:
        if p not in PROTOCOLS:
            raise data_lib.DataError(f"unknown protocol {p!r}: expected {', '.join(PROTOCOLS)}")
    return items
