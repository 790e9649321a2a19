"""Parameter table of any config, without allocating the parameters.

    python -m rhhjax.tools.summary --config=configs/ptb.py:rhn --config.model.depth=5

One row per parameter array (path, shape, count), then ``total_params N``.
"""

from __future__ import annotations

import jax
from absl import flags
from ml_collections import config_flags

from rhhjax import cli, models
from rhhjax.errors import UserError


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
    width = max(len(name) for name, _, _ in rows)
    lines = [f"{'parameter':<{width}}  {'shape':<18} {'count':>12}"]
    for name, shape, size in rows:
        lines.append(f"{name:<{width}}  {str(shape):<18} {size:>12,}")
    lines.append(f"total_params {sum(size for _, _, size in rows)}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    config = flags.FLAGS.config
    if config is None:
        raise UserError("--config is required, e.g. --config=configs/ptb.py")
    print(format_table(parameter_rows(models.ModelConfig.from_config(config.model))))
    return 0


def define_flags() -> None:
    config_flags.DEFINE_config_file("config", None, "Config file (path[:variant]).")


def console() -> None:
    cli.run_program(main, define_flags, __doc__)


if __name__ == "__main__":
    console()
