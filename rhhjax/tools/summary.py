"""Parameter table of any config, without allocating the parameters.

    python -m rhhjax.tools.summary --config=configs/ptb.py
    python -m rhhjax.tools.summary --config=configs/ptb.py:rhn --config.model.depth=5

Prints one row per parameter array (path, shape, count) and ends with `total_params N`.
The vocabulary size is `model.vocab_size` from the config (50 for PTB characters).
"""

from __future__ import annotations

import sys

import jax
from absl import app
from ml_collections import config_flags

from rhhjax import models
from rhhjax.tools import common as cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (path[:variant]).")


def parameter_rows(model_config: models.ModelConfig) -> list[tuple[str, tuple[int, ...], int]]:
    """[(path, shape, size)] for every parameter array of the model, in tree order."""
    model = models.build_model(model_config)
    shapes = jax.eval_shape(lambda: models.init_params(model, jax.random.key(0)))
    rows = []
    for path, leaf in jax.tree_util.tree_leaves_with_path(shapes):
        name = "/".join(str(getattr(k, "key", k)) for k in path)
        rows.append((name, tuple(leaf.shape), int(leaf.size)))
    return rows


def format_table(rows: list[tuple[str, tuple[int, ...], int]]) -> str:
    """The table as text, ending with the `total_params N` line."""
    width = max(len(name) for name, _, _ in rows)
    lines = [f"{'parameter':<{width}}  {'shape':<18} {'count':>12}"]
    for name, shape, size in rows:
        lines.append(f"{name:<{width}}  {str(shape):<18} {size:>12,}")
    lines.append(f"total_params {sum(size for _, _, size in rows)}")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _CONFIG.value is None:
        sys.exit("error: --config is required, e.g. --config=configs/ptb.py")
    try:
        model_config = models.ModelConfig.from_config(_CONFIG.value.model)
    except models.ConfigError as error:
        sys.exit(f"error: {error}")
    print(format_table(parameter_rows(model_config)))


if __name__ == "__main__":
    app.run(main, flags_parser=lambda argv: cli.parse_flags(argv, __doc__))
