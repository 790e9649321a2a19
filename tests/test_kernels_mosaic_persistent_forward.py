"""The persistent whole-sequence forward kernel (`kernels/mosaic/persistent_forward.py`).

On a CPU: its reference against the highway recurrence of `ops.cells` and against the
schedule emulation tests/persistent_schedule.py (states and the saved rows in
`loops.pack`'s layout), the A buffer and status outputs, the weight layout, the plan's new
checks and its shared-memory count, one-line errors. ``gpu_compile``: the kernel lowers and
compiles for an H100 without a GPU, allocating exactly ``plan.smem_bytes(...)`` (needs the
JAX CUDA plugin). `TestCompiled`: the kernel against its reference, on a GPU only;
`TestInterpret`: the same tests with the kernel executed in GPU interpret mode on a CPU, race
detector on (jax >= 0.11.2; one block, and clusters of 2, 8 and 16 blocks meeting at a cluster
barrier), and a kernel without its barrier between phases reported as a race."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import persistent_schedule
import pytest
from kernel_cases import (
    MosaicGpuMode,
    assert_no_spills,
    assert_race_reported,
    compile_deviceless,
    needs_cuda,
)
from rhhjax.kernels.hardware import H100
from rhhjax.kernels.mosaic import forward as mf
from rhhjax.kernels.mosaic import grid_barrier, keep_mask, persistent_cell
from rhhjax.kernels.mosaic import interpret as gpu_interpret
from rhhjax.kernels.mosaic import persistent_forward as pf
from rhhjax.kernels.mosaic import persistent_slots as slots
from rhhjax.kernels.mosaic import plan as pp

from rhhjax.ops import cells, loops, persistent

TOLERANCE = {"float32": 1e-5, "bfloat16": 1e-5}
KEEP = 0.7


def _problem(seed, batch, width, steps, depth):
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


def _operands(plan, prob, has_z, has_mask):
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


def _inputs(plan, packed, s_mm, steps, depth):
    """Each phase's input state [P, b_pad, n_pad] as the kernel saved it: packed row 0, or in
    f32 (`plan.state_in_packed` false) the A buffer's blocks in phase order, zero past k_pad."""
    if plan.state_in_packed:
        return packed[:, :, 0]
    return slots.a_buffer_to_inputs(s_mm, steps, depth, plan.n_pad)


def _gate_rows(plan, packed):
    """packed's rows after the input state [.., 2, n_pad]: h, tg, or with z full's halves."""
    return packed[..., int(plan.state_in_packed) :, :]


def _padded(plan, x):
    """[..., z_width] (an unpadded operand) -> [..., n_pad] with zeros, as the kernel reads it."""
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, plan.n_pad - x.shape[-1])])


def _cells_forward(prob, dtype, has_z, has_mask, inputs):
    """Each phase's micro-layer with `ops.cells` on unpadded arrays, from the given input
    state of every phase ``inputs`` [P, B, n] (so that one bf16 rounding flip does not
    propagate): (states [P, B, n], packed [P, B, 3, n] built by `loops.pack` with
    `persistent.saved_rows`: the gates, or with z full alone)."""
    depth, n = prob["w"].shape[0], prob["s0"].shape[1]
    states, packed = [], []
    for p, s in enumerate(inputs):
        t, layer = divmod(p, depth)
        full = cells.matmul(s, prob["w"][layer], jnp.dtype(dtype))
        if layer == 0:
            full = full + prob["xproj"][t]
        z = cells.double(prob["z"][t, layer]) if has_z else 1.0
        a = full * z + prob["b"][layer] + (prob["b_u"] if layer == 0 else 0.0)
        mask = prob["keep"][t, layer] / KEEP if has_mask else None
        saved = {"h": jnp.tanh(a[:, :n]), "t": cells.transform_gate(a)}
        if has_z:
            saved["full"] = full.reshape(s.shape[0], 2, n)
        packed.append(loops.pack(s, saved, persistent.saved_rows(has_z)))
        states.append(cells.highway_gate(a, s, mask))
    return jnp.stack(states), jnp.stack(packed)


CASES = [  # (dtype, batch, width, col_blocks, row_blocks, k_chunk, steps, depth)
    ("float32", 64, 64, 4, 1, 32, 3, 1),
    ("bfloat16", 64, 64, 4, 1, 32, 2, 3),
    ("float32", 100, 37, 3, 2, 16, 2, 3),  # odd: padded rows and units, two row blocks
    ("bfloat16", 70, 112, 7, 1, 16, 3, 2),
]


