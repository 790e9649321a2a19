"""The persistent kernel's static plan: ownership, padded extents, shared memory, weight
slices, co-residency (refused with one line) and L2 traffic."""

import dataclasses
import os
import subprocess
import sys

import pytest
from benchmark_scripts import BENCH
from kernel_cases import needs_cuda
from rhhjax.kernels.mosaic import plan as pp
from rhhjax.kernels.mosaic import rowgroup_layout

from rhhjax.errors import UserError


def test_paper_bf16_plan_is_one_block_per_sm_with_both_halves_of_8_units():
    plan = pp.paper_plan("bfloat16")
    plan.check()
    assert (plan.grid, plan.units_per_block, plan.cols_per_block) == (132, 8, 16)
    assert (plan.b_pad, plan.n_pad, plan.k_pad, plan.k2_pad) == (256, 1056, 1024, 2112)
    # The forward kernel's allocation with every option: 4 stages x (256 state rows + 16
    # weight columns) x 64 K x 2 B; f32 state, accumulator copy, 5 staged f32 tiles and the
    # bf16 state cast per (row, unit): 4 + 8 + 20 + 2 B; 10 mbarriers of 8 B
    # (tests/test_kernels_mosaic_persistent_forward.py checks it against Mosaic GPU's own count).
    assert plan.smem_bytes() == 4 * (256 + 16) * 64 * 2 + 256 * 8 * 34 + 80 == 208_976
    assert plan.smem_bytes() <= 227 * 1024


def test_paper_f32_plan_needs_two_stages_and_says_so_in_one_line():
    plan = pp.paper_plan("float32")
    assert plan.smem_bytes() == 4 * (256 + 16) * 64 * 4 + 256 * 8 * 36 + 80
    with pytest.raises(pp.PlanError) as e:
        plan.check()
    message = str(e.value)
    assert "\n" not in message and "shared memory" in message and "stages" in message
    assert isinstance(e.value, UserError)
    smaller = dataclasses.replace(plan, stages=2)
    smaller.check()


def test_k_extents_the_kernels_cannot_use_are_refused_in_one_line():
    """k_pad > n_pad (the forward would read state columns no block writes) and 2 * n_pad
    not a multiple of k_chunk (the backward's K) are refused; the paper plans pass."""
    with pytest.raises(pp.PlanError, match="k_pad 192 > n_pad 184") as e:
        pp.PersistentPlan(batch=64, width=184, col_blocks=23).check()
    assert "\n" not in str(e.value)
    with pytest.raises(pp.PlanError, match="2 \\* n_pad = 160 not a multiple of k_chunk 64"):
        pp.PersistentPlan(batch=64, width=64, col_blocks=20).check()
    pp.PersistentPlan(batch=64, width=184, col_blocks=23, k_chunk=8).check()
    pp.paper_plan(row_blocks=4, col_blocks=33).check()


def test_more_blocks_than_sms_are_refused_in_the_grid_layout_before_anything_runs():
    with pytest.raises(pp.PlanError, match="co-resident.*layout 'rowgroup'"):
        rowgroup_layout.check(pp.paper_plan(row_blocks=2), "grid", None)  # 264 blocks, 132 SMs
    rowgroup_layout.check(pp.paper_plan(row_blocks=2, col_blocks=66), "grid", None)  # 132


def test_odd_sizes_pad_units_to_wgmma_widths_and_rows_to_warpgroups():
    plan = pp.PersistentPlan(batch=5, width=37, dtype="float32", col_blocks=4, k_chunk=16)
    assert plan.units_per_block == 12 and plan.cols_per_block % 8 == 0
    assert plan.n_pad == 48 >= 37 and plan.k_pad == 48 and plan.b_pad == 64
    hyper = pp.PersistentPlan(batch=256, width=128, col_blocks=16)
    hyper.check()
    assert (hyper.units_per_block, hyper.n_pad) == (8, 128)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("dtype", "float16", "dtype"),
        ("k_chunk", 12, "multiple of 8"),
        ("stages", 0, ">= 1"),
    ],
)
def test_bad_fields_are_one_line_errors(field, value, message):
    with pytest.raises(pp.PlanError, match=message):
        pp.PersistentPlan(batch=256, width=1000, **{field: value})


