"""text8 character-level language modelling (the RHN paper's recipe, Zilly et al. 2017).

Command (the RHN paper's text8 recipe, Zilly et al. 2017, reported test BPC 1.27):

    python train.py --config=configs/text8.py --workdir=workdirs/text8

Data: the first 10^8 characters of cleaned English Wikipedia (a-z and space). If
``data.text_files`` is empty the file is taken from the cache ($RHHJAX_CACHE/text8/text8,
default ~/.cache/rhhjax) or, when missing, http://mattmahoney.net/dc/text8.zip is downloaded,
its SHA256 checked against the hash embedded in ``rhhjax/downloads.py`` (override with
``--config.data.sha256=...`` only for a mirror you trust), and unzipped there. Offline: put the
unzipped file there yourself, or pass ``--config.data.text_files=/path/to/text8``. Split
(Hutter): the first 90M symbols train, the next 5M valid, the last 5M test.

Model: a plain RHN of depth 10 and width 1500, embedding width = vocabulary size (27), no
weight tying, transform-gate bias -4, Zilly's variational dropout. Zilly's code has four
dropout rates, x / input / hidden / output = 0.10 / 0.40 / 0.10 / 0.40; ``ModelConfig`` has no
separate x (whole-character embedding) dropout, so ``keep_input = 0.6``, ``keep_hidden = 0.9``,
``keep_output = 0.6`` implement the last three and the 0.10 x-dropout is NOT reproduced.
Zilly initialises weights U(-0.04, 0.04); the closest option here is ``init = "uniform"``
(PyTorch's U(+-1/sqrt(fan_in)), +-0.026 for 1500 inputs).

Training: plain SGD, learning rate 0.2, divided by 1.03 per epoch from the sixth epoch on
(``lr_decay_start_epoch = 5``, 0-based epochs, as Zilly's ``max_epoch = 5``), gradient clipping
at global L2 norm 10, L2 weight decay 1e-7 (added to the gradient before clipping), truncated
BPTT: batch 128 x 50 steps with the state carried across batches (``sampler = "stream"``), at
most 500 epochs, no early stopping. Cost: 45M parameters; Zilly et al. trained for days on a GPU.

Any field can be overridden: ``--config.train.max_minutes=600 --config.model.depth=5``.
"""

import ml_collections

VARIANTS = ("",)