@pytest.mark.parametrize(("has_z", "has_mask"), [(True, True), (False, False), (True, False)])
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[2]}-L{c[7]}" for c in CASES])
def test_reference_is_the_highway_recurrence_with_the_ops_saved_rows(case, has_z, has_mask):
    """States, the saved rows (input state, then h, t or with z full) in `loops.pack`'s
    layout of `persistent.saved_rows`, the A
    buffer (s0 then every state, in the matmul dtype, K columns, in layer-major slots) and
    a zero status; with
    save, the states output is the last state only (the others are packed row 0)."""
    dtype, batch, width, cols, row_blocks, k_chunk, steps, depth = case
    plan = pp.PersistentPlan(batch, width, dtype, cols, row_blocks, k_chunk)
    plan.check()
    prob = _problem(batch + width + depth, batch, width, steps, depth)
    ops = _operands(plan, prob, has_z, has_mask)
    s_last, packed, s_mm, status = pf.persistent_forward_reference(plan, *ops, save=True, keep=KEEP)
    unsaved = pf.persistent_forward_reference(plan, *ops, save=False, keep=KEEP)
    assert len(unsaved) == 3
    states = unsaved[0]
    phases = steps * depth
    assert states.shape == (phases, plan.b_pad, plan.n_pad)
    assert s_last.shape == (1, plan.b_pad, plan.n_pad)
    np.testing.assert_array_equal(s_last[0], states[-1])
    assert packed.shape == (phases, plan.b_pad, plan.packed_rows, plan.n_pad)
    # Each phase starts from the state the last one ended with (s0 first), exactly.
    inputs = _inputs(plan, packed, s_mm, steps, depth)[:, :batch, :width]
    np.testing.assert_array_equal(inputs[0], prob["s0"])
    np.testing.assert_array_equal(inputs[1:], states[:-1, :batch, :width])
    want_states, want_packed = _cells_forward(prob, dtype, has_z, has_mask, inputs)
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(states[:, :batch, :width], want_states, rtol=tol, atol=tol)
    got = _gate_rows(plan, packed)[:, :batch, :, :width]
    np.testing.assert_allclose(got, want_packed[:, :, 1:], rtol=tol, atol=tol)  # row 0: inputs
    # Padded units stay zero.
    assert not np.asarray(states[:, :, width:]).any()
    s_all = jnp.concatenate([ops[1][None], states], axis=0)[..., : plan.k_pad]
    assert s_mm.dtype == jnp.dtype(dtype)
    assert s_mm.shape == (phases * plan.b_pad, plan.k_pad)
    s_all = slots.to_slots(s_all[:-1], steps, depth)  # every phase's input, layer-major
    np.testing.assert_array_equal(s_mm, s_all.astype(dtype).reshape(-1, plan.k_pad))
    assert status.shape == (plan.grid,) and not np.asarray(status).any()
    # Without save: the same A buffer.
    np.testing.assert_array_equal(unsaved[1], s_mm)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_reference_phases_match_the_schedule_emulation(dtype):
    """Every phase gives the same state and saved full as `persistent_schedule`'s
    `forward_phase` (which sums the K chunks one by one) from the same input state, on the
    same plan, with z and gate dropout; the gates recomputed from full (`mosaic_forward.gates`,
    as the backward kernel does) are its gates."""
    batch, width, steps, depth = 64, 96, 3, 2
    plan = pp.PersistentPlan(batch, width, dtype, col_blocks=6, k_chunk=32)
    prob = _problem(3, batch, width, steps, depth)
    w_blk, s0, xproj, bias, z_lt, mask = _operands(plan, prob, True, True)
    ops = (plan, w_blk, s0, xproj, bias, z_lt, mask)
    z = slots.scales_to_phase_major(z_lt, plan.n_pad)
    _, packed, s_mm, _ = pf.persistent_forward_reference(*ops, save=True, keep=KEEP)
    inputs = _inputs(plan, packed, s_mm, steps, depth)
    states = pf.persistent_forward_reference(*ops, save=False, keep=KEEP)[0]
    w_blocks = persistent_schedule.forward_weights(plan, prob["w"], jnp.dtype(dtype))
    tol = 1e-5
    for p in range(steps * depth):
        t, layer = divmod(p, depth)
        s_new, saved = persistent_schedule.forward_phase(
            plan, KEEP, jnp.dtype(dtype), inputs[p], w_blocks[layer], z[p],
            bias[layer, 0], _padded(plan, xproj[t]) if layer == 0 else None, mask[p] > 0,
        )  # fmt: skip
        np.testing.assert_allclose(states[p], s_new, rtol=tol, atol=tol)
        full = _gate_rows(plan, packed[p])
        np.testing.assert_allclose(full, saved["u"], rtol=tol, atol=tol)
        b = dict(z=z[p], b_h=bias[layer, :, 0], b_t=bias[layer, :, 1])
        h, tg = mf.gates(full[:, 0], full[:, 1], b)
        np.testing.assert_allclose(h, saved["h"], rtol=tol, atol=tol)
        np.testing.assert_allclose(tg, saved["t"], rtol=tol, atol=tol)


