"""The RHN paper's recipe for the Hutter-prize corpora (Zilly et al. 2017), shared by
``configs/enwik8.py`` and ``configs/text8.py``: a plain RHN, depth 10, width 1500, SGD, on the
first 10^8 symbols split 90M / 5M / 5M. Deviations: docs/design.md (``configs/hutter.py``).
"""

from collections.abc import Callable

import ml_collections

from rhhjax import configs
from rhhjax.train.config import default_config

# corpus: (text_vocab, vocabulary size with the reserved id, map unseen symbols to <unk>)
CORPORA = {"enwik8": ("byte", 205, True), "text8": ("char", 27, False)}


def recipe(corpus: str) -> ml_collections.ConfigDict:
    """Zilly et al.'s recipe on ``corpus`` (enwik8 | text8): the defaults plus these."""
    text_vocab, vocab_size, unk = CORPORA[corpus]
    config = default_config()
    overrides = {
        "data.format": "text",  # A single text file split the Hutter way.
        "data.corpus": corpus,  # Download + verify + unzip when text_files is "".
        "data.unk": unk,  # enwik8: unseen valid/test bytes map to a reserved id.
        "data.text_vocab": text_vocab,  # enwik8: bytes; text8: characters.
        "data.hutter_holdout": 5_000_000,  # 5M valid, 5M test, 90M train (Zilly; Hutter).
        "data.sampler": "stream",  # Contiguous TBPTT streams, state carried (Zilly).
        "model.type": "rhn",  # Plain Recurrent Highway Network.
        "model.vocab_size": vocab_size,  # Overwritten from the data at training time.
        "model.embed_dim": vocab_size,  # Embedding width = vocabulary size (Zilly).
        "model.hidden": 1500,  # Cell width.
        "model.depth": 10,  # Recurrence depth L.
        "model.dropout": "variational",  # One mask per sequence on input, state, output.
        "model.keep": 1.0,  # Unused with variational dropout.
        "model.keep_input": 0.6,  # Zilly drop_i = 0.40.
        "model.keep_hidden": 0.9,  # Zilly drop_h = 0.10.
        "model.keep_output": 0.6,  # Zilly drop_o = 0.40.
        "model.t_bias_init": -4.0,  # Start in carry mode (Zilly: -4).
        "model.init": "uniform",  # Closest to Zilly's U(-0.04, 0.04).
        "train.optimizer": "sgd",  # Plain SGD.
        "train.batch_size": 128,  # Parallel streams per step.
        "train.seq_len": 50,  # Truncated-BPTT length.
        "train.learning_rate": 0.2,  # SGD step size before decay.
        "train.lr_decay": 1.03,  # Divide the learning rate by this once per epoch ...
        "train.lr_decay_start_epoch": 5,  # ... from 0-based epoch 5 on (the sixth epoch).
        "train.weight_decay": 1e-7,  # L2, added to the gradient before clipping.
        "train.clip_type": "l2",  # Global L2 norm 10 (Zilly).
        "train.max_epochs": 500,  # Zilly's max_max_epoch.
        "train.patience": 0,  # No early stopping (the best validation is kept).
        "train.log_every_steps": 100,  # Progress line every N steps.
        "train.checkpoint_every_steps": 1000,  # ~1/14 of an epoch.
        "eval.batch_size": 128,  # Rows per evaluation batch.
        "eval.valid_protocol": "stream",  # Zilly's batched validation: state carried.
    }
    for field, value in overrides.items():
        configs.override(config, field, value)
    return config


def config_file(corpus: str) -> tuple[tuple[str, ...], Callable[..., ml_collections.ConfigDict]]:
    """(VARIANTS, get_config) of the config file of ``corpus``: one variant, the recipe."""
    variants = ("",)

    def get_config(variant: str = "") -> ml_collections.ConfigDict:
        configs.check_variant(corpus, variant, variants)
        return recipe(corpus)

    return variants, get_config
