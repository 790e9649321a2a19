"""The persistent whole-sequence backward kernel (`kernels/mosaic/persistent_backward.py`):
its reference, plan and compile.

On a CPU: its reference against ``jax.vjp`` of a plain-JAX forward on the same padded
operands (f32; with and without z and mask; odd sizes; depth 1 to 3; in bf16 the model
against `scan`, tests/test_ops_persistent.py); the weight layout; the shared-memory
count; one-line plan errors. ``gpu_compile``: the kernel lowers and compiles for an H100
without a GPU, and allocates exactly `backward_smem_bytes`. The kernel run against its
reference (compiled on a GPU, interpreted on a CPU):
tests/test_kernels_mosaic_persistent_backward_run.py."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_cases import (
    KEEP,
    assert_no_spills,
    backward_a_buffer,
    backward_case,
    backward_packed,
    backward_rest,
    compile_deviceless,
    needs_cuda,
    pad_rows_and_units,
)
from rhhjax.kernels.layout import F32
from rhhjax.kernels.mosaic import persistent_backward as pb
from rhhjax.kernels.mosaic import persistent_slots as slots
from rhhjax.kernels.mosaic.plan import PersistentPlan, PlanError, paper_plan

# ----------------------------------------------------------------------------- weights


def test_backward_weights_are_each_layer_padded_and_stacked_on_rows():
    """wt[l * n_pad + j, h * n_pad + i] = W_l[j, h * n + i], zero where padded."""
    plan = PersistentPlan(64, 21, "float32", col_blocks=3, k_chunk=16)  # u 8, n_pad 24
    kernel_s = jnp.asarray(np.random.default_rng(0).normal(size=(2, 21, 42)), F32)
    wt = np.asarray(pb.backward_weights(plan, kernel_s, F32))
    n, n_pad = 21, plan.n_pad
    assert wt.shape == (2 * n_pad, 2 * n_pad)
    for layer in range(2):
        block = wt[layer * n_pad : (layer + 1) * n_pad].reshape(n_pad, 2, n_pad)
        w = np.asarray(kernel_s[layer]).reshape(n, 2, n)
        np.testing.assert_array_equal(block[:n, :, :n], w)
        assert not block[n:].any() and not block[:, :, n:].any()


def test_backward_weights_cast_to_the_matmul_dtype():
    plan = PersistentPlan(64, 16, "bfloat16", col_blocks=2)
    kernel_s = jnp.ones((1, 16, 32), F32) / 3
    wt = pb.backward_weights(plan, kernel_s, jnp.bfloat16)
    assert wt.dtype == jnp.bfloat16 and wt.shape == (16, 32)


# ----------------------------------------------------------------------------- reference


def _plain_forward(plan, w_layers, s0, case, e_full, e_a, depth):
    """A plain-JAX forward over the padded phases whose vjp is the backward: full = s W_l
    (+ e_full), a = full (* z + bias) + e_a, the highway gate. Returns states [P, Bp, n_pad]."""
    s, states = s0, []
    for p in range(e_a.shape[0]):
        w = w_layers[p % depth]
        full = jnp.matmul(s, w, precision="highest").reshape(s.shape[0], 2, -1) + e_full[p]
        a = full if case["z"] is None else full * case["z"][p][:, None] + case["bias"][p % depth]
        a = a + e_a[p]
        h, tg = jnp.tanh(a[:, 0]), jax.nn.sigmoid(a[:, 1])
        gate = tg if case["mask"] is None else tg * case["mask"][p]
        s = h * gate + s * (1.0 - tg)
        states.append(s)
    return jnp.stack(states)


@pytest.mark.pure_jax
@pytest.mark.parametrize(
    ("batch", "width", "col_blocks", "steps", "depth", "z_on", "mask_on"),
    [(37, 21, 3, 2, 3, True, True), (64, 16, 2, 3, 1, False, False),
     (70, 13, 1, 2, 2, False, True)],
)  # fmt: skip
def test_reference_is_the_vjp_of_a_plain_forward_f32(
    batch, width, col_blocks, steps, depth, z_on, mask_on
):
    """Run the plain forward from s0 to get s_prev, h, tg, full; the reference's bias parts
    are each row block's sums of the cotangent of the pre-activations a (da), d_mm's rows
    and d_x (layer 0, f32) are that of ``full`` (da * z), dz that of z, and ``ds_carry0 +
    d_scaled_0 @ W_0^T`` that of s0; padded rows and units stay zero."""
    plan = PersistentPlan(batch, width, "float32", col_blocks=col_blocks, k_chunk=16)
    case = backward_case(batch + width, plan, steps, depth, z_on, mask_on)
    n_pad, b_pad, phases = plan.n_pad, plan.b_pad, steps * depth
    wt = pb.backward_weights(plan, case["kernel_s"], F32)
    w_layers = wt.reshape(depth, n_pad, 2 * n_pad)
    s0 = pad_rows_and_units(
        plan, jnp.asarray(np.random.default_rng(1).normal(size=(batch, width)), F32)
    )
    zeros = jnp.zeros((phases, b_pad, 2, n_pad), F32)

    def forward(s, ef, ea, z):
        return _plain_forward(plan, w_layers, s, dict(case, z=z), ef, ea, depth)

    states = forward(s0, zeros, zeros, case["z"])
    s_prev = jnp.concatenate([s0[None], states[:-1]])
    a_full = jnp.einsum("pbk,pkc->pbc", s_prev, w_layers[jnp.arange(phases) % depth])
    full = a_full.reshape(phases, b_pad, 2, n_pad)
    a = full
    if case["z"] is not None:
        a = full * case["z"][:, :, None] + case["bias"][jnp.arange(phases) % depth]
    case.update(s_prev=s_prev, h=jnp.tanh(a[:, :, 0]), tg=jax.nn.sigmoid(a[:, :, 1]), full=full)
    outs = pb.persistent_backward_reference(
        plan, wt, case["g"], backward_packed(case), *backward_rest(case), keep=KEEP
    )
    d_x, d_mm, ds_carry0, parts = outs.d_x, outs.d_mm, outs.ds_carry0, outs.bias_parts
    status = outs.status
    d_mm = _phase_order(d_mm, steps, depth)
    _, vjp = jax.vjp(forward, s0, zeros, zeros, case["z"])
    ds0, d_full, d_a, dz = vjp(case["g"])
    tol = dict(rtol=1e-5, atol=1e-5)
    rows = plan.rows_per_block  # parts [P, R, 2, group, n_pad]: sum the group -> row blocks
    by_block = d_a.reshape(phases, plan.row_blocks, rows, 2, n_pad).sum(axis=2)
    np.testing.assert_allclose(parts.sum(axis=3), by_block, **tol)
    assert d_x.shape == (steps, b_pad, 2, plan.z_width)  # unpadded units, like z
    np.testing.assert_allclose(d_x, d_full[::depth, ..., : plan.z_width], **tol)
    np.testing.assert_allclose(d_mm[: phases * b_pad].reshape(d_full.shape), d_full, **tol)
    assert d_mm.shape == (phases * b_pad, 2 * n_pad)
    ds0_ref = ds_carry0 + jnp.matmul(d_mm[:b_pad], w_layers[0].T, precision="highest")
    np.testing.assert_allclose(ds0_ref, ds0, **tol)
    assert not np.asarray(d_x[:, batch:]).any() and not np.asarray(d_x[..., width:]).any()
    assert not np.asarray(parts[..., width:]).any()
    assert status.shape == (plan.grid,) and not np.asarray(status).any()
    if z_on:  # dz, layer-major [L, T, b_pad, z_width]: the kernels' layout
        got = jnp.swapaxes(outs.dz, 0, 1).reshape(phases, b_pad, plan.z_width)
        np.testing.assert_allclose(got, dz[..., : plan.z_width], **tol)
    # The check can fail: another outside cotangent gives another da.
    other = pb.persistent_backward_reference(
        plan, wt, case["g"] * 2, backward_packed(case), *backward_rest(case), keep=KEEP
    )
    assert not np.allclose(other[0], d_x) and not np.allclose(other[3], parts)


def _phase_order(d_mm, steps: int, depth: int):
    """d_mm [P * b_pad, C] in the kernels' layer-major slots -> the same in phase order."""
    blocks = d_mm.reshape(steps * depth, -1, d_mm.shape[-1])
    return slots.from_slots(blocks, steps, depth).reshape(d_mm.shape)


