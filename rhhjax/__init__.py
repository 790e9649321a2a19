"""rhhjax: Recurrent Highway Networks and Recurrent Highway Hypernetworks in JAX/Flax.

Packages: models/ (Flax modules), ops/ (the recurrence's implementations), kernels/ (Pallas
kernels), data/ (corpora, samplers, evaluation batches), train/ (the training program),
analysis/ (norms, gradient flow, gates, lesions), tools/ (the programs), configs/.
Modules: evaluation.py (BPC under every protocol), sampling.py (text generation), parallel.py
(mesh, shardings), memory.py (estimates, out-of-memory lines), outputs.py (checked output
paths), config_fields.py (dotted fields), config_files.py (the config loader), cli.py (what
every program shares), errors.py (``UserError``: one ``error:`` line).
"""

__version__ = "0.1.0"
