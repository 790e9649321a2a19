"""Pallas kernels for rhhjax. This folder, kernels/, is installed as the package
`rhhjax.kernels` (pyproject's ``package-dir``); models reach it through `rhhjax.ops`.

    layout.py     `Geometry`: the padded layout of the whole-sequence recurrence.
    hardware.py   the GPU the kernels are built for (`H100`).
    mosaic/       the Mosaic GPU kernels (Hopper; `rhhjax.kernels.mosaic`).

Each subpackage's `__init__` names its own modules; every module of every package, in one
list: docs/design.md's module map.
"""