@pytest.mark.pure_jax
def test_reference_takes_the_last_layers_cotangent_alone_as_the_dense_one():
    """g [T, b_pad, n_pad]: layer L - 1's cotangent, the others zero, exactly."""
    plan = PersistentPlan(64, 40, "float32", col_blocks=3, k_chunk=16)
    steps, depth = 3, 3
    case = backward_case(11, plan, steps, depth, True, True)
    wt = pb.backward_weights(plan, case["kernel_s"], F32)
    rest = (backward_packed(case), *backward_rest(case))
    g_last = case["g"][depth - 1 :: depth]
    dense = jnp.zeros_like(case["g"]).at[depth - 1 :: depth].set(g_last)
    alone = pb.persistent_backward_reference(plan, wt, g_last, *rest, keep=KEEP)
    whole = pb.persistent_backward_reference(plan, wt, dense, *rest, keep=KEEP)
    assert len(alone) == 6  # with z: dz too
    for a, e in zip(alone, whole, strict=True):
        np.testing.assert_array_equal(a, e)
    with pytest.raises(PlanError, match=r"g \(2, 64, 48\) is not \[9, 64, 48\]") as e:
        pb.persistent_backward_reference(plan, wt, g_last[:2], *rest, keep=KEEP)
    assert "\n" not in str(e.value)


