"""A run's best parameters as float32 files small enough to copy off a GPU machine, and back.

    python benchmarks/params_files.py export WORKDIR OUT_DIR [--parts=4]
    python benchmarks/params_files.py import OUT_DIR WORKDIR

``export`` writes ``params_<i>.npy`` (the leaves, flattened in tree order, as float32, cut
into ``--parts`` files) and ``params_index.json`` (each leaf's path, shape and dtype, each
part's size and SHA-256, and the checkpoint's meta). ``import`` checks every part against the
index (a missing, truncated, changed or swapped part is one ``error:`` line, exit 1, nothing
written), then writes them as the best checkpoint of a new WORKDIR (with its ``config.json``),
which ``rhhjax.tools.analyze``, ``evaluate`` and ``sample`` read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax
import numpy as np

from rhhjax.errors import UserError, exit_with_error
from rhhjax.train import checkpoint as ckpt_lib
from rhhjax.train import workdir as workdir_lib
from rhhjax.train.checksums import sha256

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
        "part_sizes": [int(np.load(f, mmap_mode="r").size) for f in files],
        "sha256": [sha256(f) for f in files],
        "leaves": [
            {"path": jax.tree_util.keystr(path), "shape": list(np.shape(v)), "dtype": str(v.dtype)}
            for path, v in leaves
        ],
        "meta": meta,
    }
    (out / INDEX).write_text(workdir_lib.json_dumps(index, indent=1) + "\n")
    return files


def read_index(folder: Path) -> dict:
    """The ``export`` index of ``folder``; UserError (one line) when it is not one."""
    if not folder.is_dir():
        raise UserError(f"{folder} is not a folder: give the OUT_DIR of params_files.py export")
    try:
        index = json.loads((folder / INDEX).read_text())
        parts, leaves, meta = int(index["parts"]), index["leaves"], index["meta"]
        if parts < 1 or not isinstance(leaves, list) or not isinstance(meta, dict):
            raise ValueError("no parts, leaves or meta")
    except FileNotFoundError:
        raise UserError(f"{folder} has no {INDEX}: not a params_files.py export") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{folder / INDEX} does not read ({' '.join(str(e).split())})") from None
    return index


def read_part(folder: Path, index: dict, i: int) -> np.ndarray:
    """Part ``i``, checked against the index's SHA-256, size and dtype (float32, flat)."""
    path = folder / f"params_{i}.npy"
    if not path.is_file():
        raise UserError(f"{path} is missing: the export has {index['parts']} parts")
    sums = index.get("sha256")
    if sums is not None and sha256(path) != sums[i]:
        raise UserError(
            f"{path} does not match its SHA-256 in {INDEX} (a changed, truncated or swapped "
            "part): copy the export folder again"
        )
    try:
        part = np.load(path)
    except (OSError, ValueError, EOFError) as e:
        raise UserError(f"{path} does not read as .npy ({' '.join(str(e).split())})") from None
    sizes = index.get("part_sizes")
    if part.dtype != np.float32 or part.ndim != 1 or (sizes and part.size != sizes[i]):
        raise UserError(
            f"{path} holds {part.dtype} {list(part.shape)}, the index a flat float32 part"
            f"{f' of {sizes[i]:,} values' if sizes else ''}"
        )
    return part


def load(folder: Path) -> tuple[dict, dict]:
    """(params, meta) from an ``export`` folder; the tree is the model's (from the meta)."""
    from rhhjax import models

    index = read_index(folder)
    flat = np.concatenate([read_part(folder, index, i) for i in range(index["parts"])])
    expected = sum(int(np.prod(leaf["shape"], dtype=np.int64)) for leaf in index["leaves"])
    if flat.size != expected:
        raise UserError(f"{folder}: {flat.size} values, the model has {expected}")
    # the tree is the same for every impl; `scan` builds it on any machine
    mc = models.ModelConfig.from_config(index["meta"]["model"], impl="scan")
    template = jax.eval_shape(lambda: models.init_params(models.build_model(mc), jax.random.key(0)))
    paths, treedef = jax.tree_util.tree_flatten_with_path(template)[0], jax.tree.structure(template)
    by_path = {leaf["path"]: leaf for leaf in index["leaves"]}
    values, start = [], 0
    for path, shape in paths:
        leaf = by_path.get(jax.tree_util.keystr(path))
        if leaf is None:
            raise UserError(f"{INDEX} has no leaf {jax.tree_util.keystr(path)} of the model")
        size = int(np.prod(leaf["shape"], dtype=np.int64))
        if list(shape.shape) != leaf["shape"] or str(shape.dtype) != leaf["dtype"]:
            raise UserError(
                f"{leaf['path']}: {leaf['dtype']} {leaf['shape']} in {INDEX}, the model's "
                f"{shape.dtype} {list(shape.shape)}"
            )
        values.append(flat[start : start + size].reshape(leaf["shape"]).astype(leaf["dtype"]))
        start += size
    return jax.tree_util.tree_unflatten(treedef, values), index["meta"]


def import_(folder: Path, workdir: Path) -> Path:
    """Write an ``export`` folder as the best checkpoint of a new ``workdir``."""
    if workdir.exists():
        raise UserError(f"{workdir} exists: import writes a new workdir, give another path")
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
    try:
        if args.action == "export":
            for path in export(args.source, args.target, args.parts):
                print(f"{path} {path.stat().st_size:,} bytes")
        else:
            print(import_(args.source, args.target))
    except UserError as e:
        exit_with_error(e)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
