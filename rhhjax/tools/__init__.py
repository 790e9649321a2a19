"""Command-line programs (absl mains): `python -m rhhjax.tools.<name>`, installed as
`rhhjax-<name>`. Training is `train.py` (`rhhjax.train.program`).

    evaluate.py  evaluate a checkpoint under every protocol
    sample.py    generate text from a checkpoint
    plot.py      training and validation BPC against epochs or minutes
    summary.py   the parameter table of any config
    ablate.py    train config variants with the same seeds and budget, and tabulate them
    analyze.py   weight norms, gradient flow, gate activity and lesions of trained models
    common.py    what the programs share: --config flags, quiet logging, one-line errors
"""
