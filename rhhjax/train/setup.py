"""A run before anything is written: ``prepare_run(config, workdir, ...) -> Run`` validates
the config, joins the devices, loads the data, checks the workdir and the memory the run needs;
problems are one-line ``UserError`` s."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_collections
import numpy as np

from rhhjax import data as data_lib
from rhhjax import evaluation as eval_lib
from rhhjax import memory, models, parallel
from rhhjax.errors import warn
from rhhjax.train import config as train_config
from rhhjax.train import workdir as workdir_lib
from rhhjax.train.config import TrainError
from rhhjax.train.signals import SignalCatcher


@dataclasses.dataclass
class Run:
    """What every part of a run reads, set up once by ``prepare_run``."""

    cfg: ml_collections.ConfigDict
    workdir: Path
    model: models.ModelConfig
    corpus: data_lib.Corpus
    sampler: Any
    mesh: Any
    log: Callable[[str], None]
    signals: SignalCatcher
    tensorboard: Any = None
    finished: dict | None = None

    @property
    def primary(self) -> bool:
        return parallel.is_primary()

    @property
    def steps_per_epoch(self) -> int:
        return self.sampler.batches_per_epoch

    @property
    def valid_tokens(self) -> np.ndarray:
        """The periodic validation's text: valid, or its first ``eval.max_valid_chars``."""
        return self.corpus.valid[: self.cfg.eval.max_valid_chars or None]


def _silent(message: str) -> None:
    del message


def prepare_run(
    config: Any, workdir: Path, log: Callable[[str], None], signals: SignalCatcher
) -> Run:
    """Everything checked before the workdir is written; raises a UserError (one line)."""
    cfg = train_config.prepare_config(config)
    parallel.maybe_initialize_distributed(bool(cfg.train.distributed))
    if not parallel.is_primary():
        log = signals.log = _silent
    # every process: the same config; the batch sizes divide over the devices
    parallel.assert_same_across_processes(train_config.config_to_json(cfg), "config")
    mesh = parallel.make_mesh()
    parallel.check_batch_divisible("train.batch_size", cfg.train.batch_size, mesh)
    parallel.check_batch_divisible("eval.batch_size", cfg.eval.batch_size, mesh)
    tensorboard = workdir_lib.tensorboard_writer_class() if cfg.train.tensorboard else None
    corpus = data_lib.load_corpus(cfg.data)
    shapes = [corpus.vocab.to_dict(), len(corpus.train), len(corpus.valid)]
    parallel.assert_same_across_processes(json.dumps(shapes), "data")
    model = models.ModelConfig.from_config(cfg.model, vocab_size=corpus.vocab.size)
    # Refuses an impl that cannot run here (mosaic off a GPU, kernels only lowered).
    models.sequence_spec(model, execute=True)
    cfg.model.vocab_size = corpus.vocab.size
    sampler = _make_sampler(cfg, corpus.train)
    train_config.check_schedule_horizon(cfg.train, sampler.batches_per_epoch)
    workdir_lib.check_budget_refusal(workdir, cfg.train, device_kind())
    _check_eval_data(cfg, corpus, corpus.valid[: cfg.eval.max_valid_chars or None])
    if workdir.exists() and not workdir.is_dir():
        raise TrainError(f"workdir {workdir} exists and is not a directory")
    meta = workdir_lib.check_compatible(workdir, cfg, model, corpus.vocab, sampler.state())
    if meta is not None and parallel.is_primary():
        warning = workdir_lib.config_json_warning(workdir, meta)
        if warning:
            warn(warning)
    changes = workdir_lib.resume_changes(workdir, cfg, meta)
    finished = workdir_lib.finished_results(workdir, cfg, meta, sampler.batches_per_epoch)
    if finished is None:
        for line in changes:
            log(line)
        workdir_lib.check_workdir_writable(workdir)
        if cfg.train.check_memory:
            check_memory(cfg, model, mesh, log)
    parallel.sync("rhhjax-validated")
    return Run(cfg, workdir, model, corpus, sampler, mesh, log, signals, tensorboard, finished)


def memory_needs(cfg: ml_collections.ConfigDict, model: models.ModelConfig, n_devices: int):
    import jax

    shapes = jax.eval_shape(
        lambda: models.init_params(models.build_model(model), jax.random.key(0))
    )
    n_params = models.count_params(shapes)
    impl = models.sequence_spec(model).impl
    t, e = cfg.train, cfg.eval
    protocols = [e.valid_protocol, *eval_lib.parse_protocols(e.final_protocols)]
    return [
        memory.training(model, n_params, t.batch_size, t.seq_len, t.optimizer, impl, n_devices),
        *memory.evaluations(model, n_params, e.batch_size, e.seq_len, protocols, impl, n_devices),
    ]


def check_memory(
    cfg: ml_collections.ConfigDict,
    model: models.ModelConfig,
    mesh,
    log: Callable[[str], None] = _silent,
) -> None:
    needs = memory_needs(cfg, model, mesh.size)
    free = memory.free_memory()
    memory.check(needs, free, "train.check_memory=False runs it anyway")
    log(memory.estimate_line(needs, free))


def _make_sampler(cfg: ml_collections.ConfigDict, tokens: np.ndarray):
    t = cfg.train
    if cfg.data.sampler == "stream":
        return data_lib.StreamSampler(tokens, t.batch_size, t.seq_len, seed=cfg.seed)
    return data_lib.WindowSampler(tokens, t.batch_size, t.seq_len, seed=cfg.seed)


def _check_eval_data(cfg, corpus: data_lib.Corpus, valid_tokens: np.ndarray) -> None:
    e = cfg.eval
    checks = [(valid_tokens, e.valid_protocol, "valid")]
    for protocol in eval_lib.parse_protocols(e.final_protocols):
        checks += [(corpus.valid, protocol, "valid"), (corpus.test, protocol, "test")]
    for tokens, protocol, split in checks:
        try:
            data_lib.scored_count(
                len(tokens), protocol, seq_len=e.seq_len, min_context=e.min_context
            )
        except data_lib.DataError as err:
            raise TrainError(f"{split} split, {protocol} protocol: {err}") from None
        need = data_lib.PAPER_SEQ_LEN + 1 if protocol == "paper" else 2
        if len(tokens) < need:
            raise TrainError(
                f"the {split} split ({len(tokens)} symbols) is too short for the {protocol} "
                f"protocol (needs {need})"
            )


def device_kind() -> str:
    """The kind of the first device, as a budget's measurement names it."""
    import jax

    return jax.devices()[0].device_kind