def test_reference_rejects_mismatched_operands_in_one_line():
    plan = PersistentPlan(64, 16, "float32", col_blocks=2, k_chunk=16)
    case = backward_case(0, plan, 2, 1, False, False)
    wt = pb.backward_weights(plan, case["kernel_s"], F32)
    s_mm = backward_a_buffer(case)  # f32: the input states come from the A buffer
    bad = [
        (wt[:, :-16], case["g"], backward_packed(case), s_mm, "wt"),
        (wt, case["g"][:, :32], backward_packed(case), s_mm, "g"),
        (wt, case["g"], backward_packed(case)[:, :, :1], s_mm, "does not have 2 saved rows"),
        (wt, case["g"], backward_packed(case), None, "s_mm is None"),
        (wt, case["g"], backward_packed(case), s_mm[:, :8], "s_mm is"),
        (wt.astype(jnp.bfloat16), case["g"], backward_packed(case), s_mm, "dtype"),
    ]
    for w, g, packed, a_buffer, message in bad:
        with pytest.raises(PlanError, match=message) as e:
            pb.persistent_backward_reference(plan, w, g, packed, None, None, None, a_buffer)
        assert "\n" not in str(e.value)
    # With z the gates are recomputed from full: the bias is required, and only then.
    z_case = backward_case(1, plan, 2, 1, True, False)
    z_bias = [
        (z_case["z_op"], None),
        (None, z_case["bias"]),
        (z_case["z_op"], z_case["bias"][:, :32]),
    ]
    for run in (pb.persistent_backward_reference, pb.persistent_backward):
        for z, bias in z_bias:
            with pytest.raises(PlanError, match="bias is") as e:
                run(
                    plan,
                    wt,
                    z_case["g"],
                    backward_packed(z_case),
                    z,
                    None,
                    bias,
                    backward_a_buffer(z_case),
                )
            assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------- plan, smem


