"""Penn Treebank character-level language modelling (Suarez 2017).

Command (the paper's HyperRHN, 15,262,736 parameters):

    python train.py --config=configs/ptb.py --workdir=workdirs/ptb_hyperrhn

Variants, chosen after a colon:

    configs/ptb.py           the paper's HyperRHN: depth 7, main 1000, hyper 128, keep 0.65
                             on the transform gate, embedding 27, Adam 1e-3, batch 256, length
                             100, L1-norm clipping at 10 as in the paper's code.
    configs/ptb.py:rhn       the paper's plain RHN baseline (same sizes, Adam 5e-4).
    configs/ptb.py:lstm      the paper's 2 x 1125 LSTM baseline.
    configs/ptb.py:cpu       a small HyperRHN (501,752 parameters: depth 3, main 256, hyper
                             64, no dropout) sized for a 2-core CPU: batch 64 x 100, Adam 2e-3,
                             12-minute training budget. Measured 2026-11-23 on the project's
                             quiet 2-core CPU (jax 0.10.2): step 1621 (2.03 epochs), valid
                             1.7188 / test 1.6730 BPC (windows protocol), 14 min 6 s wall in
                             total with compilation and final evaluation. Every setting
                             tried: results/cpu_recipe_tuning.md.
    configs/ptb.py:tiny      a smoke configuration used by the tests: 6 steps, but about 40 s
                             on a 2-core CPU with PTB (compilation, and 18 s of final
                             evaluation on all of PTB's valid and test; issue 15, 2026-11-22).

Cost and expected result of the paper recipe: the paper trained ~660 epochs of 199 steps
(2-3 days on a GTX 1080 Ti) and reports 1.21 validation BPC under its own evaluation protocol
(the authors' saved curve bottoms out at 1.2275). Here one step takes 12.5 s on a 2-core CPU
(`scan`, float32, measured 2026-11-22), about 42 minutes per epoch: use a GPU. This
implementation has not yet been trained to convergence (see README).

Any field can be overridden: `--config.model.depth=5 --config.train.learning_rate=5e-4`.

This file holds every field of every block, each with its comment: it is the project's one
place for defaults. `configs/hutter.py` (enwik8, text8) starts from it; a workdir's older
`config.json` that lacks a field gets it from here (`rhhjax.train.config.prepare_config`);
`rhhjax.models.ModelConfig()` equals its model block (a test checks it).
"""

import ml_collections
from rhhjax.configs import check_variant

VARIANTS = ("", "rhn", "lstm", "cpu", "tiny")


