"""Shared helpers of the kernel tests (tests/test_kernels_*.py): the Mosaic GPU modes, the
deviceless compiles and the persistent kernels' operands."""

from __future__ import annotations

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from rhhjax.kernels.layout import F32
from rhhjax.kernels.mosaic import interpret as gpu_interpret
from rhhjax.kernels.mosaic import persistent_backward as pb
from rhhjax.kernels.mosaic import persistent_forward as pf
from rhhjax.kernels.mosaic import persistent_slots as slots

KEEP = 0.7  # gate dropout's keep probability in the persistent kernels' operands


def mosaic_mode_skip(interpret: bool, references: bool = False) -> str | None:
    """Why the Mosaic GPU tests of a mode cannot run here, or None: compiled on a GPU only;
    interpreted where jax has GPU interpret mode, on a CPU (on a GPU the compiled class runs
    instead: a GPU minute is for the compiled kernels); references anywhere."""
    if references:
        return None
    if interpret:
        reason = gpu_interpret.unavailable()
        if reason is None and jax.default_backend() == "gpu":
            reason = "GPU interpret mode is the CPU's check; on a GPU the compiled class runs"
        return reason
    if jax.default_backend() != "gpu":
        return (
            "compiled Mosaic GPU kernels run on a Hopper GPU only (jax.default_backend() != 'gpu')"
        )
    return None


class MosaicGpuMode:
    """Base of the tests that run Mosaic GPU kernels, one class with a subclass per mode (the
    pattern of JAX's Pallas GPU tests): INTERPRET False, the kernels compiled (a Hopper GPU
    only); INTERPRET True, the same tests with the kernels executed in GPU interpret mode on
    a CPU, race detector on (jax >= 0.11.2); REFERENCES True (model tests), the kernels'
    pure-JAX references in their place. Each class skips, with the reason, where its mode
    cannot run. A class's ``CASES`` (argument name -> values) parametrizes its tests
    (`conftest.pytest_generate_tests`), so an interpreted subclass can run smaller shapes."""

    INTERPRET = False
    REFERENCES = False

    @pytest.fixture(autouse=True)
    def _mode(self, capsys):
        """Skips where the mode cannot run; interpreted, fails the test when the race
        detector reported a race that did not raise (jax 0.11.2 prints it and carries on)."""
        reason = mosaic_mode_skip(self.INTERPRET, self.REFERENCES)
        if reason is not None:
            pytest.skip(reason)
        yield
        if self.INTERPRET:
            printed = capsys.readouterr()
            assert RACE not in printed.out + printed.err, "the race detector reported a race"

    def interpret(self):
        """The kernels' ``interpret=``: GPU interpret mode's parameters, or None (compiled)."""
        return gpu_interpret.params() if self.INTERPRET else None


RACE = "RACE DETECTED"  # how GPU interpret mode's race detector reports a race


def _interpreter_memory_class():
    """The interpreter's shared-memory class, whose ``get_next_tma_thread_id`` hands each TMA
    copy its race-detector clock (private to jax: None where this jax has no such method)."""
    try:
        from jax._src.pallas.mosaic_gpu.interpret import shared_memory
    except ImportError:
        return None
    memory = getattr(shared_memory, "GPUSharedMemory", None)
    return memory if hasattr(memory, "get_next_tma_thread_id") else None


