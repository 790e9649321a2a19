"""Command-line programs (absl mains): `python -m rhhjax.tools.<name>`. Training is `train.py`."""


def __getattr__(name: str):
    """`rhhjax.tools.hlo_compile`, the old name of `rhhjax.hlo.deviceless`, still read by the
    Mosaic-family tests until they move."""
    if name == "hlo_compile":
        import importlib

        return importlib.import_module("rhhjax.hlo.deviceless")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