def test_forward_weights_are_each_layers_block_major_transpose():
    """Rows (l * C + g) * 2u + j hold W_l's h-column g * u + j, then the t-columns; zero past
    the width in both K and units."""
    plan = pp.PersistentPlan(batch=64, width=37, dtype="float32", col_blocks=4, k_chunk=16)
    u, n = plan.units_per_block, 37
    w = _problem(1, 8, n, 1, 3)["w"]
    w_blk = np.asarray(pf.forward_weights(plan, w, jnp.float32))
    assert w_blk.shape == (3 * 2 * plan.n_pad, plan.k_pad)
    for layer, g in [(0, 0), (1, 2), (2, 3)]:
        base = (layer * plan.col_blocks + g) * 2 * u
        for j in range(u):
            unit = g * u + j
            for half in (0, 1):
                row = w_blk[base + half * u + j]
                if unit < n:
                    np.testing.assert_array_equal(row[:n], w[layer][:, half * n + unit])
                else:
                    assert not row.any()
                assert not row[n:].any()
    bf16 = pf.forward_weights(plan, w, jnp.bfloat16)
    assert bf16.dtype == jnp.bfloat16
    np.testing.assert_array_equal(bf16, jnp.asarray(w_blk).astype(jnp.bfloat16))


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        (pp.PersistentPlan(64, 184, col_blocks=23), "k_pad 192 > n_pad 184"),
        (pp.PersistentPlan(64, 64, col_blocks=20), "not a multiple of k_chunk"),
        (pp.PersistentPlan(64, 48, col_blocks=4, k_chunk=16), "multiple of 16 B"),
    ],
)
def test_unsuitable_plans_are_one_line_errors_before_any_work(plan, message):
    prob = _problem(0, plan.batch, plan.width, 1, 1)
    with pytest.raises(pp.PlanError, match=message) as e:
        ops = _operands(plan, prob, False, False)
        pf.persistent_forward_reference(plan, *ops, save=False)
    assert "\n" not in str(e.value)


def test_operands_of_the_wrong_shape_or_dtype_are_one_line_errors():
    plan = pp.PersistentPlan(64, 64, "bfloat16", col_blocks=8, k_chunk=32)
    ops = list(_operands(plan, _problem(0, 64, 64, 2, 2), True, False))
    with pytest.raises(pp.PlanError, match=r"s0 is float32\[64, 32\], expected") as e:
        pf.persistent_forward(plan, ops[0], ops[1][:, :32], *ops[2:], save=True)
    assert "\n" not in str(e.value)
    with pytest.raises(pp.PlanError, match="w_blk is float32"):
        pf.persistent_forward_reference(plan, ops[0].astype(jnp.float32), *ops[1:], save=True)
    with pytest.raises(
        pp.PlanError, match=r"z is float32\[2, 2, 64, 8\], expected float32\[2, 2, 64, 64\]"
    ):
        pf.persistent_forward(plan, *ops[:4], ops[4][..., :8], save=True)


def test_staging_slots_reuse_per_phase_inputs_and_never_x_u():
    """Saved rows overwrite inputs loaded every phase (b, z), never x U (kept across a
    step's layers); every option set stays within 5 f32 tiles; the mask is not an f32 tile."""
    for has_z in (False, True):
        ins = pp.forward_inputs(has_z)
        assert "mask" not in ins
        for save in (False, True):
            slots, where = pp.forward_staging_slots(has_z, save)
            assert len(where) == len(pp.forward_saved_rows(save, has_z))
            assert len(set(where)) == len(where) and all(s < slots for s in where)
            assert not {ins.index("x_h"), ins.index("x_t")} & set(where)
            assert slots <= 5
    assert pp.forward_staging_slots(True, True) == (5, (0, 1))


def test_a_mask_costs_one_mbarrier_and_no_shared_memory_tile():
    """The uint8 mask tile shares the cast's buffer: with a mask the allocation grows by
    one 8-byte mbarrier only (it was a 16 KiB f32 tile at the paper's 4 x 16 plan)."""
    plan = pp.PersistentPlan(256, 1000, "bfloat16", col_blocks=16, row_blocks=4, stages=3)
    for has_z in (False, True):
        for save in (False, True):
            without = plan.smem_bytes(has_z, has_mask=False, save=save)
            assert plan.smem_bytes(has_z, has_mask=True, save=save) == without + 8