def get_config(variant: str = "") -> ml_collections.ConfigDict:
    """The RHN paper's text8 configuration."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r} of configs/text8.py; one of {VARIANTS}")
    config = ml_collections.ConfigDict()
    config.variant = variant  # Which variant of this file produced the config.
    config.seed = 0  # Seeds parameters, dropout and the batch sampler.

    config.data = data = ml_collections.ConfigDict()
    data.format = "text"  # A single text file split the Hutter way (see below).
    data.corpus = "text8"  # Known corpus: download + verify + unzip when text_files is "".
    data.url = ""  # Mirror of http://mattmahoney.net/dc/text8.zip; "" = the official address.
    data.sha256 = ""  # Expected SHA256 of the zip; "" = the hash embedded in rhhjax/downloads.py.
    data.dir = ""  # Unused for format=text (PTB folder).
    data.download = True  # Download the zip when the file is not in the cache.
    data.unk = False  # All 27 symbols occur in train; an unseen symbol is an error.
    data.text_files = ""  # Path of the unzipped file; "" = the cache (downloaded if missing).
    data.text_split = "hutter"  # Last hutter_holdout symbols test, the ones before valid.
    data.text_vocab = "char"  # One symbol per character (a-z and space: 27).
    data.hutter_holdout = 5_000_000  # Symbols in each of valid and test (90M / 5M / 5M).
    data.sampler = "stream"  # Contiguous TBPTT streams, state carried across batches (Zilly).

    config.model = model = ml_collections.ConfigDict()
    model.type = "rhn"  # Plain Recurrent Highway Network.
    model.vocab_size = 27  # Overwritten from the data's vocabulary at training time.
    model.embed_dim = 27  # Embedding width = vocabulary size (Zilly).
    model.hidden = 1500  # Cell width.
    model.hyper_hidden = 128  # Unused (hyperrhn only).
    model.depth = 10  # Recurrence depth L.
    model.lstm_layers = 2  # Unused (lstm only).
    model.dropout = "variational"  # One mask per sequence on input, state and output (Zilly/Gal).
    model.keep = 1.0  # Unused with variational dropout (gate-dropout keep probability).
    model.keep_input = 0.6  # Keep probability on the cell input (Zilly drop_i = 0.40).
    model.keep_hidden = 0.9  # Keep probability on the state fed to W_l (Zilly drop_h = 0.10).
    model.keep_output = 0.6  # Keep probability before the softmax (Zilly drop_o = 0.40).
    model.t_bias_init = -4.0  # Transform-gate bias at init: start in carry mode (Zilly: -4).
    model.init = "uniform"  # Closest to Zilly's U(-0.04, 0.04) (see the docstring).
    model.hyper_input = "x"  # Unused (hyperrhn only).
    model.impl = "scan"  # scan (reference) | fused (custom VJP) | pallas (GPU kernels).
    # pallas: auto (compiled Triton on a GPU, interpret mode elsewhere) | compiled (e.g. to
    # compile a GPU step on a CPU host) | interpret.
    model.pallas_mode = "auto"
    # Block sizes of the Pallas kernels (kernels/highway.py HighwayConfig); the defaults
    # compile without register spills or shared-memory overflow for an H100 (see README).
    model.kernel = kernel = ml_collections.ConfigDict()
    kernel.block_b = 64  # Batch rows per program (power of two >= 16).
    kernel.block_n = 32  # Units per program, both gate halves (power of two >= 16).
    kernel.block_k = 32  # K chunk of the matmul loops (power of two >= 16).
    kernel.num_warps = 4  # Triton warps per program.
    kernel.num_stages = 3  # Software-pipelining stages of the K loops.
    kernel.allow_tf32 = False  # float32 weights: TF32 tensor cores (~1e-3 relative error).
    model.dtype = "float32"  # Matmul input dtype: float32 | bfloat16 (carry stays float32).
    model.hyper_rank = 0  # Unused (hyperrhn only: low-rank hypernetwork scaling).

    config.train = train = ml_collections.ConfigDict()
    train.optimizer = "sgd"  # adam | sgd (Zilly: plain SGD).
    train.batch_size = 128  # Parallel streams per step.
    train.seq_len = 50  # Truncated-BPTT length (inputs and targets each).
    train.learning_rate = 0.2  # SGD step size before decay.
    train.lr_decay = 1.03  # SGD: divide the learning rate by this once per epoch ...
    train.lr_decay_start_epoch = 5  # ... from 0-based epoch 5 on (the sixth epoch).
    train.b1 = 0.9  # Adam beta1 (unused with sgd).
    train.b2 = 0.999  # Adam beta2 (unused with sgd).
    train.weight_decay = 1e-7  # L2 weight decay (sgd: added to the gradient before clipping).
    train.clip_norm = 10.0  # Gradient clipping threshold.
    train.clip_type = "l2"  # Global L2 norm (Zilly).
    train.max_epochs = 500  # Zilly's max_max_epoch (an epoch = len(train) / (128 * 50) steps).
    train.max_steps = 0  # No step bound.
    train.max_minutes = 0.0  # No time bound.
    train.eval_every_steps = 0  # Validate once per epoch.
    train.patience = 0  # No early stopping (Zilly keeps the best validation checkpoint).
    train.log_every_steps = 100  # Progress line and metrics record every N steps.
    train.checkpoint_every_steps = 1000  # Checkpoint every N steps (~1/14 of an epoch).
    # Also checkpoint after this much wall time since the last save (0 = off): bounds what a
    # SIGKILL (a scheduler's, after its grace period) can lose.
    train.checkpoint_every_minutes = 10.0
    # A training loss above this x ln(vocab) (the loss of a uniform guess) counts as diverged,
    # like NaN (on_nonfinite applies); 0 = off.
    train.divergence_factor = 10.0
    train.tensorboard = False  # Also write TensorBoard events (pip install -e ".[tensorboard]").
    train.keep_checkpoints = 3  # Latest checkpoints kept (the best one is kept as well).
    train.on_nonfinite = "stop"  # stop | rollback (restore the last checkpoint and go on).

    config.eval = evaluation = ml_collections.ConfigDict()
    evaluation.batch_size = 128  # Rows per evaluation batch.
    evaluation.seq_len = 100  # Window / chunk length for the honest protocols.
    evaluation.min_context = 50  # windows protocol: minimum context of every scored symbol.
    evaluation.valid_protocol = "stream"  # Zilly's batched validation: state carried.
    evaluation.final_protocols = "windows,stream,paper"  # Run on the best checkpoint at the end.
    evaluation.max_valid_chars = 0  # Validate on all 5M symbols.
    return config
