"""Weight norms (Suarez 2017, Figs. 2-3): one record per weight matrix, per layer of stacked
arrays, in forward order."""

from __future__ import annotations

import math
import re

import jax
import numpy as np

_ORDER = {
    "embed": 0,
    "core": 1,
    "head": 2,
    "hyper": 0,
    "proj_kernel": 1,
    "main": 2,
    "kernel_x": 0,
    "kernel_h": 1,
    "kernel_s": 1,
    "embedding": 0,
    "kernel": 0,
}
_SHORT = {
    "embedding": "E",
    "kernel_x": "U",
    "kernel_s": "W",
    "proj_kernel": "P",
    "kernel_h": "Wh",
    "kernel": "out",
}


def _order_key(path: tuple[str, ...]) -> tuple:
    key = []
    for part in path:
        m = re.fullmatch(r"layers_(\d+)", part)
        key.append((int(m.group(1)), "") if m else (_ORDER.get(part, 9), part))
    return tuple(key)


def weight_norms(params, depth: int | None = None) -> list[dict]:
    """One record per weight matrix (per layer of arrays stacked [depth, ., .]), in forward order:
    name, layer, label, block, shape, fro, rms (fro / sqrt(size)), spectral."""
    from flax import traverse_util

    flat = traverse_util.flatten_dict(jax.device_get(params))
    out = []
    for path in sorted(flat, key=_order_key):
        name = path[-1]
        array = np.asarray(flat[path], dtype=np.float64)
        if "bias" in name or array.ndim < 2:
            continue
        parts = [p for p in path[:-1] if p not in ("core", "cell")]
        block = "/".join(parts) or path[0]
        if path[:2] == ("core", "cell") and not parts:  # RHN cell / HyperRHN projections
            block = "proj" if name == "proj_kernel" else "cell"
        if name == "kernel_x" and any(p.startswith("layers_") for p in path):
            short = "Wx"
        else:
            short = _SHORT.get(name, name)
        stacked = array.ndim >= 3 and (depth is None or array.shape[0] == depth)
        matrices = list(enumerate(array)) if stacked else [(None, array)]
        for layer, m in matrices:
            m = m.reshape(m.shape[0], -1)
            fro = float(np.linalg.norm(m))
            out.append(
                {
                    "name": "/".join(path),
                    "layer": layer,
                    "block": block,
                    "label": f"{block} {short}{'' if layer is None else layer}",
                    "shape": list(m.shape),
                    "fro": fro,
                    "rms": fro / math.sqrt(m.size),
                    "spectral": float(np.linalg.norm(m, 2)),
                }
            )
    return out
