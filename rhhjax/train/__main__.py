"""``python -m rhhjax.train --config=ptb:cpu``: the training program (``rhhjax.train.program``)."""

from rhhjax.train.program import console

if __name__ == "__main__":
    console()