def get_config(variant: str = "") -> ml_collections.ConfigDict:
    """The paper configuration, or one of `VARIANTS`."""
    check_variant("ptb", variant, VARIANTS)
    config = ml_collections.ConfigDict()
    config.variant = variant  # Which variant of this file produced the config.
    config.seed = 0  # Seeds parameters, dropout and the batch sampler.

    config.data = data = ml_collections.ConfigDict()
    data.format = "chars"  # chars (raw ptb.*.txt, 50 symbols) | mikolov_char | text.
    data.corpus = ""  # format=text: a known corpus (enwik8 | text8) to download; "" = none.
    data.url = ""  # data.corpus: a mirror of its download address; "" = the official one.
    data.sha256 = ""  # data.corpus: expected SHA256 of the download; "" = the embedded hash.
    data.dir = ""  # PTB folder; "" = $RHHJAX_CACHE/ptb (~/.cache/rhhjax/ptb), downloaded.
    data.download = True  # Download simple-examples.tgz when the files are missing.
    data.unk = False  # Map unseen valid/test symbols to <unk> instead of failing.
    data.text_files = ""  # format=text: one file (hutter split) or "train,valid,test".
    data.text_split = "hutter"  # format=text: hutter (last N test, previous N valid) | files.
    data.text_vocab = "char"  # format=text: char (Unicode characters) | byte.
    data.hutter_holdout = 5_000_000  # format=text, hutter split: symbols in valid and test.
    data.sampler = "windows"  # windows (paper: random 101-char windows) | stream (TBPTT).

    config.model = model = ml_collections.ConfigDict()
    model.type = "hyperrhn"  # hyperrhn | rhn | lstm.
    model.vocab_size = 50  # Overwritten from the data's vocabulary at training time.
    model.embed_dim = 27  # Character embedding width (paper: 27).
    model.hidden = 1000  # Main cell width n (LSTM: units per layer).
    model.hyper_hidden = 128  # Hypernetwork width h (hyperrhn only).
    model.depth = 7  # Recurrence depth L: micro-layers per time step (rhn, hyperrhn).
    model.lstm_layers = 2  # Stacked layers (lstm only).
    model.dropout = "gate"  # gate (paper) | variational (Zilly/Gal) | none.
    model.keep = 0.65  # Keep probability of gate dropout (lstm: between layers).
    model.keep_input = 1.0  # variational: keep probability on the cell input.
    model.keep_hidden = 1.0  # variational: keep probability on the state fed to W_l.
    model.keep_output = 1.0  # variational: keep probability on the output before softmax.
    model.t_bias_init = 0.0  # Added to the transform-gate bias at init (Zilly: -2 / -4).
    model.init = "orthogonal"  # orthogonal (paper code) | uniform (PyTorch default Linear).
    model.hyper_input = "x"  # x (paper) | x_and_state (Ha's HyperLSTM: also the main state).
    # auto (the fastest measured: fused on a GPU, scan on a CPU) | scan (reference nn.scan) |
    # fused (custom VJP) | pallas (GPU kernels).
    model.impl = "auto"
    # pallas: auto (compiled Triton on a GPU, interpret mode elsewhere) | compiled (e.g. to
    # compile a GPU step on a CPU host) | interpret.
    model.pallas_mode = "auto"
    # Block sizes of the Pallas kernels (kernels/config.py HighwayConfig); the defaults
    # compile without register spills or shared-memory overflow for an H100 (see README).
    model.kernel = kernel = ml_collections.ConfigDict()
    kernel.block_b = 64  # Batch rows per program (power of two >= 16).
    kernel.block_n = 32  # Units per program, both gate halves (power of two >= 16).
    kernel.block_k = 32  # K chunk of the matmul loops (power of two >= 16).
    kernel.num_warps = 4  # Triton warps per program.
    kernel.num_stages = 3  # Software-pipelining stages of the K loops.
    kernel.allow_tf32 = False  # float32 weights: TF32 tensor cores (~1e-3 relative error).
    model.dtype = "float32"  # Matmul input dtype: float32 | bfloat16 (carry stays float32).
    model.hyper_rank = 0  # 0 = paper's column scaling; d > 0: rank-d W o sum u_i v_i^T (sec. 4).
    model.lowrank_op = "custom_vjp"  # hyper_rank > 0, scan: custom_vjp | factored | materialized.
    model.lowrank_remat = True  # hyper_rank > 0 with scan: recompute u, v, X_u W in the backward.
    # rhn, hyperrhn: True reproduces the paper's code exactly: on a sequence's first step a
    # row whose state is exactly zero (the code's integer 0) skips layer 0's recurrent
    # bias b_0, in both cells. False (default): b_0 applies at every step (a documented
    # deviation: at init the paper model's logits differ by <= 3.1e-4 at t = 0; README).
    model.original_first_step = False

    config.train = train = ml_collections.ConfigDict()
    train.batch_size = 256  # Sequences per step (paper: 256; the paper's code used 200).
    train.seq_len = 100  # Characters per training sequence (inputs and targets each).
    train.optimizer = "adam"  # adam (paper) | sgd (Zilly's recipe, with lr_decay).
    train.learning_rate = 1e-3  # Step size (paper HyperRHN: Adam 1e-3; RHN: 5e-4).
    train.lr_decay = 1.0  # sgd: divide the learning rate by this once per epoch...
    train.lr_decay_start_epoch = 0  # ...from this 0-based epoch on.
    train.b1 = 0.9  # Adam beta1.
    train.b2 = 0.999  # Adam beta2.
    train.weight_decay = 0.0  # Decoupled weight decay (AdamW) when > 0.
    train.clip_norm = 10.0  # Gradient clipping threshold; 0 disables clipping.
    train.clip_type = "l1"  # l1 (the paper code's total L1 norm) | l2 (global L2 norm).
    train.max_epochs = 1000  # Upper bound on epochs (an epoch = len(train) / (batch*seq_len)).
    train.max_steps = 0  # Stop after this many steps when > 0 (takes precedence).
    # Stop after this much training time when > 0 (summed across restarts; the first step's
    # compilation counts, validation and saving do not); the stop step is validated.
    train.max_minutes = 0.0
    train.eval_every_steps = 0  # Validate every N steps; 0 = once per epoch.
    train.patience = 20  # Early stopping: evaluations without a new best valid BPC; 0 = off.
    train.log_every_steps = 50  # Progress line and metrics record every N steps.
    train.checkpoint_every_steps = 0  # Extra checkpoints every N steps; 0 = at evaluations.
    train.keep_checkpoints = 3  # Latest checkpoints kept (the best one is kept as well).
    # Also checkpoint after this much wall time since the last save (0 = off): bounds what a
    # SIGKILL (a scheduler's, after its grace period) can lose.
    train.checkpoint_every_minutes = 10.0
    train.on_nonfinite = "stop"  # stop | rollback (restore the last checkpoint and go on).
    # A training loss above this x ln(vocab) (the loss of a uniform guess) counts as diverged,
    # like NaN (on_nonfinite applies); 0 = off.
    train.divergence_factor = 10.0
    train.tensorboard = False  # Also write TensorBoard events (pip install -e ".[tensorboard]").
    # Data parallelism: the batch is split over all devices of all processes (batch sizes must
    # divide by the device count). Several hosts: True (or $JAX_COORDINATOR_ADDRESS set) calls
    # jax.distributed.initialize() (JAX_NUM_PROCESSES / JAX_PROCESS_ID, or SLURM / MPI).
    train.distributed = False
    train.fsdp = False  # Also split parameters / optimizer state over devices (FSDP-style).

    config.eval = evaluation = ml_collections.ConfigDict()
    evaluation.batch_size = 256  # Rows per evaluation batch.
    evaluation.seq_len = 100  # Window / chunk length for the honest protocols.
    evaluation.min_context = 50  # windows protocol: minimum context of every scored char.
    evaluation.valid_protocol = "windows"  # Protocol of the periodic validation.
    evaluation.final_protocols = "windows,stream,paper"  # Run on the best checkpoint at the end.
    evaluation.max_valid_chars = 0  # Periodic validation on a prefix of valid if > 0.

    if variant == "rhn":
        model.type = "rhn"
        train.learning_rate = 5e-4
    elif variant == "lstm":
        model.type = "lstm"
        model.hidden = 1125
        model.keep = 1.0
    elif variant == "cpu":
        model.hidden = 256
        model.hyper_hidden = 64
        model.depth = 3
        model.keep = 1.0  # no dropout: 1.72 against 1.95 valid BPC with keep 0.65 (results/)
        train.batch_size = 64
        train.seq_len = 100
        train.learning_rate = 2e-3
        train.max_minutes = 12.0
        train.eval_every_steps = 200
        train.log_every_steps = 25
        evaluation.max_valid_chars = 100_000
    elif variant == "tiny":
        model.hidden = 16
        model.hyper_hidden = 8
        model.depth = 2
        train.batch_size = 4
        train.seq_len = 20
        train.max_steps = 6
        train.eval_every_steps = 3
        train.log_every_steps = 1
        evaluation.batch_size = 8
        evaluation.seq_len = 20
        evaluation.min_context = 5
        evaluation.max_valid_chars = 2_000
    return config
