"""Data parallelism: a 1-D device mesh (axis ``"data"``), shardings, multi-host helpers.
Batches split along their first axis over every device; parameters and optimizer state are
replicated, or split with ``train.fsdp``. Multi-host: docs/operations.md."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from rhhjax.errors import UserError

DATA_AXIS = "data"
ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"


class ParallelError(UserError):
    """A user-facing problem with the device / process setup; the message is one line."""


def maybe_initialize_distributed(enabled: bool = False) -> bool:
    """``jax.distributed.initialize()`` once when ``enabled`` or ``$JAX_COORDINATOR_ADDRESS`` is
    set, before any backend starts; returns whether jax runs distributed."""
    if jax.distributed.is_initialized():
        return True
    if not (enabled or os.environ.get(ENV_COORDINATOR)):
        return False
    kwargs = {}
    for key, env in (("num_processes", ENV_NUM_PROCESSES), ("process_id", ENV_PROCESS_ID)):
        value = os.environ.get(env, "").strip()
        if value:
            if not value.isdigit():
                raise ParallelError(f"{env}={value!r} must be a non-negative integer")
            kwargs[key] = int(value)
    try:
        jax.distributed.initialize(**kwargs)
    except (RuntimeError, ValueError) as e:
        raise ParallelError(
            f"jax.distributed.initialize() failed: {' '.join(str(e).split())} (set "
            f"{ENV_COORDINATOR}=host:port, JAX_NUM_PROCESSES and JAX_PROCESS_ID, or run under "
            f"a cluster jax detects)"
        ) from None
    return True


def is_primary() -> bool:
    """Whether this process (0) writes logs, metrics and results."""
    return jax.process_index() == 0


def assert_same_across_processes(text: str, what: str = "config") -> None:
    """Raise ParallelError (on every process) unless ``text`` is identical on all processes."""
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils

    digest = np.frombuffer(hashlib.sha256(text.encode()).digest(), dtype=np.int32).copy()
    every = np.asarray(multihost_utils.process_allgather(digest)).reshape(jax.process_count(), -1)
    differ = [i for i in range(len(every)) if not np.array_equal(every[i], every[0])]
    if differ:
        raise ParallelError(
            f"the {what} differs between processes (process {differ[0]} vs process 0): run "
            f"the same command with the same files on every host"
        )


def sync(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def make_mesh(devices=None) -> Mesh:
    """A 1-D mesh with axis ``"data"`` over ``devices`` (default: all, by process)."""
    devices = jax.devices() if devices is None else list(devices)
    return Mesh(np.asarray(devices), (DATA_AXIS,))


def check_batch_divisible(name: str, batch_size: int, mesh: Mesh) -> None:
    n = mesh.size
    if batch_size % n:
        lower, upper = (batch_size // n) * n, -(-batch_size // n) * n
        hint = f"{lower} or {upper}" if lower else f"{upper}"
        raise ParallelError(
            f"{name}={batch_size} does not divide by the {n} devices ({jax.process_count()} "
            f"process(es)); use a multiple of {n}, e.g. {hint}"
        )


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P(DATA_AXIS))


def state_spec(shape: tuple[int, ...], n_devices: int, fsdp: bool) -> P:
    """Replicated, or (``fsdp``) split along the largest axis divisible by ``n_devices``."""
    if not fsdp or n_devices == 1:
        return P()
    axes = [i for i in range(len(shape)) if shape[i] % n_devices == 0 and shape[i] >= n_devices]
    if not axes:
        return P()
    axis = max(axes, key=lambda i: (shape[i], -i))
    return P(*([None] * axis + [DATA_AXIS]))


def state_shardings(tree: Any, mesh: Mesh, fsdp: bool = False) -> Any:
    return jax.tree.map(
        lambda x: NamedSharding(mesh, state_spec(np.shape(x), mesh.size, fsdp)), tree
    )


def constrain_state(tree: Any, mesh: Mesh, fsdp: bool = False) -> Any:
    return jax.lax.with_sharding_constraint(tree, state_shardings(tree, mesh, fsdp))


def constrain_batch(tree: Any, mesh: Mesh) -> Any:
    return jax.lax.with_sharding_constraint(tree, batch_sharding(mesh))


def constrain_replicated(tree: Any, mesh: Mesh) -> Any:
    return jax.lax.with_sharding_constraint(tree, replicated(mesh))


def _from_global(x, sharding: NamedSharding) -> jax.Array:
    x = np.asarray(x)
    if jax.process_count() == 1:
        return jax.device_put(x, sharding)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def put_state(tree: Any, mesh: Mesh, fsdp: bool = False) -> Any:
    shardings = state_shardings(tree, mesh, fsdp)
    if jax.process_count() == 1:
        return jax.device_put(tree, shardings)
    return jax.tree.map(_from_global, tree, shardings)


def put_replicated(x, mesh: Mesh) -> jax.Array:
    return _from_global(x, replicated(mesh))


def host_rows(global_batch: int, mesh: Mesh) -> slice:
    index_map = batch_sharding(mesh).addressable_devices_indices_map((global_batch,))
    starts = [idx[0].indices(global_batch)[:2] for idx in index_map.values()]
    lo, hi = min(s for s, _ in starts), max(e for _, e in starts)
    if hi - lo != global_batch // mesh.size * len(starts):
        raise ParallelError("this process's devices do not hold a contiguous block of rows")
    return slice(lo, hi)


def shard_batch(tree: Any, mesh: Mesh) -> Any:
    """Global host batches -> arrays split over ``"data"`` (each process its own rows)."""
    sharding = batch_sharding(mesh)

    def put(x):
        x = np.asarray(x)
        if jax.process_count() == 1:
            return jax.device_put(x, sharding)
        local = x[host_rows(x.shape[0], mesh)]
        return jax.make_array_from_process_local_data(sharding, local, x.shape)

    return jax.tree.map(put, tree)


def put_scalars(values: tuple, mesh: Mesh) -> tuple:
    """Host scalars for a jitted step (replicated global arrays on several processes)."""
    if jax.process_count() == 1:
        return tuple(values)
    return tuple(put_replicated(v, mesh) for v in values)


def on_mesh(tree: Any, mesh: Mesh) -> bool:
    leaves = jax.tree.leaves(tree)
    return all(
        isinstance(x, jax.Array)
        and isinstance(x.sharding, NamedSharding)
        and x.sharding.mesh == mesh
        for x in leaves
    )