@pytest.mark.parametrize("block_units", [None, 16, 32])
@pytest.mark.parametrize("col_blocks", [1, 2, 4, 33])
def test_a_blocks_box_of_z_is_never_a_whole_row_of_z_unless_every_box_is_inside(
    col_blocks, block_units
):
    """z and dz are read and written as [rows, units] boxes at each block's units. A box as
    wide as z's rows is contiguous, and Mosaic GPU copies it with a bulk copy that is not
    clipped per row: a box past z_width would land on the next rows (an H100 measured the
    padding blocks' zero dz over the real one at width 13 of 4 blocks of 16). So z_width is
    n_pad, or wider than a block's units; and it covers the width (rounded up to 4)."""
    for width in range(1, (block_units or 40) * col_blocks + 1, 3):
        plan = pp.PersistentPlan(64, width, "float32", col_blocks, k_chunk=32, units=block_units)
        units, n_pad, z_width = plan.units_per_block, plan.n_pad, plan.z_width
        assert z_width == n_pad or z_width > units, (width, units, n_pad, z_width)
        assert min(n_pad, -(-width // 4) * 4) <= z_width <= n_pad, (width, z_width)


def test_the_width_measured_wrong_on_a_gpu_reads_z_at_its_padded_width():
    plan = pp.PersistentPlan(5, 13, "float32", col_blocks=4, k_chunk=64, units=16)
    assert (plan.units_per_block, plan.n_pad, plan.z_width) == (16, 64, 64)


# A 4-block kernel whose block c stores a [64, 16] box at units 16 c of an f32 array
# [3, 6, 64, width]; compiled for an H100 without a GPU, its PTX printed (MOSAIC_GPU_DUMP_PTX).
_STORE_PROBE = """
import sys, jax, jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from hlo import deviceless

def body(out_ref, smem):
    c = jax.lax.axis_index("c")
    smem[...] = jnp.zeros((64, 16), jnp.float32)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, out_ref.at[1, 2, pl.ds(0, 64), pl.ds(c * 16, 16)])
    plgpu.wait_smem_to_gmem(0)

out = jax.ShapeDtypeStruct((3, 6, 64, int(sys.argv[1])), jnp.float32)
kernel = plgpu.kernel(body, out_type=out, grid=(4,), grid_names=("c",),
                      scratch_types=[plgpu.SMEM((64, 16), jnp.float32)])
mesh = deviceless.h100_mesh()
with deviceless.lowering_device(mesh):
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    jax.jit(kernel, out_shardings=sharding).lower().compile()
"""


@pytest.mark.gpu_compile
@needs_cuda
@pytest.mark.parametrize(("width", "store"), [
    (16, "cp.async.bulk.global.shared::cta"),  # a box as wide as the array: no descriptor
    (64, "cp.async.bulk.tensor.4d.global.shared::cta"),  # clipped per dimension
])  # fmt: skip
def test_mosaic_gpu_stores_a_box_as_wide_as_its_array_with_a_copy_no_dimension_clips(width, store):
    """Why `scales_width` never makes z one block's units wide: Mosaic GPU stores a box
    spanning whole rows with a plain bulk copy bounded by the array's end only, so a block's
    box past the width lands on the next rows; a narrower box is a tensor copy, which drops
    what lies past the width."""
    env = dict(os.environ, MOSAIC_GPU_DUMP_PTX="1", JAX_SKIP_CUDA_CONSTRAINTS_CHECK="1")
    path = os.pathsep.join([str(BENCH), *sys.path])  # benchmarks/hlo/ as hlo
    env |= {"CUDA_VISIBLE_DEVICES": "-1", "PYTHONPATH": path}
    run = subprocess.run(
        [sys.executable, "-c", _STORE_PROBE, str(width)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    stores = [line for line in (run.stdout + run.stderr).splitlines() if "cp.async.bulk." in line]
    stores = [line for line in stores if ".global.shared::cta" in line]
    assert len(stores) == 1 and store + ".bulk_group" in stores[0], stores
