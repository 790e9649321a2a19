"""`kernels/mosaic/rowgroup_layout.py`: the persistent kernels launched as one cluster per
row group (a hardware cluster barrier, no grid-wide barrier), against their references on
fresh random inputs: compiled on a GPU, and executed in GPU interpret mode with the race
detector on (jax >= 0.11.2), where the grid's clusters run one after another, each
cluster's blocks at once. The test bodies are the grid layout's
(`test_kernels_mosaic_persistent_forward_run`, `..._backward_run`), with
``LAYOUT = "rowgroup"`` and plans of more than one row group."""

import pytest
import test_kernels_mosaic_persistent_backward_run as tb
import test_kernels_mosaic_persistent_forward_run as tf
from kernel_cases import assert_no_spills, needs_cuda, run_deviceless
from rhhjax.kernels.mosaic import rowgroup_layout
from rhhjax.kernels.mosaic.plan import PersistentPlan, PlanError


class TestForwardCompiled(tf.TestCompiled):
    LAYOUT = "rowgroup"
    CASES = {
        # (dtype, batch, width, col_blocks, row_blocks, k_chunk, steps, depth): 4 x 16, the
        # paper bf16 plan's shape; 2 row groups of 4
        "case": [("bfloat16", 256, 1000, 16, 4, 64, 3, 3), ("float32", 100, 37, 3, 2, 16, 3, 2)],
        "largest_case": [],
        # the paper bf16 plan's shape; 2 row groups of 3 (f32)
        "multicast_case": [("bfloat16", 256, 1000, 16, 4, 64, 3, 3),
                           ("float32", 100, 37, 3, 2, 16, 3, 2)],
        # the paper bf16 plan's shape, the epilogue in registers, a producer warpgroup
        "registers_case": [("bfloat16", 256, 1000, 16, 4, 64, 3, 3)],
        "producer_case": [("bfloat16", 256, 1000, 16, 4, 64, 3, 3)],
    }  # fmt: skip


class TestForwardInterpret(tf.TestInterpret):
    LAYOUT = "rowgroup"
    CASES = {
        # 2 row groups of one block; 2 row groups of 4 blocks; 3 row groups of 2 (bf16)
        "case": [("float32", 100, 32, 1, 2, 16, 2, 3), ("float32", 100, 37, 3, 2, 16, 3, 2),
                 ("bfloat16", 150, 64, 2, 3, 32, 2, 2)],
        "largest_case": [],
        # 2 row groups of 3 (f32); 3 row groups of 2 (bf16)
        "multicast_case": [("float32", 100, 37, 3, 2, 16, 3, 2),
                           ("bfloat16", 150, 64, 2, 3, 32, 2, 2)],
        # 3 row groups of 2 blocks of 32 units
        "registers_case": [("bfloat16", 150, 64, 2, 3, 32, 2, 2)],
        "producer_case": [("bfloat16", 150, 64, 2, 3, 32, 2, 2)],
    }  # fmt: skip


class TestBackwardCompiled(tb.TestCompiled):
    LAYOUT = "rowgroup"
    CASES = {
        "case": [
            ((256, 1000, "bfloat16", 16, 4, 64, 3), 3, 2, True, True),  # the paper bf16 plan
            ((100, 37, "float32", 3, 2, 32), 2, 3, False, True),
        ],
        "split_case": [((100, 37, "float32", 3, 2, 32), 2, 3, False, True)],
        "largest_case": [],
        "multicast_case": [
            ((256, 1000, "bfloat16", 16, 4, 64, 3), 3, 2, True, True),  # the paper bf16 plan
            ((100, 37, "float32", 3, 2, 32), 2, 3, False, True),
        ],
        "registers_case": [((256, 1000, "bfloat16", 16, 4, 64, 5), 3, 2, True, True)],
    }


class TestBackwardInterpret(tb.TestInterpret):
    LAYOUT = "rowgroup"
    CASES = {
        "case": [
            ((100, 37, "float32", 3, 2, 32), 2, 3, False, True),  # 2 row groups of 3
            ((150, 64, "bfloat16", 2, 3, 32), 3, 2, True, True),  # 3 row groups of 2, dz too
        ],
        "split_case": [((100, 37, "float32", 3, 2, 32), 2, 3, False, True)],
        "largest_case": [],
        "multicast_case": [
            ((100, 37, "float32", 3, 2, 32), 2, 3, False, True),  # 2 row groups of 3
            ((150, 64, "bfloat16", 2, 3, 32), 3, 2, True, True),  # 3 row groups of 2, dz too
        ],
        "registers_case": [((150, 64, "bfloat16", 2, 3, 32, 2), 3, 2, True, True)],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("layout", "plan", "message"),
    [
        ("diagonal", PersistentPlan(64, 64, "float32", col_blocks=2), "is not one of"),
        ("rowgroup", PersistentPlan(64, 17 * 8, "float32", col_blocks=17), "at most 16 column"),
    ],
)
def test_a_layout_that_cannot_run_the_plan_is_one_line(layout, plan, message):
    with pytest.raises(PlanError, match=message) as e:
        rowgroup_layout.check(plan, layout, None)
    assert "\n" not in str(e.value)