def assert_race_reported(run, capsys, monkeypatch) -> None:
    """``run()`` interprets a kernel in which the race detector must report a race: jax 0.12
    raises it (``on_race="raise"``), 0.11.2 prints it and carries on. Consumes the printed
    report (the mode's check after the test is for races nobody expected) and resets the
    interpreter's state, as jax asks after a kernel raised. Checks too that ``run`` issued
    no more TMA copies than the detector has clocks for them (`gpu_interpret.TMA_CLOCKS`
    where jax takes it): with fewer clocks, copies share them and whether a race shows
    depends on scheduling."""
    memory_class, copies = _interpreter_memory_class(), []
    if memory_class is not None:
        handout = memory_class.get_next_tma_thread_id
        counted = lambda memory: copies.append(1) or handout(memory)  # noqa: E731
        monkeypatch.setattr(memory_class, "get_next_tma_thread_id", counted)
    try:
        run()
    except Exception as error:  # the interpreter's error, raised through XLA's callback
        assert RACE in str(error), error
    else:
        assert RACE in capsys.readouterr().out, "the race detector reported no race"
    capsys.readouterr()
    gpu_interpret.reset_state()
    clocks = getattr(gpu_interpret.params(), "num_tma_threads_per_device", len(copies))
    assert len(copies) <= clocks, f"{len(copies)} TMA copies share the detector's {clocks} clocks"


def _has_cuda_plugin() -> bool:
    try:
        return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
    except ModuleNotFoundError:  # no jax_plugins package at all
        return False


# The deviceless H100 compiles (`-m gpu_compile`) need JAX's CUDA plugin.
needs_cuda = pytest.mark.skipif(
    not _has_cuda_plugin(), reason="no JAX CUDA plugin here (jax[cuda12])"
)


# --- the paper training step, compiled for an H100 in a fresh deviceless process -------------

_PAPER_STEP = """
rows = []
for dtype in {dtypes!r}:
    case = g.Case("hyperrhn", {impl!r}, dtype)
    mc, oc, seed, batch, seq_len = g.build_configs(case, {overrides!r})
    compiled, _ = g.compile_step(mc, oc, seed, batch, seq_len, g.h100_mesh())
    text = compiled.as_text()
    rows.append(dict(dtype=dtype, impl=mc.impl, mode=mc.pallas_mode, batch=batch,
                     seq_len=seq_len, hidden=mc.hidden, depth=mc.depth,
                     variant=mc.persistent.text(),
                     kernels={{name: text.count(name) for name in {kernels!r}}}))
print(json.dumps(rows))
"""


# What every deviceless compile script starts with: the compile-only H100 set up before jax
# starts (benchmarks/hlo/deviceless.py, as ``g``), ``sds`` (an abstract array on the H100 mesh) and
# ``lower_and_compile`` (the lowered text of a jitted function, compiled for an H100).
_DEVICELESS_PRELUDE = """
import json
from hlo import deviceless as g
g.set_deviceless_env(log_ptxas={log_ptxas})
import jax, jax.numpy as jnp
rep = jax.sharding.NamedSharding(g.h100_mesh(), jax.sharding.PartitionSpec())
def sds(shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=rep)
def lower_and_compile(f, *args):
    lowered = jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",))
    text = lowered.as_text()
    lowered.compile()
    return text
"""


# A compile script's lines that record every shared-memory allocation Mosaic GPU sizes (in
# ``allocated``, a list) and start ``rows``, its results.
SMEM_COUNTER = """
from jax.experimental.mosaic.gpu import core as mosaic_core
allocated = []
_size = mosaic_core._smem_tree_size
def _counted(tree):
    allocated.append(_size(tree))
    return allocated[-1]
mosaic_core._smem_tree_size = _counted
rows = []
"""


def compile_deviceless(
    body: str, cwd, dump_dir=None, log_ptxas: bool = True
) -> tuple[object, list[str]]:
    """Runs ``body`` (Python that prints one JSON line last) after the deviceless prelude
    (``g``, ``jax``, ``jnp``, ``json``, ``sds``, ``lower_and_compile``) in a fresh process:
    `run_deviceless`'s (JSON line, ptxas reports). ``log_ptxas``: XLA's own ptxas logging."""
    prelude = _DEVICELESS_PRELUDE.format(log_ptxas=log_ptxas)
    return run_deviceless(prelude + body, cwd, dump_dir)