def test_paper_plans_fit_the_h100_shared_memory():
    """`plan_for`'s plans (bf16 4 x 16, f32 4 x 32) and the 4 x 33 split run z and the mask
    within 227 KiB; the 132-block plans (8 units: rows of 8 B, too short for a uint8 TMA
    tile) run without the mask, bf16 at 4 stages and f32 (TF32) at 2 (at any depth: nothing
    in shared memory grows with the layers)."""
    chosen = (
        PersistentPlan(256, 1000, "bfloat16", col_blocks=16, row_blocks=4, stages=3),
        PersistentPlan(256, 1000, "float32", col_blocks=32, row_blocks=4, stages=4),
        PersistentPlan(256, 1000, col_blocks=33, row_blocks=4),
    )
    for plan in chosen:
        pb.check_plan(plan)
        assert pb.backward_smem_bytes(plan) <= plan.smem_limit
    for plan in (paper_plan("bfloat16"), paper_plan("float32", stages=2)):
        pb.check_plan(plan, has_mask=False)
        with pytest.raises(PlanError, match="multiple of 16"):
            pb.check_plan(plan)
    for stages in (3, 4):
        with pytest.raises(PlanError, match="shared memory"):
            pb.check_plan(paper_plan("float32", stages=stages), has_mask=False)


def test_smem_bytes_count_each_allocation_rounded_to_a_kib():
    """The paper bf16 plan: A 4 x 256 x 64 x 2, B 4 x 8 x 64 x 2, seven f32 input tiles (g,
    s_prev, full's halves, z, the bias halves), the uint8 mask tile [256, 8], carry and
    accumulator [256, 8] f32, two bf16 d_scaled tiles and the bias column sums [2, 32, 8]
    f32 (32 rows of 8 units: 256 elements); twelve mbarriers. Without z and mask four input
    tiles (g, s_prev, h, tg): three f32 tiles, the uint8 tile and four mbarriers fewer."""
    plan = paper_plan("bfloat16")
    tile, mask_tile = 256 * 8 * 4, 256 * 8
    assert pb.bias_row_group(plan) == 32
    full = (4 * 256 * 64 * 2 + 4 * 8 * 64 * 2 + 7 * tile + mask_tile + 2 * tile
            + 2 * 256 * 8 * 2 + 2 * 32 * 8 * 4 + 8 * 12)  # fmt: skip
    assert pb.backward_smem_bytes(plan) == full
    without = pb.backward_smem_bytes(plan, has_z=False, has_mask=False)
    assert without == full - 3 * tile - mask_tile - 32
    # Each allocation rounds up to 1 KiB: A 8 KiB, B 2 x 8 x 16 x 4 = 1 KiB, the four input
    # tiles [64, 8] f32 8 KiB, carry and accumulator 2 KiB each, the f32 d_scaled pair 4 KiB,
    # the bias column sums 2 KiB.
    small = PersistentPlan(64, 16, "float32", col_blocks=2, k_chunk=16, stages=2)
    want = (8 + 1 + 4 * 2 + 2 + 2 + 4 + 2) * 1024 + 48
    assert pb.backward_smem_bytes(small, False, False) == want
    # Split between two warpgroups (4 K chunks, 2 each): the second's 2 stages (A [64, 16]
    # f32 8 KiB, B [16, 16] 2 KiB), its partial tile [64, 16] (4 KiB) and 8 mbarriers more
    # (2 a stage in each warpgroup's staged loop against 1 in the pipeline, go and done).
    four_chunks = PersistentPlan(64, 32, "float32", col_blocks=2, k_chunk=16, stages=2)
    split = dataclasses.replace(four_chunks, split_k=True)
    grown = pb.backward_smem_bytes(split, False, False) - pb.backward_smem_bytes(
        four_chunks, False, False
    )
    assert grown == (8 + 2 + 4) * 1024 + 8 * 8


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        (PersistentPlan(64, 40, col_blocks=10), "units_per_block % 8"),
        (PersistentPlan(64, 64, col_blocks=8, k_chunk=16), "multiple of 16 \\(uint8 TMA rows"),
        (PersistentPlan(512, 64, col_blocks=8, k_chunk=16, stages=2), "rows_per_block <= 256"),
        (PersistentPlan(64, 40, col_blocks=5, k_chunk=64), "multiple of k_chunk 64"),
        (PersistentPlan(256, 1000, "float32", col_blocks=66, stages=4), "over the 232448 B"),
        (PersistentPlan(64, 64, col_blocks=1, split_k=True, multicast_b=True), "split_k"),
        (PersistentPlan(64, 32, "float32", 1, k_chunk=64, split_k=True), "2 K chunks or more"),
        # the paper's bf16 plan split: a second warpgroup's 3 stages of 64-wide chunks
        (PersistentPlan(256, 1000, "bfloat16", 16, 4, 64, 3, split_k=True), "over the 232448"),
    ],
)
def test_unrunnable_plans_are_one_line_errors(plan, message):
    with pytest.raises(PlanError, match=message) as e:
        pb.check_plan(plan)
    assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------- compile

