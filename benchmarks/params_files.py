"""A run's best parameters as float32 files small enough to leave a GPU loan, and back.

    python benchmarks/params_files.py export WORKDIR OUT_DIR [--parts=4]
    python benchmarks/params_files.py import OUT_DIR WORKDIR

``export`` writes ``params_<i>.npy`` (the leaves, flattened in tree order, as float32, cut
into ``--parts`` files) and ``params_index.json`` (each leaf's path, shape and dtype, and the
checkpoint's meta). ``import`` writes them as the best checkpoint of a new WORKDIR (with its
``config.json``), which ``rhhjax.tools.analyze``, ``evaluate`` and ``sample`` read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax
import numpy as np

from rhhjax.train import checkpoint as ckpt_lib
from rhhjax.train import workdir as workdir_lib

INDEX = "params_index.json"


def export(workdir: Path, out: Path, parts: int) -> list[Path]:
    """The best (else latest) parameters of ``workdir`` as ``parts`` float32 files."""
    with ckpt_lib.Checkpoints(workdir, read_only=True) as ckpts:
        which = "best" if ckpts.steps("best") else "latest"
        params, meta = ckpts.restore_params(which)
    leaves, _ = jax.tree_util.tree_flatten_with_path(params)
    flat = np.concatenate([np.asarray(v, np.float32).ravel() for _, v in leaves])
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for i, chunk in enumerate(np.array_split(flat, parts)):
        files.append(out / f"params_{i}.npy")
        np.save(files[-1], chunk)
    index = {
        "parts": parts,
        "leaves": [
            {"path": jax.tree_util.keystr(path), "shape": list(np.shape(v)), "dtype": str(v.dtype)}
            for path, v in leaves
        ],
        "meta": meta,
    }
    (out / INDEX).write_text(workdir_lib.json_dumps(index, indent=1) + "\n")
    return files


def load(folder: Path) -> tuple[dict, dict]:
    """(params, meta) from an ``export`` folder; the tree is the model's (from the meta)."""
    from rhhjax import models

    index = json.loads((folder / INDEX).read_text())
    flat = np.concatenate([np.load(folder / f"params_{i}.npy") for i in range(index["parts"])])
    expected = sum(int(np.prod(leaf["shape"], dtype=np.int64)) for leaf in index["leaves"])
    if flat.size != expected:
        raise ValueError(f"{folder}: {flat.size} values, the model has {expected}")
    # the tree is the same for every impl; `scan` builds it on any machine
    mc = models.ModelConfig.from_config(index["meta"]["model"], impl="scan")
    template = jax.eval_shape(lambda: models.init_params(models.build_model(mc), jax.random.key(0)))
    paths, treedef = jax.tree_util.tree_flatten_with_path(template)[0], jax.tree.structure(template)
    by_path = {leaf["path"]: leaf for leaf in index["leaves"]}
    values, start = [], 0
    for path, shape in paths:
        leaf = by_path[jax.tree_util.keystr(path)]
        size = int(np.prod(leaf["shape"], dtype=np.int64))
        if list(shape.shape) != leaf["shape"]:
            raise ValueError(f"{leaf['path']}: shape {leaf['shape']}, the model's {shape.shape}")
        values.append(flat[start : start + size].reshape(leaf["shape"]).astype(leaf["dtype"]))
        start += size
    return jax.tree_util.tree_unflatten(treedef, values), index["meta"]


def import_(folder: Path, workdir: Path) -> Path:
    """Write an ``export`` folder as the best checkpoint of a new ``workdir``."""
    params, meta = load(folder)
    workdir.mkdir(parents=True, exist_ok=False)
    config = json.dumps(meta["config"], indent=2, sort_keys=True) + "\n"
    workdir_lib.atomic_write(workdir / workdir_lib.CONFIG_FILE, config)
    with ckpt_lib.Checkpoints(workdir) as ckpts:
        ckpts.save_best(int(meta["step"]), params, meta)
    return workdir


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("export", "import"))
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("--parts", type=int, default=4)
    args = parser.parse_args(argv)
    if args.action == "export":
        for path in export(args.source, args.target, args.parts):
            print(f"{path} {path.stat().st_size:,} bytes")
    else:
        print(import_(args.source, args.target))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
