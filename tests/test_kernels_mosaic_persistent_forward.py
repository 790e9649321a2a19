"""The persistent whole-sequence forward kernel (`kernels/mosaic/persistent_forward.py`):
its reference, plan and compile.

On a CPU: its reference against the highway recurrence of `ops.cells` (states and the
saved rows in `loops.pack`'s layout), the A buffer and status outputs, the weight layout,
the plan's new checks and its shared-memory count, one-line errors. ``gpu_compile``: the
kernel lowers and compiles for an H100 without a GPU, allocating exactly
``plan.smem_bytes(...)`` (needs the JAX CUDA plugin). The kernel run against its reference
(compiled on a GPU, interpreted on a CPU): tests/test_kernels_mosaic_persistent_forward_run.py."""

import jax.numpy as jnp
import numpy as np
import pytest
from kernel_cases import (
    KEEP,
    SMEM_COUNTER,
    assert_no_spills,
    compile_deviceless,
    forward_gate_rows,
    forward_inputs,
    forward_operands,
    forward_problem,
    needs_cuda,
)
from rhhjax.kernels.hardware import H100
from rhhjax.kernels.mosaic import persistent_forward as pf
from rhhjax.kernels.mosaic import persistent_slots as slots
from rhhjax.kernels.mosaic import plan as pp

from rhhjax.ops import cells, loops, persistent

TOLERANCE = {"float32": 1e-5, "bfloat16": 1e-5}


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


@pytest.mark.pure_jax
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
    prob = forward_problem(batch + width + depth, batch, width, steps, depth)
    ops = forward_operands(plan, prob, has_z, has_mask)
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
    inputs = forward_inputs(plan, packed, s_mm, steps, depth)[:, :batch, :width]
    np.testing.assert_array_equal(inputs[0], prob["s0"])
    np.testing.assert_array_equal(inputs[1:], states[:-1, :batch, :width])
    want_states, want_packed = _cells_forward(prob, dtype, has_z, has_mask, inputs)
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(states[:, :batch, :width], want_states, rtol=tol, atol=tol)
    got = forward_gate_rows(plan, packed)[:, :batch, :, :width]
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


def test_forward_weights_are_each_layers_block_major_transpose():
    """Rows (l * C + g) * 2u + j hold W_l's h-column g * u + j, then the t-columns; zero past
    the width in both K and units."""
    plan = pp.PersistentPlan(batch=64, width=37, dtype="float32", col_blocks=4, k_chunk=16)
    u, n = plan.units_per_block, 37
    w = forward_problem(1, 8, n, 1, 3)["w"]
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
    prob = forward_problem(0, plan.batch, plan.width, 1, 1)
    with pytest.raises(pp.PlanError, match=message) as e:
        ops = forward_operands(plan, prob, False, False)
        pf.persistent_forward_reference(plan, *ops, save=False)
    assert "\n" not in str(e.value)


def test_operands_of_the_wrong_shape_or_dtype_are_one_line_errors():
    plan = pp.PersistentPlan(64, 64, "bfloat16", col_blocks=8, k_chunk=32)
    ops = list(forward_operands(plan, forward_problem(0, 64, 64, 2, 2), True, False))
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
    prob = forward_problem(2, 64, 64, 1, 2)
    ops = forward_operands(plan, prob, True, True)
    with pytest.raises(pp.PlanError, match="multiple of 16") as e:
        pf.persistent_forward_reference(plan, *ops, save=True, keep=KEEP)
    assert "\n" not in str(e.value)
    pf.persistent_forward_reference(plan, *ops[:-1], None, save=True)
    with pytest.raises(pp.PlanError, match=r"mask is float32\[2, 64, 64\], expected uint8"):
        wide = pp.PersistentPlan(64, 64, "float32", col_blocks=4, k_chunk=32)
        wide_ops = forward_operands(wide, prob, True, True)
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
_SMEM_COUNTER = (
    SMEM_COUNTER
    + """
from rhhjax.kernels.mosaic import persistent_forward as pf
from rhhjax.kernels.mosaic.plan import PersistentPlan
"""
)

_COMPILE = (
    _SMEM_COUNTER
    + """
for fields, steps, depth, has_z, has_mask, save in {cases!r}:
    *fields, named = fields if isinstance(fields[-1], dict) else (*fields, {{}})
    plan = PersistentPlan(*fields, **named)
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
    _compiles_at_the_plans_shared_memory(cases, tmp_path)


@pytest.mark.gpu_compile
@needs_cuda
def test_the_epilogue_in_registers_compiles_for_an_h100_without_a_gpu(tmp_path):
    """`PersistentPlan.in_registers` (each gate's accumulator read in registers, no f32
    GEMM tile in shared memory) at the paper's bf16 blocks, 5 stages of 64 and 8 of 32, and
    f32's 4 x 32 blocks: the plan's shared memory, no register spilled."""
    registers = {"in_registers": True}
    cases = [
        ((256, 1000, "bfloat16", 16, 4, 64, 5, registers), 3, 7, True, True, True),
        ((256, 1000, "bfloat16", 16, 4, 32, 8, registers), 3, 2, True, True, True),
        ((256, 1000, "float32", 32, 4, 64, 4, registers), 3, 2, True, True, True),
        ((256, 1000, "bfloat16", 16, 4, 64, 5, registers), 3, 2, False, False, False),
    ]
    _compiles_at_the_plans_shared_memory(cases, tmp_path)


@pytest.mark.gpu_compile
@needs_cuda
def test_a_producer_warpgroup_compiles_for_an_h100_without_a_gpu(tmp_path):
    """`PersistentPlan.producer` (warpgroup 1 issues the loads) at the paper's bf16 blocks,
    3 stages with the f32 tile in shared memory, 5 with the epilogue in registers, and
    f32's 4 x 32 blocks: the plan's shared memory, no register spilled."""
    producer = {"producer": True}
    registers = producer | {"in_registers": True}
    cases = [
        ((256, 1000, "bfloat16", 16, 4, 64, 3, producer), 3, 7, True, True, True),
        ((256, 1000, "bfloat16", 16, 4, 64, 5, registers), 3, 7, True, True, True),
        ((256, 1000, "float32", 32, 4, 64, 3, registers), 3, 2, True, True, False),
    ]
    _compiles_at_the_plans_shared_memory(cases, tmp_path)


def _compiles_at_the_plans_shared_memory(cases, tmp_path) -> None:
    code = _COMPILE.format(cases=cases)
    rows, reports = compile_deviceless(code, tmp_path, log_ptxas=False)
    assert len(rows) == len(cases)
    for row in rows:
        assert all(row["marks"]), row
        assert row["smem"] == [row["plan_smem"]], row
    # ptxas compiled every kernel for sm_90a, without register spills.
    assert len(reports) == len(cases), len(reports)
    assert_no_spills(reports)