_COMPILE = """
import inspect
from jax.experimental.mosaic.gpu import core as mcore
from rhhjax.kernels.mosaic import persistent_backward as pb
from rhhjax.kernels.mosaic.plan import PersistentPlan
smem = []
launch = mcore._launch
def counting_launch(*args, **kwargs):
    bound = inspect.signature(launch).bind(*args, **kwargs)
    smem.append(mcore._smem_tree_size(bound.arguments["smem_buffers"]))
    return launch(*args, **kwargs)
mcore._launch = counting_launch
rows = []
for plan_args, steps, depth, z_on, mask_on in {cases!r}:
    *fields, named = plan_args if isinstance(plan_args[-1], dict) else (*plan_args, {{}})
    plan = PersistentPlan(*fields, split_k={split_k}, **named)
    phases, b, n = steps * depth, plan.b_pad, plan.n_pad
    mm = jnp.dtype(plan.dtype)
    args = (sds((depth * n, 2 * n), mm), sds((phases, b, n)),
            sds((phases, b, plan.packed_rows, n)),
            sds((depth, steps, b, plan.z_width)) if z_on else None,
            sds((phases, b, n), jnp.uint8) if mask_on else None,
            sds((depth, b, 2, n)) if z_on else None,
            None if plan.state_in_packed else sds((phases * b, plan.k_pad)))
    def f(*a):
        return pb.persistent_backward(plan, *a)
    smem.clear()
    text = lower_and_compile(f, *args)
    rows.append(dict(
        mosaic="mosaic_gpu" in text,
        barrier=all(k in text for k in ("red.release.gpu", "fence.proxy.async.global")),
        smem=list(smem),
        predicted=[pb.backward_smem_bytes(plan, z_on, mask_on)]))
print(json.dumps(rows))
"""


@pytest.mark.gpu_compile
@needs_cuda
def test_kernel_lowers_and_compiles_for_an_h100_without_a_gpu(tmp_path):
    """`plan_for`'s paper plans with z and the uint8 mask (bf16 4 x 16 blocks of 64 units, 3
    stages; f32 4 x 32 of 32 units, 4 stages), bf16 with z and no mask (jax 0.11's layout
    inference once tiled the buffer of the unpadded z there), the 4 x 33 plan, and a small
    odd case without z (2 x 3 blocks, k_chunk 32), 3 steps deep 2-3, deviceless, in a fresh
    process: Mosaic GPU, the grid barrier in the lowered text, the shared memory Mosaic
    GPU launches with equal to `backward_smem_bytes`, no register spilled by ptxas (the
    epilogue in row halves: on whole tiles the bf16 one took 231 registers alone)."""
    cases = [
        ((256, 1000, "bfloat16", 16, 4, 64, 3), 3, 7, True, True),  # paper depth
        ((256, 1000, "float32", 32, 4, 64, 4), 3, 2, True, True),
        ((256, 1000, "bfloat16", 16, 4, 64, 3), 3, 2, True, False),  # no mask
        ((256, 1000, "bfloat16", 33, 4), 3, 3, False, False),
        ((100, 37, "float32", 3, 2, 32, 3), 3, 2, False, True),
    ]
    _compiles_at_the_predicted_shared_memory(cases, tmp_path)


