"""Train a character-level language model (RHN / HyperRHN / LSTM) and evaluate it.

    python train.py --config=configs/ptb.py                  # the paper's HyperRHN on PTB
    python train.py --config=configs/ptb.py:cpu              # a small model for a laptop CPU

The program is rhhjax.train.trainer (installed: rhhjax-train, or python -m rhhjax.train, with
--config=ptb:cpu); --help lists its flags, exit codes and every config field.
"""

from rhhjax.train.trainer import console

if __name__ == "__main__":
    console()