def test_a_mask_needs_sixteen_byte_tma_rows_in_one_line():
    """A plan of 8 units a block cannot TMA-load its uint8 mask tile (8 B rows): refused
    in one line before any work; without a mask the same plan runs."""
    plan = pp.PersistentPlan(64, 64, "float32", col_blocks=8, k_chunk=32)
    prob = _problem(2, 64, 64, 1, 2)
    ops = _operands(plan, prob, True, True)
    with pytest.raises(pp.PlanError, match="multiple of 16") as e:
        pf.persistent_forward_reference(plan, *ops, save=True, keep=KEEP)
    assert "\n" not in str(e.value)
    pf.persistent_forward_reference(plan, *ops[:-1], None, save=True)
    with pytest.raises(pp.PlanError, match=r"mask is float32\[2, 64, 64\], expected uint8"):
        wide = pp.PersistentPlan(64, 64, "float32", col_blocks=4, k_chunk=32)
        wide_ops = _operands(wide, prob, True, True)
        pf.persistent_forward(wide, *wide_ops[:-1], wide_ops[-1] / KEEP, save=True)


def test_paper_plan_shared_memory_fits_at_four_stages():
    """The paper plan's kernel allocation (every option) fits 227 KiB at the default 4
    stages in bf16; f32 needs 2 (the count equals Mosaic GPU's: see the gpu_compile test)."""
    plan = pp.paper_plan("bfloat16")
    assert plan.stages == 4
    rows, u, kb = 256, 8, 1024
    expected = (4 * rows * 64 * 2 + 4 * 2 * u * 64 * 2 + rows * u * 4 + rows * 2 * u * 4
                + 5 * rows * u * 4 + rows * u * 2 + 8 * (4 + 6))  # fmt: skip
    assert expected % kb == 80  # every buffer here is a whole number of KiB
    assert plan.smem_bytes() == expected == 208_976 <= H100.smem_per_block_optin
    assert plan.smem_bytes(has_z=False, has_mask=False, save=False) == 208_976 - 8192 - 16
    f32 = pp.paper_plan("float32", stages=2)
    f32.check()
    assert f32.smem_bytes() == 213_056


# The compile scripts' prelude: imports, and every shared-memory allocation Mosaic GPU sizes.
_SMEM_COUNTER = """
from jax.experimental.mosaic.gpu import core as mosaic_core
from rhhjax.kernels.mosaic import persistent_forward as pf
from rhhjax.kernels.mosaic.plan import PersistentPlan
allocated = []
_size = mosaic_core._smem_tree_size
def _counted(tree):
    allocated.append(_size(tree))
    return allocated[-1]
mosaic_core._smem_tree_size = _counted
rows = []
"""

_COMPILE = (
    _SMEM_COUNTER
    + """
for fields, steps, depth, has_z, has_mask, save in {cases!r}:
    plan = PersistentPlan(*fields)
    phases, b, n, k = steps * depth, plan.b_pad, plan.n_pad, plan.k_pad
    opt = lambda on, dtype=jnp.float32: sds((phases, b, n), dtype) if on else None
    args = (sds((depth * 2 * n, k), jnp.dtype(plan.dtype)), sds((b, n), jnp.float32),
            sds((steps, b, 2, plan.z_width), jnp.float32), sds((depth, b, 2, n), jnp.float32),
            sds((depth, steps, b, plan.z_width), jnp.float32) if has_z else None,
            opt(has_mask, jnp.uint8))
    f = lambda *a: pf.persistent_forward(plan, *a, save=save, keep=0.75)
    allocated.clear()
    text = lower_and_compile(f, *args)
    marks = ("mosaic_gpu", "persistent_highway_forward", "red.release.gpu", "ld.acquire",
             "fence.proxy.async.global")
    rows.append({{"marks": [m in text for m in marks], "smem": list(allocated),
                  "plan_smem": plan.smem_bytes(has_z, has_mask, save)}})
print(json.dumps(rows))
"""
)


@pytest.mark.gpu_compile
@needs_cuda
def test_kernel_lowers_and_compiles_for_an_h100_without_a_gpu(tmp_path):
    """`plan_for`'s paper plan (bf16, 4 x 16, 3 stages, with z and the uint8 mask), the f32
    132-block plan (2 stages), the 4 x 33 split and a small odd f32 plan, deviceless in a
    fresh process: the barrier is in the kernel, and the shared memory Mosaic GPU allocates
    is ``plan.smem_bytes`` for the options. T is only a loop bound:
    3 steps. keep 0.75 (at keep 1, a mask that drops nothing and that the model never
    passes, ptxas spills 8 bytes at the 4 x 16 plan: the constant 1 folds away and the
    register schedule changes; 255 registers either way)."""
    cases = [
        ((256, 1000, "bfloat16", 16, 4, 64, 3), 3, 7, True, True, True),  # plan_for's
        ((256, 1000, "float32", 132, 1, 64, 2), 3, 2, False, False, False),
        ((256, 1000, "bfloat16", 33, 4), 3, 2, True, False, True),
        ((100, 37, "float32", 3, 2, 16, 2), 3, 3, False, True, True),
    ]
    code = _COMPILE.format(cases=cases)
    rows, reports = compile_deviceless(code, tmp_path, log_ptxas=False)
    assert len(rows) == len(cases)
    for row in rows:
        assert all(row["marks"]), row
        assert row["smem"] == [row["plan_smem"]], row
    # ptxas compiled every kernel for sm_90a, without register spills.
    assert len(reports) == len(cases), len(reports)
    assert_no_spills(reports)