def run_deviceless(code: str, cwd, dump_dir=None) -> tuple[object, list[str]]:
    """Runs ``code`` (Python that compiles for an H100 with benchmarks/hlo/deviceless.py's
    setup, importable as ``hlo``, and prints one JSON line last) in a fresh process of this
    interpreter in ``cwd``, with Mosaic GPU's ptxas reports dumped under ``dump_dir``
    (default ``cwd/ptxas``). Returns
    (that JSON line, parsed; the ptxas report of every Mosaic GPU kernel compiled, in
    file-name order)."""
    import json
    import os
    import pathlib
    import subprocess
    import sys

    from benchmark_scripts import BENCH

    dump = pathlib.Path(dump_dir or pathlib.Path(cwd) / "ptxas")
    dump.mkdir(exist_ok=True)
    env = dict(os.environ, MOSAIC_GPU_DUMP_PTXAS="1", MOSAIC_GPU_DUMP_TO=str(dump))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCH), env.get("PYTHONPATH")]))
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, env=env
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    return result, [path.read_text() for path in sorted(dump.glob("*.ptxas"))]


def compile_paper_step(
    impl: str, dtypes, kernels, tmp_path, setup: str = "", overrides: dict | None = None
) -> tuple[list[dict], list[str]]:
    """configs/ptb.py's HyperRHN training step (the trainer's jitted step, batch 256 x 100)
    with ``impl``, compiled for an H100 without a GPU in a fresh process (the CUDA plugin's
    venv), once per dtype, after the Python lines ``setup`` (e.g. a module switch), with the
    config ``overrides`` ({"model.persistent.stages": 6, ...}). Returns
    (one row per dtype: its sizes and how often each name of ``kernels`` occurs in the
    compiled HLO, the ptxas report of every Mosaic GPU kernel)."""
    body = _PAPER_STEP.format(
        impl=impl, dtypes=list(dtypes), kernels=list(kernels), overrides=overrides or {}
    )
    code = setup + "\n" + body
    return compile_deviceless(code, tmp_path)


def assert_no_spills(reports: list[str]) -> None:
    """Every ptxas report is for sm_90a and spills no register."""
    for report in reports:
        assert "for 'sm_90a'" in report and "0 bytes spill stores" in report, report


# ----------------------------------------------------------------------------- persistent kernels
# The persistent kernels' operands (kernels/mosaic/persistent_forward.py, _backward.py) at
# their padded sizes, shared by their test files (test_kernels_mosaic_persistent_forward.py
# and _forward_run.py, _backward.py and _backward_run.py); gate dropout keeps KEEP.


def forward_problem(seed, batch, width, steps, depth):
    """Fresh unpadded inputs: W [L, n, 2n], s0 [B, n], xproj [T, B, 2n], b [L, 2n], b_U [2n],
    z [T, L, B, n], keep [T, L, B, n] bool."""
    rng = np.random.default_rng(seed)

    def normal(*shape, scale=1.0):
        return jnp.asarray(rng.normal(size=shape) * scale, jnp.float32)

    return dict(
        w=normal(depth, width, 2 * width, scale=0.3),
        s0=normal(batch, width),
        xproj=normal(steps, batch, 2 * width, scale=0.5),
        b=normal(depth, 2 * width, scale=0.3),
        b_u=normal(2 * width, scale=0.3),
        z=1.0 + normal(steps, depth, batch, width, scale=0.3),
        keep=jnp.asarray(rng.random((steps, depth, batch, width)) < KEEP),
    )


