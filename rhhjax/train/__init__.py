"""Training: ``rhhjax.train.trainer.train_and_evaluate(config, workdir)``.

config.py (defaults, validation), setup.py (``prepare_run``: checks before writing), state.py
(``LoopState``, ``StateStore``), loop.py (``Loop``), budget.py (``train.budget_minutes`` in
steps), trainer.py (``train_and_evaluate`` and the program: train.py, rhhjax-train;
__main__.py), optim.py, step.py (the jitted step), autotune.py (``impl=auto`` timed on one
GPU), workdir.py (its files), signals.py (SIGTERM / SIGINT), checkpoint.py (``Checkpoints``),
checksums.py, checkpoint_failures.py (one-line failures), saved_run.py (``load_run`` for the
tools).
"""
