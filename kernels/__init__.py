"""Pallas kernels for rhhjax. This folder, kernels/, is installed as the package
`rhhjax.kernels` (pyproject's ``package-dir``); models reach it through `rhhjax.ops`.

    layout.py     `Geometry`: the padded layout of the whole-sequence recurrence.
    hardware.py   the GPU the kernels are built for (`H100`).
    mosaic/       the Mosaic GPU kernels (Hopper; `rhhjax.kernels.mosaic`).

Every module: docs/design.md's module map.
"""
