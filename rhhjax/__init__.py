"""rhhjax: Recurrent Highway Networks and Hypernetworks in JAX/Flax. Packages: models/, ops/,
kernels/, data/, train/, analysis/, tools/, configs/; modules: evaluation.py, sampling.py,
parallel.py, memory.py, outputs.py, config_fields.py, config_files.py, cli.py, errors.py,
authors.py."""

__version__ = "0.1.0"
