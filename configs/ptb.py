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
    configs/ptb.py:tiny      a smoke configuration used by the tests: 6 steps; with PTB,
                             compilation and the final evaluation on all of PTB's valid and
                             test, 19.4 s wall on the project's 2-core CPU at load average 2
                             (jax 0.10.2, 2026-11-24), 48 s measured on a loaded machine.

Cost and expected result of the paper recipe: the paper trained ~660 epochs of 199 steps
(2-3 days on a GTX 1080 Ti) and reports 1.21 validation BPC under its own evaluation protocol
(the authors' saved curve bottoms out at 1.2275). Here one step takes 12.5 s on a 2-core CPU
(`scan`, float32, measured 2026-11-22), about 42 minutes per epoch: use a GPU. This
implementation has not yet been trained to convergence (see README.md, "Limitations").

Any field can be overridden: `--config.model.depth=5 --config.train.learning_rate=5e-4`.

The paper recipe is the library's defaults (`rhhjax.train.config.default_config`, which
lists every field with its comment: the `data` block in `rhhjax/data/config.py`, `model` in
`rhhjax/models/config.py`, its `kernel` block in `kernels/config.py`, `train` and `eval` in
`rhhjax/train/config.py`); this file sets what each variant changes. `configs/hutter.py`
(enwik8, text8) starts from the same defaults.
"""

import ml_collections
from rhhjax.configs import check_variant

from rhhjax.train.config import default_config

VARIANTS = ("", "rhn", "lstm", "cpu", "tiny")


def get_config(variant: str = "") -> ml_collections.ConfigDict:
    """The paper configuration, or one of `VARIANTS`."""
    check_variant("ptb", variant, VARIANTS)
    config = default_config()  # the paper's HyperRHN on PTB characters, every field
    config.variant = variant  # Which variant of this file produced the config.
    model, train, evaluation = config.model, config.train, config.eval
    if variant == "rhn":
        model.type = "rhn"  # The plain RHN baseline, same sizes.
        train.learning_rate = 5e-4  # The paper's RHN step size.
    elif variant == "lstm":
        model.type = "lstm"  # The paper's LSTM baseline: 2 layers ...
        model.hidden = 1125  # ... of 1125 units.
        model.keep = 1.0  # No dropout.
    elif variant == "cpu":
        model.hidden = 256  # Main width n, sized for a 2-core CPU.
        model.hyper_hidden = 64  # Hypernetwork width h.
        model.depth = 3  # Recurrence depth L.
        model.keep = 1.0  # No dropout: 1.72 against 1.95 valid BPC with keep 0.65 (results/).
        train.batch_size = 64  # Sequences per step (of the default 100 characters).
        train.learning_rate = 2e-3  # Adam step size (results/cpu_recipe_tuning.md).
        train.max_minutes = 12.0  # Training budget; the stop step is validated.
        train.eval_every_steps = 200  # Validate every 200 steps (an epoch is 797).
        train.log_every_steps = 25  # A progress line every 25 steps.
        evaluation.max_valid_chars = 100_000  # Periodic validation on a prefix of valid.
    elif variant == "tiny":
        model.hidden = 16  # A model that compiles and runs in seconds.
        model.hyper_hidden = 8  # Hypernetwork width h.
        model.depth = 2  # Recurrence depth L.
        train.batch_size = 4  # Sequences per step ...
        train.seq_len = 20  # ... of 20 characters.
        train.max_steps = 6  # Six steps ...
        train.eval_every_steps = 3  # ... validated at 3 and 6 ...
        train.log_every_steps = 1  # ... with a progress line for each.
        evaluation.batch_size = 8  # Rows per evaluation batch.
        evaluation.seq_len = 20  # Window length of the evaluation.
        evaluation.min_context = 5  # Minimum context of every scored character.
        evaluation.max_valid_chars = 2_000  # Periodic validation on a 2,000-character prefix.
    return config
