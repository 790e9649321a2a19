"""rhhjax: Recurrent Highway Networks and Recurrent Highway Hypernetworks in JAX/Flax."""

__version__ = "0.1.0"
