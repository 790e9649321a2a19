"""Command-line programs (absl mains): `python -m rhhjax.tools.<name>`. Training is `train.py`."""
