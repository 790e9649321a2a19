"""The RHN paper's recipe for the Hutter-prize corpora (Zilly et al. 2017), shared by
``configs/enwik8.py`` and ``configs/text8.py``: the two differ only in the corpus and its
vocabulary. Every field not set here keeps the library's default
(``rhhjax.train.config.default_config``, the paper's PTB recipe).

Data: the first 10^8 symbols of English Wikipedia, read from ``data.text_files``, else from the
cache ($RHHJAX_CACHE/<corpus>/<corpus>, default ~/.cache/rhhjax), else downloaded from
mattmahoney.net/dc/<corpus>.zip, its SHA256 checked against the hash embedded in
``rhhjax/data/text.py`` (override with ``--config.data.sha256=...`` only for a mirror you
trust), and unzipped there. Offline: put the unzipped file there yourself, or pass
``--config.data.text_files=/path/to/<corpus>``. Split (Hutter): the first 90M symbols train,
the next 5M valid, the last 5M test.

Model: a plain RHN of depth 10 and width 1500, embedding width = vocabulary size, no weight
tying, transform-gate bias -4, Zilly's variational dropout. Zilly's code has four dropout rates,
x / input / hidden / output = 0.10 / 0.40 / 0.10 / 0.40; ``ModelConfig`` has no separate x
(whole-character embedding) dropout, so ``keep_input = 0.6``, ``keep_hidden = 0.9``,
``keep_output = 0.6`` implement the last three and the 0.10 x-dropout is NOT reproduced. Zilly
initialises weights U(-0.04, 0.04); the closest option here is ``init = "uniform"`` (PyTorch's
U(+-1/sqrt(fan_in)), +-0.026 for 1500 inputs).

Training: plain SGD, learning rate 0.2, divided by 1.03 per epoch from the sixth epoch on
(``lr_decay_start_epoch = 5``, 0-based epochs, as Zilly's ``max_epoch = 5``), gradient clipping
at global L2 norm 10, L2 weight decay 1e-7 (added to the gradient before clipping), truncated
BPTT: batch 128 x 50 steps with the state carried across batches (``sampler = "stream"``), at
most 500 epochs, no early stopping. Zilly et al. trained for days on a GPU.
"""

import ml_collections

from rhhjax import configs
from rhhjax.train.config import default_config

# corpus: (text_vocab, vocabulary size, map unseen valid/test symbols to <unk>)
CORPORA = {
    "enwik8": ("byte", 205, True),  # one symbol per byte; vocab = train bytes + 1 reserved
    "text8": ("char", 27, False),  # a-z and space: all 27 occur in train
}


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
