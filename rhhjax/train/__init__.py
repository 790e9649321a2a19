"""Training: ``rhhjax.train.trainer.train_and_evaluate(config, workdir)``.

config.py      every default (``default_config``), the train / eval blocks, validation
setup.py       ``prepare_run``: the checks before anything is written -> ``Run``
state.py       ``LoopState`` and ``StateStore`` (fresh / saved / restored states)
loop.py        ``Loop``: steps, progress, validation, checkpoints, stops, results
trainer.py     ``train_and_evaluate``: setup, start or resume, loop, finish
optim.py, step.py, workdir.py, signals.py: the optimizer, the jitted step, the workdir's
               files, SIGTERM / SIGINT
checkpoint.py  ``Checkpoints``: the latest and best checkpoints of a workdir, saved and restored
checksums.py   the checksum table of a checkpoint: written, read, compared
checkpoint_failures.py  a failed save or restore as one line (orbax's noise dropped)
program.py     the training program (train.py, rhhjax-train); __main__.py: python -m rhhjax.train
saved_run.py   ``SavedRun`` / ``load_run``: a trained run for evaluate, sample and analysis
               (which checkpoint: best, latest or a step)
"""