def test_the_grid_layout_is_grid_barriers_functions():
    from rhhjax.kernels.mosaic import grid_barrier

    assert rowgroup_layout.functions("grid", None)[:2] == (
        grid_barrier.launch,
        grid_barrier.block_index,
    )


def test_the_grid_of_a_weight_multicast_launches_a_cluster_of_each_columns_row_blocks():
    """Compiled; interpreted, the grid stays one cluster of all blocks."""
    plan = PersistentPlan(256, 1000, "bfloat16", 16, 4, 64, 3, multicast_b=True)
    launch = rowgroup_layout.functions("grid", None, plan)[0]
    clusters = dict(grid=(16,), grid_names=("g",), cluster=(4,), cluster_names=("r",))
    assert launch((4, 16), ("r", "g"), None) == (clusters, {})
    interpreted, scratch = launch((4, 16), ("r", "g"), True)
    assert interpreted["cluster"] == (64,) and "phase_bar" in scratch


_COMPILE = """
import json, os
os.environ["MOSAIC_GPU_DUMP_PTX"] = "1"
from hlo import deviceless as g
g.set_deviceless_env(log_ptxas=False)
import jax, jax.numpy as jnp
from rhhjax.kernels.mosaic import persistent_backward as pb
from rhhjax.kernels.mosaic import persistent_forward as pf
from rhhjax.kernels.mosaic.plan import PersistentPlan
rep = jax.sharding.NamedSharding(g.h100_mesh(), jax.sharding.PartitionSpec())
def sds(shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=rep)
rows = []
for fields, options, layout, steps, depth in {cases!r}:
    plan = PersistentPlan(*fields, **options)
    phases, b, n, k = steps * depth, plan.b_pad, plan.n_pad, plan.k_pad
    mm = jnp.dtype(plan.dtype)
    fwd = (sds((depth * 2 * n, k), mm), sds((b, n)), sds((steps, b, 2, plan.z_width)),
           sds((depth, b, 2, n)), sds((depth, steps, b, plan.z_width)),
           sds((phases, b, n), jnp.uint8))
    bwd = (sds((depth * n, 2 * n), mm), sds((phases, b, n)), sds((phases, b, plan.packed_rows, n)),
           sds((depth, steps, b, plan.z_width)), sds((phases, b, n), jnp.uint8),
           sds((depth, b, 2, n)), None if plan.state_in_packed else sds((phases * b, k)))
    row = []
    forward = lambda *a: pf.persistent_forward(plan, *a, save=True, layout=layout)
    backward = lambda *a: pb.persistent_backward(plan, *a, layout=layout)
    for run, args in ((forward, fwd), (backward, bwd)):
        lowered = jax.jit(run).trace(*args).lower(lowering_platforms=("cuda",))
        text = lowered.as_text()
        lowered.compile()
        grid_barrier = "red.release.gpu" in text
        row.append(["mosaic_gpu" in text, "fence.proxy.async.global" in text,
                    grid_barrier == (layout == "grid")])
    rows.append(row)
print(json.dumps(rows))
"""


@pytest.mark.gpu_compile
@needs_cuda
def test_the_paper_cluster_plans_lower_and_compile_for_an_h100_without_a_gpu(tmp_path):
    """Both kernels at the paper's row-group plans (bf16 4 x 16; f32 4 x 16 at k_chunk 32,
    2 stages), as clusters of 16 with their fenced cluster barrier and no grid semaphore,
    and with A multicast in the cluster; at the paper's grid plans
    with the weights multicast to clusters of a column's 4 row blocks (with the grid
    semaphore); without spills."""
    bf16, f32 = (256, 1000, "bfloat16", 16, 4, 64, 3), (256, 1000, "float32", 16, 4, 32, 2)
    f32_grid = (256, 1000, "float32", 32, 4, 64, 4)
    a, b = dict(multicast_a=True), dict(multicast_b=True)
    cases = [
        (bf16, {}, "rowgroup", 3, 7),
        (f32, {}, "rowgroup", 2, 7),
        (bf16, a, "rowgroup", 3, 7),
        (f32, a, "rowgroup", 2, 7),
        (bf16, b, "grid", 3, 7),
        (f32_grid, b, "grid", 2, 7),
    ]
    rows, reports = run_deviceless(_COMPILE.format(cases=cases), tmp_path)
    assert rows == [[[True, True, True]] * 2] * len(cases), rows
    assert len(reports) == 2 * len(cases), len(reports)
    assert_no_spills(reports)
    ptx = [path.read_text() for path in (tmp_path / "ptxas").glob("*.ptx")]
    multicasts = sum("multicast::cluster" in text for text in ptx)
    assert (len(ptx), multicasts) == (2 * len(cases), 2 * 4), (len(ptx), multicasts)