_COMPILE_HYPER = (
    _SMEM_COUNTER
    + """
for fields, hyper_fields, steps, depth, save in {cases!r}:
    plan, hp = (PersistentPlan(*f[:-1], units=f[-1]) for f in (fields, hyper_fields))
    phases, b, n, k = steps * depth, plan.b_pad, plan.n_pad, plan.k_pad
    mm = jnp.dtype(plan.dtype)
    def cell(p):
        return (sds((depth * 2 * p.n_pad, p.k_pad), mm), sds((b, p.n_pad), jnp.float32),
                sds((steps, b, 2, p.z_width), jnp.float32),
                sds((depth, b, 2, p.n_pad), jnp.float32),
                sds((phases, b, p.n_pad), jnp.uint8))
    w, s0, x, bias, mask = cell(plan)
    hw, hs0, hx, hbias, hmask = cell(hp)
    extra = (sds((depth * n, hp.k_pad), mm), sds((depth, b, n), jnp.float32))
    def f(w, s0, x, bias, mask, hw, hs0, hx, hbias, hmask, proj, pbias):
        hyper = pf.HyperInside(hp, hw, hs0, hx, hbias, hmask, proj, pbias)
        return pf.persistent_forward(plan, w, s0, x, bias, None, mask, save=save, keep=0.75,
                                     hyper=hyper)
    allocated.clear()
    text = lower_and_compile(f, w, s0, x, bias, mask, hw, hs0, hx, hbias, hmask, *extra)
    marks = ("mosaic_gpu", "persistent_hyper_highway_forward", "red.release.gpu")
    rows.append({{"marks": [m in text for m in marks], "smem": list(allocated),
                  "plan_smem": plan.smem_bytes(True, True, save, hyper=hp)}})
print(json.dumps(rows))
"""
)


@pytest.mark.gpu_compile
@needs_cuda
def test_kernel_with_the_hyper_cell_inside_compiles_for_an_h100_without_a_gpu(tmp_path):
    """The hyper cell inside at the paper's sizes (n 1000, h 128, batch 256; hyper 4 x 8
    blocks of 16 units inside the main 4 x 16 bf16 plan at 2 stages, the 4 x 32 f32 plan at
    3), deviceless in a fresh process: the shared memory Mosaic GPU allocates is
    ``plan.smem_bytes(hyper=...)``, within the H100's, and ptxas does not spill."""
    cases = [
        ((256, 1000, "bfloat16", 16, 4, 64, 2, None), (256, 128, "bfloat16", 8, 4, 64, 2, 16),
         3, 7, True),
        ((256, 1000, "float32", 32, 4, 64, 3, None), (256, 128, "float32", 8, 4, 64, 2, 16),
         3, 7, True),
        ((256, 1000, "bfloat16", 16, 4, 64, 2, None), (256, 128, "bfloat16", 8, 4, 64, 2, 16),
         3, 7, False),
    ]  # fmt: skip
    rows, reports = compile_deviceless(
        _COMPILE_HYPER.format(cases=cases), tmp_path, log_ptxas=False
    )
    assert len(rows) == len(cases)
    for row in rows:
        assert all(row["marks"]), row
        assert row["smem"] == [row["plan_smem"]], row
        assert row["plan_smem"] <= H100.smem_per_block_optin, row
    assert len(reports) == len(cases), len(reports)
    assert_no_spills(reports)


def _teacher_forced(plan, ops, inputs, save_z: bool):
    """The reference of every phase from the kernel's own input state of that phase
    (``inputs`` [P, b_pad, n_pad], packed row 0), so that one rounding flip of a bf16 state
    does not propagate: [(s_new, h, t[, full]) per phase]."""
    w_blk, _, xproj, bias, z_lt, decisions = ops
    mask = keep_mask.mask_values(decisions, KEEP)
    z = None if z_lt is None else slots.scales_to_phase_major(z_lt, plan.n_pad)
    depth = bias.shape[0]
    w_layers = w_blk.reshape(depth, 2 * plan.n_pad, plan.k_pad)
    outs = []
    for p, s in enumerate(inputs):
        t, layer = divmod(p, depth)
        x_scale = 1.0 if layer == 0 else 0.0
        outs.append(mf.highway_forward_reference(
            s[:, : plan.k_pad].astype(w_blk.dtype), w_layers[layer], s, bias[layer],
            None if z is None else z[p], _padded(plan, xproj[t]) * x_scale,
            None if mask is None else mask[p],
            save=True, units=plan.units_per_block,
        ))  # fmt: skip
    return outs


