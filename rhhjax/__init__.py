"""rhhjax: Recurrent Highway Networks and Recurrent Highway Hypernetworks in JAX/Flax.

Packages (each package's ``__init__`` names its modules):

    models/     Flax modules: the cells, the cores over time, the character LM
    ops/        the op layer, arrays in and out: the implementations of the recurrence
    kernels/    Pallas kernels (installed from the top-level kernels/ folder)
    data/       vocabularies, corpora, samplers, evaluation batches
    train/      the training program, loop, state, checkpoints and workdir
    analysis/   weight norms, gradient flow, gates, lesions, figures
    hlo/        the compile report's library (HLO and compile dumps read back)
    tools/      the programs: evaluate, sample, plot, summary, ablate, analyze
    configs/    the experiment configs (installed from the top-level configs/ folder)

Modules:

    evaluation.py     cross-entropy, BPC and accuracy under every protocol
    sampling.py       text generation from a trained model
    parallel.py       the device mesh, shardings, multi-host helpers
    memory.py         memory estimates and out-of-memory lines
    outputs.py        output paths checked first, files written whole
    config_fields.py  dotted config fields and their "did you mean" hint
    errors.py         ``UserError``: every fixable error is one ``error:`` line
"""

__version__ = "0.1.0"
