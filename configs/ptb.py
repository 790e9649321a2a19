"""Penn Treebank characters (Suarez 2017): the paper's HyperRHN (the library's defaults) and
variants after a colon: `configs/ptb.py:rhn` (plain RHN), `configs/ptb.py:lstm` (2 x 1125 LSTM),
`configs/ptb.py:fast` (a time budget, warm-up and decay), `configs/ptb.py:cpu` (a small HyperRHN
for a 2-core CPU), `configs/ptb.py:tiny` (the tests' smoke run). Results: results/README.md.

    python train.py --config=configs/ptb.py --workdir=workdirs/ptb_hyperrhn
"""

import ml_collections
from rhhjax.configs import check_variant

from rhhjax.train.config import default_config

VARIANTS = ("", "rhn", "lstm", "fast", "cpu", "tiny")


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
    elif variant == "fast":
        train.budget_minutes = 8.0  # Training time, compilation included.
        train.max_epochs = 0  # The budget, not an epoch count, ends the run ...
        train.patience = 0  # ... and no early stop cuts the schedule short.
        train.batch_size = 512  # PREDICTION: fills 128 SMs in row groups (results/batch_cpu/).
        train.schedule = "cosine"  # Warm-up, then a cosine decay to the floor.
        train.warmup_steps = 200  # Linear warm-up.
        train.learning_rate = 8e-3  # Peak: batch 256's 4e-3 scaled linearly (results/batch_cpu/).
        train.final_lr_fraction = 0.1  # Floor: a tenth of the peak, on the last step.
        train.clip_type = "l2"  # Global L2 norm clipping ...
        train.clip_norm = 1.0  # ... at 1.0.
        train.eval_every_steps = 500  # Validate every ~5 epochs.
    elif variant == "cpu":
        model.hidden = 256  # Main width n, sized for a 2-core CPU.
        model.hyper_hidden = 64  # Hypernetwork width h.
        model.depth = 3  # Recurrence depth L.
        model.keep = 1.0  # No dropout (results/cpu_recipe_tuning.md).
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