def _hyper_inside(plan, hyper_plan, hyper_ops, seed):
    """`HyperInside` of the hyper operands ``hyper_ops`` (`_operands` without z) and a fresh
    projection P [L, h, n], p [L, n] near 1 (so z scales by about 1)."""
    rng = np.random.default_rng(seed)
    depth, h, n = hyper_ops[3].shape[0], hyper_plan.width, plan.width
    proj = jnp.asarray(rng.normal(size=(depth, h, n)) * 0.2, jnp.float32)
    p = jnp.asarray(1.0 + rng.normal(size=(depth, n)) * 0.1, jnp.float32)
    p = jnp.pad(p, [(0, 0), (0, plan.n_pad - n)])
    w_blk, s0, xproj, bias, _, mask = hyper_ops
    return pf.HyperInside(
        hyper_plan, w_blk, s0, xproj, bias, mask,
        pf.projection_weights(plan, hyper_plan, proj, jnp.dtype(plan.dtype)),
        jnp.broadcast_to(p[:, None], (depth, plan.b_pad, plan.n_pad)),
    )  # fmt: skip


def _case_plan(case) -> pp.PersistentPlan:
    """A `TestCompiled` "case"'s plan: f32 at 2 pipeline stages, bf16 at the most of 4, 3, 2
    whose shared memory fits (a block of 256 rows needs fewer than 4)."""
    dtype, batch, width, cols, row_blocks, k_chunk = case[:6]
    for stages in (2,) if dtype == "float32" else (4, 3, 2):
        plan = pp.PersistentPlan(batch, width, dtype, cols, row_blocks, k_chunk, stages)
        if plan.smem_bytes() <= plan.smem_limit:
            break
    return plan


def _hyper_case_plans(hyper_case) -> tuple[pp.PersistentPlan, pp.PersistentPlan]:
    """A "hyper_case"'s (main plan, hyper plan), both at 2 pipeline stages."""
    dtype, batch, width, hyper_width, n_r, cols, hyper_cols, k_chunk, _, _, *u = hyper_case
    plan = pp.PersistentPlan(batch, width, dtype, cols, n_r, k_chunk, 2, units=(u or [None])[0])
    hp = pp.PersistentPlan(batch, hyper_width, dtype, hyper_cols, n_r, k_chunk, 2, units=16)
    return plan, hp