@pytest.mark.gpu_compile
@needs_cuda
def test_the_epilogue_in_registers_compiles_for_an_h100_without_a_gpu(tmp_path):
    """`PersistentPlan.in_registers` (the accumulator read in registers, the whole tile at
    once, no f32 tile in shared memory) at the paper's bf16 blocks, 5 stages of 64 (also
    with the weights multicast) and 8 of 32, and f32's 4 x 32 blocks: the predicted shared
    memory, no register spilled."""
    registers = {"in_registers": True}
    shared = registers | {"multicast_b": True}
    cases = [
        ((256, 1000, "bfloat16", 16, 4, 64, 5, registers), 3, 7, True, True),
        ((256, 1000, "bfloat16", 16, 4, 64, 5, shared), 3, 2, True, True),
        ((256, 1000, "bfloat16", 16, 4, 32, 8, registers), 3, 2, True, True),
        ((256, 1000, "float32", 32, 4, 64, 4, registers), 3, 2, True, True),
    ]
    _compiles_at_the_predicted_shared_memory(cases, tmp_path)


@pytest.mark.gpu_compile
@needs_cuda
def test_a_producer_warpgroup_compiles_for_an_h100_without_a_gpu(tmp_path):
    """`PersistentPlan.producer` (warpgroup 1 issues the loads) at the paper's bf16 blocks,
    3 stages with the f32 tile in shared memory, 5 with the epilogue in registers, and
    f32's 4 x 32 blocks: the predicted shared memory, no register spilled."""
    producer = {"producer": True}
    registers = producer | {"in_registers": True}
    cases = [
        ((256, 1000, "bfloat16", 16, 4, 64, 3, producer), 3, 7, True, True),
        ((256, 1000, "bfloat16", 16, 4, 64, 5, registers), 3, 7, True, True),
        ((256, 1000, "float32", 32, 4, 64, 3, registers), 3, 2, True, True),
    ]
    _compiles_at_the_predicted_shared_memory(cases, tmp_path)


@pytest.mark.gpu_compile
@needs_cuda
def test_the_gemm_split_between_two_warpgroups_compiles_for_an_h100_without_a_gpu(tmp_path):
    """`PersistentPlan.split_k` at the paper's blocks, at the pipelines that fit two
    warpgroups' stages (bf16: K chunks of 32, 2 stages each, 3 with the epilogue in
    registers; f32: 64 and 2, or 32 and 4): the predicted shared memory, no register spilled
    with the block's 256 threads."""
    cases = [
        ((256, 1000, "bfloat16", 16, 4, 32, 2), 3, 7, True, True),
        ((256, 1000, "float32", 32, 4, 64, 2), 3, 7, True, True),
        ((256, 1000, "float32", 32, 4, 32, 4), 3, 2, True, True),
        ((256, 1000, "bfloat16", 16, 4, 32, 3, {"in_registers": True}), 3, 7, True, True),
    ]
    _compiles_at_the_predicted_shared_memory(cases, tmp_path, split_k=True)


def _compiles_at_the_predicted_shared_memory(cases, tmp_path, split_k: bool = False) -> None:
    code = _COMPILE.format(cases=cases, split_k=split_k)
    rows, reports = compile_deviceless(code, tmp_path, log_ptxas=False)
    assert len(rows) == len(cases)
    for row in rows:
        assert row["mosaic"] and row["barrier"], row
        assert row["smem"] == row["predicted"], row
    # ptxas compiled every kernel for sm_90a, without register spills.
    assert len(reports) == len(cases), len(reports)
    assert_no_spills(reports)
