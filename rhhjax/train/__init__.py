"""Training: config defaults and validation, optimizer, the one train step, workdir files,
checkpoints and the loop (`rhhjax.train.loop.train_and_evaluate`)."""