class TestCompiled(MosaicGpuMode):
    """The kernel against its reference on fresh random inputs: compiled (a GPU only; the
    grid barrier), and in `TestInterpret` executed in GPU interpret mode, race detector on
    (jax >= 0.11.2; the grid as one cluster with a cluster barrier). Each phase is compared
    with the reference run from the kernel's own input state of that phase, the state chain
    (each phase's input is the last one's output, the A buffer their casts) exactly. f32
    operands run as TF32 in wgmma on a GPU: the compiled f32 tolerance is TF32's."""

    CASES = {
        # (dtype, batch, width, col_blocks, row_blocks, k_chunk, steps, depth)
        "case": [("bfloat16", 256, 1000, 66, 1, 64, 4, 3), ("float32", 100, 37, 3, 2, 16, 3, 2),
                 ("bfloat16", 256, 1000, 33, 4, 64, 2, 2)],
        # (dtype, batch, width, hyper width, row_blocks, col_blocks, hyper col_blocks,
        #  k_chunk, steps, depth)
        "hyper_case": [("bfloat16", 256, 1000, 128, 4, 16, 8, 64, 3, 3),
                       ("float32", 100, 64, 32, 2, 2, 2, 32, 2, 3)],
    }  # fmt: skip
    # Compiled, wgmma sums in another order than XLA's reference (and f32 runs as TF32): on
    # an H100 (2026-11-26) the hyper-inside cases missed 1e-4 / 3e-3 by a few elements
    # (1 of 262,144 at 1.26e-4 in bf16, identical in both launch layouts, so arithmetic, not
    # a race; 4 of 8,192 at up to 5.5e-3 in f32). A wrong phase is off by O(0.1) or more.
    TOL = {"bfloat16": 3e-4, "float32": 1e-2}
    LAYOUT = "grid"  # the kernels' launch layout (`kernels/mosaic/rowgroup_layout.py`)

    def run(self, plan, ops, save, hyper=None, save_scales=True):
        """The jitted kernel in this class's mode; the plan must suit the mode."""
        if self.INTERPRET:
            cluster = plan.grid if self.LAYOUT == "grid" else plan.col_blocks
            reason = gpu_interpret.cluster_too_large(cluster)
            if reason is not None:
                pytest.skip(reason)
        kernel = functools.partial(
            pf.persistent_forward, plan, save=save, keep=KEEP, interpret=self.interpret(),
            layout=self.LAYOUT, hyper=hyper, save_scales=save_scales,
        )  # fmt: skip
        return jax.block_until_ready(jax.jit(kernel)(*ops))

    @pytest.mark.parametrize(("has_z", "has_mask"), [(True, True), (False, False)])
    def test_matches_reference(self, case, has_z, has_mask):
        dtype, batch, width, cols, row_blocks, k_chunk, steps, depth = case
        plan = _case_plan(case)
        ops = _operands(plan, _problem(5, batch, width, steps, depth), has_z, has_mask)
        s_last, packed, s_mm, status = self.run(plan, ops, save=True)
        assert not np.asarray(status).any(), status
        outputs = self.check_saved_chain(plan, ops, s_last, packed, s_mm, steps, depth)
        # Without save (another kernel): every state, and the A buffer their casts.
        states, s_mm_unsaved, status = self.run(plan, ops, save=False)
        assert not np.asarray(status).any()
        self.check_unsaved(plan, ops, states, s_mm_unsaved, outputs, steps, depth)

    def check_saved_chain(self, plan, ops, s_last, packed, s_mm, steps, depth):
        """The saved outputs against the reference phase by phase (teacher-forced from the
        kernel's own input states, ``ops[4]`` its z), the A buffer exactly the casts of the
        state chain; returns the state after every phase [P, b_pad, n_pad]."""
        dtype, has_z = plan.dtype, ops[4] is not None
        inputs = _inputs(plan, packed, s_mm, steps, depth)
        np.testing.assert_array_equal(inputs[0], ops[1])  # s0
        outputs = jnp.concatenate([inputs[1:], s_last], axis=0)
        chain = jnp.concatenate([ops[1][None], outputs], axis=0)[..., : plan.k_pad]
        chain = slots.to_slots(chain[:-1], steps, depth)  # every phase's input, layer-major
        np.testing.assert_array_equal(s_mm, chain.astype(dtype).reshape(s_mm.shape))
        tol = self.TOL[dtype]
        for p, want in enumerate(_teacher_forced(plan, ops, inputs, has_z)):
            rows = _gate_rows(plan, packed[p])
            if has_z:  # the saved rows are full's halves: (s_new, full) of the reference
                got, want = [outputs[p], rows], [want[0], want[3]]
            else:  # the gates
                got = [outputs[p], rows[:, 0], rows[:, 1]]
            assert len(got) == len(want)
            for a, e in zip(got, want, strict=True):
                np.testing.assert_allclose(a, e, rtol=tol, atol=tol, err_msg=f"phase {p}")
        return outputs

    def check_unsaved(self, plan, ops, states, s_mm, outputs, steps, depth):
        """Without save: every state (as the saved kernel's), the A buffer their casts."""
        tol = self.TOL[plan.dtype]
        np.testing.assert_allclose(states, outputs, rtol=tol, atol=tol)
        chain = jnp.concatenate([ops[1][None], states], axis=0)[..., : plan.k_pad]
        chain = slots.to_slots(chain[:-1], steps, depth)
        np.testing.assert_array_equal(s_mm, chain.astype(plan.dtype).reshape(s_mm.shape))

    @pytest.mark.parametrize("has_mask", [True, False])
    def test_hyper_cell_inside_matches_the_two_kernels_and_hyper_scales(self, hyper_case, has_mask):
        """With the hyper cell inside (`HyperInside`): its outputs match the reference on
        the hyper operands as the plain kernel's do (teacher-forced, the A buffer exactly
        its state chain's casts); z is `hyper_scales_reference` of the kernel's own hyper
        states (the tail the last of them, exactly); the main outputs match the reference
        teacher-forced with that z, which is also `scales_from_a_buffer_reference` of the
        saved A buffer and tail (what the backward recomputes it from). Without
        ``save_scales`` the same outputs but z; without save the same states."""
        dtype, batch, width, hyper_width, n_r, cols, hyper_cols, k_chunk, steps, depth, *u = (
            hyper_case
        )
        plan, hp = _hyper_case_plans(hyper_case)
        ops_h = _operands(hp, _problem(7, batch, hyper_width, steps, depth), False, has_mask)
        ops = _operands(plan, _problem(8, batch, width, steps, depth), False, has_mask)
        hyper = _hyper_inside(plan, hp, ops_h, seed=9)
        outs = self.run(plan, ops, save=True, hyper=hyper)
        s_last, packed, s_mm, h_last, h_packed, sh_mm, z, tail, status = outs
        assert not np.asarray(status).any(), status
        h_states = self.check_saved_chain(hp, ops_h, h_last, h_packed, sh_mm, steps, depth)
        np.testing.assert_array_equal(tail, h_states[-1, :, : hp.k_pad].astype(dtype))
        want_z = pf.hyper_scales_reference(plan, hp, h_states, hyper.proj, hyper.proj_bias, steps)
        tol = self.TOL[dtype]
        np.testing.assert_allclose(z, want_z, rtol=tol, atol=tol)
        from_buffer = pf.scales_from_a_buffer_reference(
            plan, hp, sh_mm, tail, hyper.proj, hyper.proj_bias, steps
        )
        np.testing.assert_array_equal(from_buffer, want_z)
        main_ops = (*ops[:4], z, ops[5])
        outputs = self.check_saved_chain(plan, main_ops, s_last, packed, s_mm, steps, depth)
        without_z = self.run(plan, ops, save=True, hyper=hyper, save_scales=False)
        assert len(without_z) == len(outs) - 1
        for a, e in zip(without_z, (*outs[:6], *outs[7:]), strict=True):
            np.testing.assert_array_equal(a, e)
        unsaved = self.run(plan, ops, save=False, hyper=hyper)
        states, s_mm_unsaved, h_states_unsaved, sh_mm_unsaved, tail_unsaved, status = unsaved
        assert not np.asarray(status).any(), status
        self.check_unsaved(plan, main_ops, states, s_mm_unsaved, outputs, steps, depth)
        self.check_unsaved(hp, ops_h, h_states_unsaved, sh_mm_unsaved, h_states, steps, depth)
        want_tail = h_states_unsaved[-1, :, : hp.k_pad].astype(dtype)
        np.testing.assert_array_equal(tail_unsaved, want_tail)


