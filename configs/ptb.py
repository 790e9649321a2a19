"""Penn Treebank character-level language modelling (Suarez 2017).

Command (the paper's HyperRHN, 15,262,736 parameters):

    python train.py --config=configs/ptb.py --workdir=workdirs/ptb_hyperrhn

Run time: 41.7 ms a step on one H100 in bfloat16 (50.4 ms in float32; 2026-11-23); a
2-core CPU takes 42 to 96 minutes an epoch (use a GPU). Measured on one H100 in bfloat16
(2026-11-26, `bash benchmarks/gpu_suite.sh lease` then `train` twice, one run resumed):
53.3 epochs (10,613 steps) in 456 s of training (41.0 ms a step in steady state), best
step 10547: valid 1.3791 / test 1.3424 BPC (windows protocol), valid 1.3793 under the
paper's protocol: NOT converged (results/ptb_gpu/README.md). The paper's ~660 epochs of 199
steps would take about 1.5 hours at 41.0 ms a step (a PROJECTION). Expected result: 1.21
validation BPC, the paper's own evaluation protocol (its authors' saved curve: 1.2275); not
trained to convergence here. The measurements (commands, machines, dates):
results/README.md#training-step-on-an-h100 and #the-paper-recipe-cost-on-a-cpu.

Variants, chosen after a colon (what they are; run time and result, same sources):

    configs/ptb.py:rhn       the paper's plain RHN baseline (same sizes, Adam 5e-4): 33.5 ms a
                             step on an H100 (float32, ``fused``).
    configs/ptb.py:lstm      the paper's 2 x 1125 LSTM baseline: not measured.
    configs/ptb.py:cpu       a small HyperRHN (501,752 parameters: depth 3, main 256, hyper 64,
                             no dropout) sized for a 2-core CPU: batch 64 x 100, Adam 2e-3, a
                             12-minute training budget: about 14 minutes in all, valid 1.7188 /
                             test 1.6730 BPC (windows protocol):
                             results/README.md#cpu-recipe-configsptbpycpu (every setting
                             tried: results/cpu_recipe_tuning.md).
    configs/ptb.py:tiny      a smoke configuration used by the tests: 6 steps, about 20 s on a
                             2-core CPU with PTB (most of it the final evaluation):
                             results/README.md#smoke-config-configsptbpytiny.

Any field can be overridden: `--config.model.depth=5 --config.train.learning_rate=5e-4`.

The paper recipe is the library's defaults (`rhhjax.train.config.default_config`, which
lists every field with its comment: the `data` block in `rhhjax/data/config.py`, `model` in
`rhhjax/models/config.py`, its `kernel` block in `kernels/triton/config.py`, `train` and `eval` in
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
