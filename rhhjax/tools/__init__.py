"""Command-line programs: ``python -m rhhjax.tools.<name>``, installed as ``rhhjax-<name>``;
what they share is ``rhhjax.cli``. evaluate.py (a checkpoint under every protocol), sample.py
(text), plot.py (BPC curves), summary.py (parameter table), ablate.py (config variants),
analyze.py (norms, gradient flow, gates, lesions).
"""
