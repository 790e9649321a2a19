"""``python -m rhhjax.train --config=ptb:cpu``: the training program (``rhhjax.train.trainer``)."""

from rhhjax.train.trainer import console

if __name__ == "__main__":
    console()