class TestInterpret(TestCompiled):
    INTERPRET = True
    CASES = {
        # one block; 2 row blocks; 2 x 3 (the compiled odd case); 16 (an H100's largest cluster)
        "case": [("bfloat16", 64, 64, 1, 1, 32, 3, 2), ("float32", 100, 32, 1, 2, 16, 2, 3),
                 ("float32", 100, 37, 3, 2, 16, 3, 2), ("bfloat16", 64, 256, 16, 1, 32, 2, 2)],
        # two row blocks of 2 blocks, both with hyper units; 4 blocks, 2 with hyper units
        "hyper_case": [("float32", 100, 64, 32, 2, 2, 2, 32, 2, 3),
                       ("bfloat16", 64, 128, 32, 1, 4, 2, 32, 3, 2),
                       ("float32", 5, 96, 20, 1, 4, 4, 64, 4, 2, 32)],
    }  # fmt: skip
    TOL = {"bfloat16": 1e-4, "float32": 2e-5}

    def test_the_race_detector_reports_a_missing_barrier_between_phases(self, monkeypatch, capsys):
        """The check can fail: without the barrier between phases, one block's next-phase
        TMA load of the state races with another block's store of it."""
        plan = pp.PersistentPlan(64, 64, "bfloat16", col_blocks=2, k_chunk=32)
        ops = _operands(plan, _problem(1, 64, 64, 2, 1), False, False)
        self.run(plan, ops, save=False)  # as it is: no race
        monkeypatch.setattr(grid_barrier, "cluster_barrier", lambda bar: jnp.bool_(True))
        assert_race_reported(lambda: self.run(plan, ops, save=False), capsys, monkeypatch)

    def test_the_race_detector_reports_a_store_the_next_phase_reads_left_writing(
        self, monkeypatch, capsys
    ):
        """The check can fail: a phase that leaves one bulk store more in flight past the
        barrier than its late ones (which nothing in the kernel reads) leaves its A rows'
        store writing, which races with another block's TMA load of them in the next phase."""
        plan = pp.PersistentPlan(64, 64, "bfloat16", col_blocks=2, k_chunk=32)
        ops = _operands(plan, _problem(1, 64, 64, 2, 1), False, False)
        self.run(plan, ops, save=False)  # as it is: no race
        wait = persistent_cell.wait_for_all_but
        monkeypatch.setattr(persistent_cell, "wait_for_all_but", lambda late: wait(late + 1))
        assert_race_reported(lambda: self.run(plan, ops, save=False), capsys, monkeypatch)


@pytest.mark.parametrize("mode", [TestCompiled, TestInterpret], ids=["compiled", "interpret"])
def test_every_kernel_case_is_a_plan_the_kernel_accepts(mode):
    """Checked on a CPU: a case that only a GPU can run (66 blocks) was first found to be
    an invalid plan there (2026-11-26: 286,800 B of shared memory at 4 stages)."""
    for case in mode.CASES["case"]:
        _case_plan(case).check()
    for hyper_case in mode.CASES["hyper_case"]:
        for plan in _hyper_case_plans(hyper_case):
            plan.check()
