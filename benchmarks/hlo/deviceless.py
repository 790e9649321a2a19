"""Compiling the real training step for an H100 without a GPU (the compile report's first job).

The deviceless route: JAX's CUDA plugin, a compile-only H100 topology
(``jax.experimental.topologies``) and ``.lower(lowering_platforms=("cuda",))`` of
``rhhjax.train.step.make_train_step``. Needs the CUDA plugin
(``pip install "jax[cuda12]"``); ``set_deviceless_env`` must run before JAX initialises.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import tempfile
import time

from rhhjax.kernels.hardware import H100, Gpu

from rhhjax.errors import UserError

IMPLS = ("scan", "fused")  # the default rows
# Selectable with --impls but not in the default rows (not measured on a GPU yet).
IMPL_CHOICES = (*IMPLS, "mosaic", "persistent")
DTYPES = ("float32", "bfloat16")
MODELS = ("rhn", "hyperrhn")
VOCAB = 50  # PTB characters (configs/ptb.py: model.vocab_size, set from the data)


def target_config(gpu: Gpu = H100) -> str:
    """``gpu`` as XLA's GpuTargetConfigProto text (a compile-only topology's device)."""
    major, minor = gpu.compute_capability
    return f"""\
gpu_device_info {{
  threads_per_block_limit: {gpu.threads_per_block}
  threads_per_warp: {gpu.threads_per_warp}
  shared_memory_per_block: {gpu.smem_per_block}
  shared_memory_per_core: {gpu.smem_per_sm}
  threads_per_core_limit: {gpu.threads_per_sm}
  core_count: {gpu.sms}
  fpus_per_core: {gpu.fpus_per_sm}
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {gpu.hbm_bytes_per_s}
  l2_cache_size: {gpu.l2_bytes}
  clock_rate_ghz: {gpu.clock_ghz}
  device_memory_size: {gpu.hbm_bytes}
  shared_memory_per_block_optin: {gpu.smem_per_block_optin}
  cuda_compute_capability {{ major: {major} minor: {minor} }}
  registers_per_core_limit: {gpu.registers_per_sm}
  registers_per_block_limit: {gpu.registers_per_block}
}}
platform_name: "CUDA"
device_description_str: "{gpu.device_kind}"
"""


H100_TARGET_CONFIG = target_config(H100)


class ReportError(UserError):
    """Bad input or a missing CUDA plugin; the message is one line."""


# ----------------------------------------------------------------------------- environment


def set_deviceless_env(dump_dir: str | None = None, log_ptxas: bool = True) -> None:
    """Environment for compiling for CUDA without a GPU; call before importing jax."""
    os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] = "1"
    os.environ["CUDA_VISIBLE_DEVICES"] = "-1"  # else the plugin's init fails on cuInit
    if log_ptxas:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"  # XLA's ptxas warnings (spills)
    if dump_dir:
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = f"{flags} --xla_dump_to={dump_dir}".strip()


def cuda_plugin_available() -> tuple[bool, str]:
    """(True, "") if jax's CUDA plugin is importable here, else (False, why)."""
    try:
        import jax_plugins.xla_cuda12  # noqa: F401
    except ImportError as e:
        return False, f"the JAX CUDA plugin is not installed ({e}); pip install 'jax[cuda12]'"
    return True, ""


def h100_mesh():
    """A 1-device mesh (axis "data") on a compile-only H100."""
    import jax
    from jax.experimental import topologies

    topo = topologies.get_topology_desc(
        platform="cuda", target_config=H100_TARGET_CONFIG, topology="1x1x1"
    )
    return jax.sharding.Mesh(topo.devices, ("data",))


def lowering_device(mesh, gpu: Gpu = H100):
    """Context naming ``gpu`` as the abstract device of ``mesh``'s axes, around a trace and
    lowering for CUDA on ``mesh`` (`h100_mesh`): Pallas kernels of jax >= 0.11 read the GPU's
    compute capability from the abstract mesh's device. Wrap the trace as well as the
    lowering."""
    import jax

    device = jax.sharding.AbstractDevice(
        device_kind=gpu.device_kind, num_cores=gpu.sms, platform="gpu"
    )
    abstract = jax.sharding.AbstractMesh(
        mesh.axis_sizes, mesh.axis_names, axis_types=mesh.axis_types, abstract_device=device
    )
    return jax.sharding.use_abstract_mesh(abstract)


@contextlib.contextmanager
def capture_fd2():
    """Captures the process's stderr (C++ logs included) into a list of one string."""
    out: list[str] = [""]
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield out
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            out[0] = tmp.read().decode(errors="replace")


# ----------------------------------------------------------------------------- configs


@dataclasses.dataclass(frozen=True)
class Case:
    """One row: model x impl x dtype x hyper rank."""

    model: str
    impl: str
    dtype: str
    rank: int = 0

    @property
    def label(self) -> str:
        rank = f" r{self.rank}" if self.model == "hyperrhn" else ""
        return f"{self.model}{rank} {self.impl} {self.dtype}"


def cases(models, impls, dtypes, ranks) -> list[Case]:
    out = []
    for model in models:
        for rank in ranks if model == "hyperrhn" else (0,):
            for impl in impls:
                for dtype in dtypes:
                    out.append(Case(model, impl, dtype, rank))
    return out


def build_configs(case: Case, overrides: dict):
    """(ModelConfig, OptimizerConfig, seed, batch, seq_len) from configs/ptb.py.

    Raises models.ConfigError / train.config.TrainError (one line) for an invalid combination.
    """
    from rhhjax import configs, models
    from rhhjax.train import config as train_config
    from rhhjax.train import optim

    config = configs.load("ptb:rhn" if case.model == "rhn" else "ptb:")
    config.model.impl = case.impl
    config.model.dtype = case.dtype
    config.model.hyper_rank = case.rank
    for key, value in overrides.items():  # "model.persistent.stages": 6
        *path, name = key.split(".")
        section = config
        for part in path:
            section = section[part]
        section[name] = value
    config.model.pallas_mode = "compiled"
    cfg = train_config.prepare_config(config)
    mc = models.ModelConfig.from_config(cfg.model, vocab_size=VOCAB)
    oc = optim.OptimizerConfig.from_config(cfg.train, 1)
    return mc, oc, int(cfg.seed), int(cfg.train.batch_size), int(cfg.train.seq_len)


def abstract_args(mc, oc, batch: int, seq_len: int, mesh):
    """ShapeDtypeStructs of the train step's arguments (``step_inputs``), replicated on
    ``mesh``."""
    import jax

    from rhhjax.train.step import step_inputs

    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    args = step_inputs(mc, oc, batch, seq_len, abstract=True)
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep), args)


def compile_step(mc, oc, seed: int, batch: int, seq_len: int, mesh, options=None):
    """The trainer's jitted step compiled for the mesh's CUDA device -> (compiled, seconds).

    ``options``: XLA debug options for this compile (e.g. ``{"xla_dump_to": dir}``)."""
    from rhhjax.train import step as train_step

    step = train_step.make_train_step(mc, oc, seed)
    args = abstract_args(mc, oc, batch, seq_len, mesh)
    t0 = time.perf_counter()
    with lowering_device(mesh):
        lowered = step.trace(*args).lower(lowering_platforms=("cuda",))
    compiled = lowered.compile(compiler_options=options or {})
    return compiled, time.perf_counter() - t0