def forward_operands(plan, prob, has_z, has_mask):
    """The kernel's padded operands (w_blk, s0, xproj, bias, z, mask) for `prob` (xproj [T,
    b_pad, 2, z_width] and z layer-major [L, T, b_pad, z_width]: units unpadded; mask uint8
    decisions)."""
    batch, n = prob["s0"].shape
    steps, depth = prob["xproj"].shape[0], prob["w"].shape[0]
    rows, cols = plan.b_pad - batch, plan.n_pad - n

    def halves(x):  # [..., 2n] -> [..., 2, n_pad]
        x = x.reshape(*x.shape[:-1], 2, n)
        return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, cols)])

    bias = halves(prob["b"]).at[0].add(halves(prob["b_u"]))  # [L, 2, n_pad]
    bias = jnp.broadcast_to(bias[:, None], (depth, plan.b_pad, 2, plan.n_pad))
    xproj = jnp.pad(halves(prob["xproj"]), [(0, 0), (0, rows), (0, 0), (0, 0)])
    xproj = xproj[..., : plan.z_width]

    def phase_major(x):  # [T, L, B, n] -> [P, b_pad, n_pad]
        return jnp.pad(x.reshape(steps * depth, batch, n), [(0, 0), (0, rows), (0, cols)])

    z = None
    if has_z:
        z = slots.scales_to_layer_major(phase_major(prob["z"]), steps, depth, plan.z_width)
    mask = phase_major(prob["keep"].astype(jnp.uint8)) if has_mask else None  # decisions
    w_blk = pf.forward_weights(plan, prob["w"], jnp.dtype(plan.dtype))
    s0 = jnp.pad(prob["s0"], [(0, rows), (0, cols)])
    return w_blk, s0, xproj, bias, z, mask


def forward_inputs(plan, packed, s_mm, steps, depth):
    """Each phase's input state [P, b_pad, n_pad] as the kernel saved it: packed row 0, or in
    f32 (`plan.state_in_packed` false) the A buffer's blocks in phase order, zero past k_pad."""
    if plan.state_in_packed:
        return packed[:, :, 0]
    return slots.a_buffer_to_inputs(s_mm, steps, depth, plan.n_pad)


def forward_gate_rows(plan, packed):
    """packed's rows after the input state [.., 2, n_pad]: h, tg, or with z full's halves."""
    return packed[..., int(plan.state_in_packed) :, :]


def pad_units(plan, x):
    """[..., z_width] (an unpadded operand) -> [..., n_pad] with zeros, as the kernel reads it."""
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, plan.n_pad - x.shape[-1])])


def pad_rows_and_units(plan, x):
    """[..., B, n] -> [..., b_pad, n_pad] with zeros."""
    lead = [(0, 0)] * (x.ndim - 2)
    return jnp.pad(x, [*lead, (0, plan.b_pad - plan.batch), (0, plan.n_pad - plan.width)])


def backward_case(seed, plan, steps, depth, z_on, mask_on):
    """Fresh random backward inputs at the true sizes, padded, phase-major [P = T * L, ...]:
    kernel_s [L, n, 2n]; g, s_prev, h, tg [P, Bp, n_pad]; full [P, Bp, 2, n_pad]; z, mask
    [P, Bp, n_pad] | None (mask: the f32 values 0 or 1/keep); keep bool and decisions uint8
    [P, Bp, n_pad] | None; z_op: z as the kernels read it, layer-major [L, T, Bp, z_width];
    bias [L, Bp, 2, n_pad] with z (else None). With z the gates are those of full, z and
    the bias (tanh(full_h * z + b_h), sigmoid(full_t * z + b_t)), as the kernel recomputes
    them; without z they are drawn on their own."""
    rng = np.random.default_rng(seed)
    phases, batch, n = steps * depth, plan.batch, plan.width

    def normal(*shape, scale=1.0):
        return jnp.asarray(rng.normal(size=shape) * scale, F32)

    kernel_s = normal(depth, n, 2 * n, scale=0.3)
    rows = lambda x: pad_rows_and_units(plan, x)  # noqa: E731
    g = rows(normal(phases, batch, n))
    s_prev = rows(normal(phases, batch, n))
    h = rows(jnp.tanh(normal(phases, batch, n)))
    tg = rows(jax.nn.sigmoid(normal(phases, batch, n)))
    full = jnp.stack([rows(normal(phases, batch, n)), rows(normal(phases, batch, n))], axis=2)
    z = rows(1.0 + normal(phases, batch, n, scale=0.3)) if z_on else None
    bias = None
    if z_on:  # broadcast over rows, as the forward's operand; the gates follow from full
        b = jnp.broadcast_to(normal(depth, 1, 2, n, scale=0.5), (depth, batch, 2, n))
        bias = jnp.pad(b, [(0, 0), (0, plan.b_pad - batch), (0, 0), (0, plan.n_pad - n)])
        a = full * z[:, :, None] + bias[jnp.arange(phases) % depth]
        h, tg = jnp.tanh(a[:, :, 0]), jax.nn.sigmoid(a[:, :, 1])
    keep = rows(jnp.asarray(rng.random((phases, batch, n)) < KEEP)) if mask_on else None
    mask = None if keep is None else keep.astype(F32) / KEEP
    decisions = None if keep is None else keep.astype(jnp.uint8)  # the kernels' operand
    z_op = None if z is None else slots.scales_to_layer_major(z, steps, depth, plan.z_width)
    return dict(
        kernel_s=kernel_s, g=g, s_prev=s_prev, h=h, tg=tg, full=full, z=z, mask=mask, keep=keep,
        decisions=decisions, z_op=z_op, bias=bias, plan=plan, steps=steps, depth=depth,
    )  # fmt: skip