@pytest.mark.parametrize(
    ("batch", "width", "dtype"),
    [(256, 1000, "bfloat16"), (256, 1000, "float32"), (256, 128, "float32"), (37, 300, "bfloat16")],
)
def test_the_rowgroup_plan_is_a_runnable_one_of_at_most_16_column_blocks(batch, width, dtype):
    """`persistent.plan_for(..., "rowgroup")`: both kernels accept it, one cluster per row
    group fits an H100, and wherever the grid's plan has <= 16 column blocks (so is one of
    its candidates) it is that plan."""
    from rhhjax.kernels.mosaic import persistent_backward as pb

    from rhhjax.ops import persistent

    plan = persistent.plan_for(batch, width, dtype, "rowgroup")
    plan.check()
    pb.check_plan(plan)
    rowgroup_layout.check(plan, "rowgroup", None)
    assert plan.col_blocks <= rowgroup_layout.MAX_CLUSTER and plan.n_pad >= width
    grid = persistent.plan_for(batch, width, dtype)
    assert (plan == grid) == (grid.col_blocks <= rowgroup_layout.MAX_CLUSTER)
    if (width, dtype) == (1000, "float32"):  # 64 units need k_chunk 32 in f32
        assert (plan.col_blocks, plan.row_blocks, plan.k_chunk) == (16, 4, 32)


def test_the_row_group_layouts_cluster_barriers_count_in_both_kernels_shared_memory():
    """`launch`'s cluster barriers (2 mbarriers of 8 B a block; the compiled grid allocates
    none) are in both kernels' counts in the row-group layout: a plan whose limit is exactly
    the grid's count passes the grid's checks and is refused in row groups, at the kernels'
    entry too (before anything is traced)."""
    import dataclasses

    import jax
    import jax.numpy as jnp
    import numpy as np
    from rhhjax.kernels.mosaic import persistent_backward as pb
    from rhhjax.kernels.mosaic import persistent_forward as pf
    from rhhjax.kernels.mosaic import plan as pp

    plan = PersistentPlan(256, 1000, "bfloat16", 16, 4, 64, 3)  # the paper's bf16 row groups
    bar = rowgroup_layout.launch((4, 16), ("r", "g"), None)[1]["phase_bar"]
    assert np.prod(bar.num_barriers) * pp.MBARRIER_BYTES == pp.layout_smem_bytes("rowgroup") == 16
    assert rowgroup_layout.functions("grid", None)[0]((4, 16), ("r", "g"), None)[1] == {}
    assert pp.layout_smem_bytes("grid") == 0
    assert plan.smem_bytes(layout="rowgroup") == plan.smem_bytes() + 16
    assert pb.backward_smem_bytes(plan, layout="rowgroup") == pb.backward_smem_bytes(plan) + 16

    steps, depth = 2, 2
    phases, b, n, mm = steps * depth, plan.b_pad, plan.n_pad, jnp.bfloat16
    sds = jax.ShapeDtypeStruct
    z, bias = sds((depth, steps, b, plan.z_width), jnp.float32), sds((depth, b, 2, n), jnp.float32)
    mask = sds((phases, b, n), jnp.uint8)
    forward = (sds((depth * 2 * n, plan.k_pad), mm), sds((b, n), jnp.float32),
               sds((steps, b, 2, plan.z_width), jnp.float32), bias, z, mask)  # fmt: skip
    backward = (sds((depth * n, 2 * n), mm), sds((phases, b, n), jnp.float32),
                sds((phases, b, plan.packed_rows, n), jnp.float32), z, mask, bias)  # fmt: skip
    full = dataclasses.replace(plan, smem_limit=plan.smem_bytes())
    full.check()
    with pytest.raises(PlanError, match=f"needs {full.smem_limit + 16} B of shared memory"):
        full.check("rowgroup")
    with pytest.raises(PlanError, match=f"needs {full.smem_limit + 16} B of shared memory"):
        pf.persistent_forward(full, *forward, save=True, layout="rowgroup")
    full = dataclasses.replace(plan, smem_limit=pb.backward_smem_bytes(plan))
    pb.check_plan(full)
    with pytest.raises(PlanError, match=f"needs {full.smem_limit + 16} B of shared memory"):
        pb.check_plan(full, layout="rowgroup")
    with pytest.raises(PlanError, match=f"needs {full.smem_limit + 16} B of shared memory"):
        pb.persistent_backward(full, *backward, layout="rowgroup")
