"""Checkpoints of a run: ``Checkpoints(workdir)``, the orbax managers of ``checkpoints/<step>/``
(params, opt_state, carry, meta) and ``best/<step>/`` (params, meta), each save checked by its
``checksums.json``. Layout and ordering: docs/design.md (``rhhjax/train/checkpoint.py``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from rhhjax.errors import UserError
from rhhjax.train import checkpoint_failures as failures
from rhhjax.train import checksums

LATEST_DIR = "checkpoints"
BEST_DIR = "best"
META_VERSION = 1
LATEST_ITEMS = ("params", "opt_state", "carry", "meta")
BEST_ITEMS = ("params", "meta")


class CheckpointError(UserError):
    """A missing or unreadable checkpoint; the message is one line."""


class DamagedCheckpointError(CheckpointError):
    """Changed or unreadable files; ``alternatives``: undamaged ``(which, step)``."""

    def __init__(
        self,
        message: str,
        which: str,
        step: int,
        alternatives: tuple[tuple[str, int], ...] = (),
        reason: str = "",
    ):
        super().__init__(message)
        self.which = which
        self.step = step
        self.alternatives = alternatives
        self.reason = reason


def folder_name(which: str, step: int) -> str:
    return f"{LATEST_DIR if which == 'latest' else BEST_DIR}/{step}"


def abstract(tree: Any) -> Any:
    def leaf(x):
        return x if isinstance(x, jax.ShapeDtypeStruct) else ocp.utils.to_shape_dtype_struct(x)

    return jax.tree.map(leaf, tree)


def _manager(directory: Path, items: tuple[str, ...], keep: int | None, read_only: bool):
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep,
        create=not read_only,
        enable_async_checkpointing=False,
        cleanup_tmp_directories=not read_only,
    )
    return ocp.CheckpointManager(directory.absolute(), options=options, item_names=items)


class Checkpoints:
    def __init__(self, workdir: str | os.PathLike, keep: int = 3, read_only: bool = False):
        self.workdir = Path(workdir)
        self.read_only = read_only
        self._latest = None
        self._best = None
        self._keep = keep
        if not read_only or (self.workdir / LATEST_DIR).is_dir():
            self._latest = _manager(self.workdir / LATEST_DIR, LATEST_ITEMS, keep, read_only)
        if not read_only or (self.workdir / BEST_DIR).is_dir():
            # no automatic deletion: the old best goes in keep_only_best
            self._best = _manager(self.workdir / BEST_DIR, BEST_ITEMS, None, read_only)

    def latest_step(self) -> int | None:
        return self._latest.latest_step() if self._latest is not None else None

    def best_step(self) -> int | None:
        return self._best.latest_step() if self._best is not None else None

    def steps(self, which: str = "latest") -> list[int]:
        manager = self._which(which)
        return list(manager.all_steps()) if manager is not None else []

    def _which(self, which: str):
        if which not in ("latest", "best"):
            raise CheckpointError(f"checkpoint must be 'best' or 'latest', got {which!r}")
        return self._latest if which == "latest" else self._best

    def save_latest(self, step: int, params, opt_state, carry, meta: dict) -> None:
        self._save(
            self._latest,
            step,
            failures.tree_bytes((params, opt_state, carry)),
            params=ocp.args.StandardSave(params),
            opt_state=ocp.args.StandardSave(opt_state),
            carry=ocp.args.StandardSave({"carry": carry}),
            meta=ocp.args.JsonSave(meta),
        )

    def save_best(self, step: int, params, meta: dict) -> None:
        self._save(
            self._best,
            step,
            failures.tree_bytes(params),
            params=ocp.args.StandardSave(params),
            meta=ocp.args.JsonSave(meta),
        )

    def keep_only_best(self, step: int | None) -> list[int]:
        """Delete every best checkpoint but ``step`` (all when None); returns the steps."""
        if self._best is None or self.read_only:
            return []
        deleted = [s for s in self._best.all_steps() if s != step]
        for s in deleted:
            self._best.delete(s)
        return deleted

    def _save(self, manager, step: int, nbytes: int, **items) -> None:
        if self.read_only:
            raise CheckpointError("checkpoints opened read-only")
        if step in manager.all_steps():
            manager.delete(step)
        failures.silence_closed_loop_noise()
        try:
            with failures.quiet_orbax_errors():
                manager.save(step, args=ocp.args.Composite(**items), force=True)
                manager.wait_until_finished()
            if jax.process_index() == 0:
                checksums.write_checksums(Path(manager.directory) / str(step))
        except Exception as e:
            line = failures.failed_save(manager, self._latest, step, nbytes, e)
            raise CheckpointError(line) from None

    def prune_after(self, step: int) -> list[int]:
        deleted = []
        for manager in (self._latest, self._best):
            if manager is None:
                continue
            for s in manager.all_steps():
                if s > step:
                    manager.delete(s)
                    deleted.append(s)
        return deleted

    def restore_latest(self, step: int, params, opt_state, carry) -> tuple[Any, Any, Any, dict]:
        restored = self._restore(
            "latest",
            step,
            params=ocp.args.StandardRestore(abstract(params)),
            opt_state=ocp.args.StandardRestore(abstract(opt_state)),
            carry=ocp.args.StandardRestore({"carry": abstract(carry)}),
            meta=ocp.args.JsonRestore(),
        )
        return restored.params, restored.opt_state, restored.carry["carry"], dict(restored.meta)

    def _restore(self, which: str, step: int, **items):
        """Restore ``items`` after checking the files (none: finite params)."""
        manager = self._which(which)
        checked = self._check_files(which, step, self._folder(which, step), tuple(items))
        failures.silence_closed_loop_noise()
        try:
            items = {k: v() if callable(v) else v for k, v in items.items()}
            restored = manager.restore(step, args=ocp.args.Composite(**items))
        except Exception as e:
            reason = f"it does not read: {failures.read_error(e)}"
            raise self._damaged(which, step, reason) from None
        if not checked and "params" in items and not _all_finite(restored.params):
            raise self._damaged(which, step, "it holds non-finite parameters")
        return restored

    def _check_files(self, which: str, step: int, folder: Path, items: tuple[str, ...]) -> bool:
        try:
            expected = checksums.read_checksums(folder)
        except FileNotFoundError:
            return False
        except checksums.ChecksumFileError as e:
            raise self._damaged(which, step, str(e)) from None
        problem = checksums.files_problem(folder, expected, items)
        if problem:
            raise self._damaged(which, step, problem)
        return True

    def undamaged(self, but: tuple[str, int] | None = None) -> list[tuple[str, int]]:
        """(which, step) of every undamaged checkpoint but ``but``, newest first (reads all)."""
        found = [
            (which, step)
            for which in ("latest", "best")
            for step in self.steps(which)
            if (which, step) != but and checksums.intact(self._folder(which, step), LATEST_ITEMS)
        ]
        return sorted(found, key=lambda a: (-a[1], a[0] != "latest"))

    def _folder(self, which: str, step: int) -> Path:
        return Path(self._which(which).directory) / str(step)

    def _damaged(self, which: str, step: int, reason: str) -> DamagedCheckpointError:
        alternatives = tuple(self.undamaged(but=(which, step)))
        listed = ", ".join(folder_name(w, s) for w, s in alternatives) or "none"
        return DamagedCheckpointError(
            f"checkpoint {self.workdir / folder_name(which, step)} is damaged ({reason}); "
            f"undamaged checkpoints in {self.workdir}: {listed}",
            which,
            step,
            alternatives,
            reason,
        )

    def read_meta(self, which: str = "latest", step: int | None = None) -> dict | None:
        manager = self._which(which)
        if manager is None:
            return None
        step = manager.latest_step() if step is None else step
        if step is None:
            return None
        return dict(self._restore(which, step, meta=ocp.args.JsonRestore()).meta)

    def newest_readable_meta(self) -> dict | None:
        for which in ("latest", "best"):
            for step in sorted(self.steps(which), reverse=True):
                try:
                    return self.read_meta(which, step)
                except DamagedCheckpointError:
                    continue
        return None

    def restore_params(self, which: str = "best", step: int | None = None, template=None):
        """(params, meta) of a checkpoint; no ``template``: on the first device."""
        manager = self._which(which)
        step = manager.latest_step() if (manager is not None and step is None) else step
        if manager is None or step is None:
            raise CheckpointError(f"no {which} checkpoint in {self.workdir}")
        item_dir = Path(manager.directory) / str(step) / "params"

        def params_arg():
            target = abstract(template) if template is not None else _single_device_target(item_dir)
            return ocp.args.StandardRestore(target)

        restored = self._restore(which, step, params=params_arg, meta=ocp.args.JsonRestore())
        return restored.params, dict(restored.meta)

    def close(self) -> None:
        for manager in (self._latest, self._best):
            if manager is not None:
                manager.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        try:
            self.close()
        except Exception:  # noqa: BLE001 -- a failed save already raised the error to report
            if exc_type is None:
                raise


def _all_finite(tree) -> bool:
    leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)]
    return all(bool(jnp.all(jnp.isfinite(x))) for x in leaves)


def _single_device_target(item_dir: Path):
    """Restore target on the first local device (another topology)."""
    metadata = ocp.StandardCheckpointHandler().metadata(item_dir)
    tree = getattr(metadata, "tree", metadata)
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), tree)


def has_checkpoint(workdir: str | os.PathLike) -> bool:
    for sub in (LATEST_DIR, BEST_DIR):
        folder = Path(workdir) / sub
        if folder.is_dir() and any(p.name.isdigit() for p in folder.iterdir()):
            return True
    return False


def load_for_inference(workdir: str | os.PathLike, which: str = "best") -> tuple[Any, dict, str]:
    workdir = Path(workdir)
    if not workdir.is_dir():
        raise CheckpointError(f"workdir {workdir} does not exist")
    if not has_checkpoint(workdir):
        raise CheckpointError(f"no checkpoint in {workdir} (train first: python train.py ...)")
    with Checkpoints(workdir, read_only=True) as ckpts:
        if which == "best" and ckpts.best_step() is None:
            which = "latest"
        if which == "latest" and ckpts.latest_step() is None:
            raise CheckpointError(f"no latest checkpoint in {workdir / LATEST_DIR}")
        params, meta = ckpts.restore_params(which)
    if meta.get("version") != META_VERSION:
        raise CheckpointError(f"unsupported checkpoint meta version {meta.get('version')!r}")
    return params, meta, which
