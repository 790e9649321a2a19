"""Pallas kernels for rhhjax; `rhhjax.kernels.triton` is the Pallas Triton op's public API.
Model code reaches them only through `rhhjax.ops`."""


def __getattr__(name: str):
    """`rhhjax.kernels.highway`, the Triton API's old name, still read by the Mosaic-family
    ops and tests until they move beside it: the same module as `rhhjax.kernels.triton`."""
    if name == "highway":
        import importlib

        return importlib.import_module("rhhjax.kernels.triton")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
