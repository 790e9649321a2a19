"""Command-line programs ``python -m rhhjax.tools.<name>`` (``rhhjax-<name>``; ``rhhjax.cli``):
evaluate.py, sample.py, plot.py, summary.py, ablate.py, analyze.py."""