def backward_packed(case):
    """The forward's saved rows [P, Bp, K, n_pad]: s_prev (not in f32: `plan.state_in_packed`),
    then h, tg or with z full's halves."""
    gates = [case["h"], case["tg"]]
    if case["z"] is not None:
        gates = [case["full"][:, :, 0], case["full"][:, :, 1]]
    return jnp.stack([case["s_prev"]] * case["plan"].state_in_packed + gates, axis=2)


def backward_a_buffer(case):
    """In f32 the forward's A buffer [P * Bp, k_pad], layer-major slots of s_prev (the
    backward reads the input states from it); None in bf16."""
    plan = case["plan"]
    if plan.state_in_packed:
        return None
    return slots.inputs_to_a_buffer(case["s_prev"], case["steps"], case["depth"], plan.k_pad)


def backward_rest(case):
    """The operands after packed: (z layer-major, the uint8 decisions, the bias, s_mm), each
    or None."""
    return case["z_op"], case["decisions"], case["bias"], backward_a_buffer(case)


def backward_reference(plan, case, dtype):
    wt = pb.backward_weights(plan, case["kernel_s"], dtype)
    outs = pb.persistent_backward_reference(
        plan, wt, case["g"], backward_packed(case), *backward_rest(case), keep=KEEP
    )
    return wt, outs


def pair_plans(case, **options) -> list:
    """A pair kernel test's case (dtype, batch, width, hyper_width, cols, hyper_cols,
    row_blocks, k_chunk, ...) -> the [main, hyper] plans at 2 stages with ``options``."""
    from rhhjax.kernels.mosaic.plan import PersistentPlan

    dtype, batch, width, hyper_width, cols, hyper_cols, row_blocks, k_chunk = case[:8]
    return [
        PersistentPlan(batch, n, dtype, c, row_blocks, k_chunk, 2, **options)
        for n, c in ((width, cols), (hyper_width, hyper_cols))
    ]


def assert_pair_matches(outs, expected, names, tol: float, blocks: int) -> None:
    """A pair kernel's outputs (persistent_pair{,_backward}.py) against its reference's: no
    block gave up, one status a block, every array of each field in ``names`` close."""
    assert not np.asarray(outs.status).any(), outs.status
    assert outs.status.shape == (blocks,)
    for name in names:
        got_all, want_all = (jax.tree.leaves(getattr(o, name)) for o in (outs, expected))
        for got, want in zip(got_all, want_all, strict=True):
            np.testing.assert_allclose(
                np.asarray(got, np.float32), np.asarray(want, np.float32), atol=tol, rtol=tol,
                err_msg=name,
            )  # fmt: skip
