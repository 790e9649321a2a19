"""Batches that fill the chip (apart: test_ops_persistent.py nears its 600 lines).

The row-group layout's plans at batch 512 (8 clusters of 16 on 128 SMs) and 1024 (16 of 16,
past the 132 SMs: in waves, which only the row-group layout allows); the model with
more row groups than run at once against `scan` (loss and every gradient): kernels' references,
GPU interpret mode (jax >= 0.11.2), compiled on a GPU; ``gpu_compile``: the paper step at those
batches compiled for an H100 without a GPU.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_cases import MosaicGpuMode, assert_no_spills, compile_paper_step, needs_cuda
from model_cases import (
    KERNEL_TOL,
    KERNEL_TOL_COMPILED,
    KernelModelMatchesScan,
    assert_trees_close,
    loss_and_grads,
)
from rhhjax.kernels.hardware import H100
from rhhjax.kernels.mosaic import interpret as gpu_interpret
from rhhjax.kernels.mosaic import persistent_backward as pb
from rhhjax.kernels.mosaic import rowgroup_layout
from rhhjax.kernels.mosaic.plan import PersistentPlan, PlanError

from rhhjax import models
from rhhjax.ops import persistent

ROWGROUP = persistent.PersistentVariant("rowgroup")  # the default


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("batch", [256, 512, 1024])
def test_a_paper_width_batch_plans_a_cluster_of_16_per_64_rows(batch, dtype):
    """Same work per block at every batch: 64 rows x 64 units, batch / 64 clusters of 16 (64,
    128, 256 blocks: 1024's in two waves), each block within an SM's shared memory in both
    kernels; today's variant there is the row-group layout, first of the candidates."""
    plan = persistent.plan_for(batch, 1000, dtype, "rowgroup")
    fields = (plan.row_blocks, plan.col_blocks, plan.rows_per_block, plan.units_per_block)
    assert fields == (batch // 64, 16, 64, 64)
    assert plan.grid == batch // 4 and (plan.grid > H100.sms) == (batch == 1024)
    assert max(plan.smem_bytes(), pb.backward_smem_bytes(plan)) <= H100.smem_per_block_optin
    rowgroup_layout.check(plan, "rowgroup", None)
    assert persistent.variant_candidates(batch, 1000, 128, dtype)[0] == ROWGROUP
    layout, main, hyper = persistent.variant_plans(ROWGROUP, batch, 1000, 128, dtype)
    assert (layout, main, hyper.row_blocks) == ("rowgroup", plan, batch // 64)


def test_the_grid_layout_refuses_batch_1024_in_one_line_naming_the_row_group_layout():
    with pytest.raises(PlanError) as error:
        persistent.plan_for(1024, 1000, "bfloat16", "grid")
    line = str(error.value)
    assert "\n" not in line and "co-resident" in line and "use layout 'rowgroup'" in line
    with pytest.raises(PlanError, match="256 blocks exceeds the 132 SMs.*layout 'rowgroup'"):
        rowgroup_layout.check(persistent.plan_for(1024, 1000, "bfloat16", "rowgroup"), "grid", None)
    with pytest.raises(PlanError, match="layout 'rowgroup'"):
        persistent.variant_plans(persistent.PersistentVariant("grid"), 1024, 1000, 128, "bfloat16")


def test_a_row_group_plan_past_the_sms_still_refuses_a_cluster_over_16_or_over_shared_memory():
    wide = PersistentPlan(1024, 2000, "bfloat16", col_blocks=32, row_blocks=16)  # 512 blocks
    with pytest.raises(PlanError, match="at most 16 column blocks"):
        rowgroup_layout.check(wide, "rowgroup", None)
    tall = PersistentPlan(4096, 1000, "bfloat16", col_blocks=16, row_blocks=16)  # 256 rows
    rowgroup_layout.check(tall, "rowgroup", None)  # 256 blocks: co-residency is not asked
    with pytest.raises(PlanError, match="shared memory per block"):
        tall.check()


# ----------------------------------------------------------------------------- the model


class RowGroupsInTurn(MosaicGpuMode):
    """The HyperRHN in the row-group layout at ``batch_case`` = (hidden, hyper_hidden, depth,
    batch, length, dtype, main plan's (row groups, blocks a cluster)) against `scan`: loss and
    every gradient, gate dropout. Where the grid outgrows what runs at once (an H100's SMs;
    interpreted, NPROC 3: two blocks), the grid layout is refused and the row groups run in
    turn."""

    IMPL = "persistent"
    NPROC = None  # interpreted: XLA's pool as this size would hold it, for the plans' checks
    model = KernelModelMatchesScan.model

    def test_more_row_groups_than_run_at_once_match_scan(self, batch_case, monkeypatch):
        hidden, hyper_hidden, depth, batch, length, dtype, shape = batch_case
        if self.NPROC:
            monkeypatch.setenv("NPROC", str(self.NPROC))
        persistent.interpret_plan.cache_clear()
        base = dict(
            type="hyperrhn", vocab_size=11, embed_dim=5, hidden=hidden, hyper_hidden=hyper_hidden,
            depth=depth, dropout="gate", keep=0.7, dtype=dtype,
        )  # fmt: skip
        model = self.model(models.ModelConfig(**base, impl=self.IMPL, persistent=ROWGROUP))
        plan = persistent._plan_of(model.spec, batch, hidden)
        assert (plan.row_blocks, plan.col_blocks) == shape
        at_once = gpu_interpret.max_blocks() if self.INTERPRET else H100.sms
        if plan.grid > at_once:
            grid = persistent.PersistentVariant("grid")
            with pytest.raises(PlanError):
                persistent.variant_plans(grid, batch, hidden, 0, dtype, self.INTERPRET)
        scan = models.build_model(models.ModelConfig(**base, impl="scan"))
        params = models.init_params(scan, jax.random.key(batch))
        tokens = jnp.asarray(np.random.default_rng(batch).integers(0, 11, (batch, length + 1)))
        key = jax.random.key(depth)
        actual = loss_and_grads(model, params, tokens, key)
        expected = loss_and_grads(scan, params, tokens, key)
        persistent.interpret_plan.cache_clear()
        assert_trees_close(actual, expected, self.TOLERANCE[dtype])


# 4 row groups (f32 at width 64: 64 rows a block) of one block of 64 units (interpreted: the
# fewest blocks) or 4 of 16 (the H100 plan)
SMALL_CASE = (64, 13, 2, 200, 3, "float32", (4, 1))


@pytest.mark.pure_jax
class TestPersistentReferenceRowGroups(RowGroupsInTurn):
    """The kernels' references in place (the H100 plan, its padding)."""

    REFERENCES = True
    TOLERANCE = KERNEL_TOL
    CASES = {"batch_case": [(*SMALL_CASE[:-1], (4, 4))]}


class TestPersistentInterpretRowGroups(RowGroupsInTurn):
    """GPU interpret mode, race detector on: 4 row groups where the checks hold 2 blocks."""

    INTERPRET = True
    TOLERANCE = KERNEL_TOL
    NPROC = 3
    CASES = {"batch_case": [SMALL_CASE]}


class TestPersistentCompiledBatch(RowGroupsInTurn):
    """Compiled on a GPU (`gpu_suite.sh test`), paper width, bf16: batch 512 (8 clusters of
    16, 128 SMs) and 1024 (16 clusters: past the 132 SMs, in waves)."""

    TOLERANCE = KERNEL_TOL_COMPILED
    CASES = {
        "batch_case": [
            (1000, 128, 2, 512, 3, "bfloat16", (8, 16)),
            (1000, 128, 2, 1024, 3, "bfloat16", (16, 16)),
        ]
    }


# ----------------------------------------------------------------------------- deviceless

# Every shared-memory allocation Mosaic GPU sizes, written to smem.json when the process ends.
_SMEM_COUNTER = """
import atexit
from jax.experimental.mosaic.gpu import core as mosaic_core
allocated, _size = [], mosaic_core._smem_tree_size
def _counted(tree):
    allocated.append(_size(tree))
    return allocated[-1]
mosaic_core._smem_tree_size = _counted
atexit.register(lambda: open("smem.json", "w").write(json.dumps(allocated)))
"""


@pytest.mark.gpu_compile
@needs_cuda
@pytest.mark.parametrize("batch", [512, 1024])
def test_the_paper_step_at_a_chip_filling_batch_compiles_for_an_h100_without_a_gpu(tmp_path, batch):
    """configs/ptb.py's HyperRHN step (width 1000, depth 7, 100 steps) at ``batch`` in the
    row-group layout, bf16 and f32: each cell's forward and backward kernels at the shared
    memory their plans count in that layout (a block's, as at batch 256), within an SM's; no
    spill."""
    dtypes = ["bfloat16", "float32"]
    kernels = ["persistent_highway_forward", "persistent_highway_backward", "rowgroup"]
    overrides = {"train.batch_size": batch, "model.persistent.layout": "rowgroup"}
    rows, reports = compile_paper_step(
        "persistent", dtypes, kernels, tmp_path, _SMEM_COUNTER, overrides
    )
    for row, dtype in zip(rows, dtypes, strict=True):
        assert (row["dtype"], row["batch"], row["variant"]) == (dtype, batch, ROWGROUP.text())
        assert min(row["kernels"].values()) >= 1, row
    assert len(reports) >= 4 * len(dtypes)  # each cell's forward and backward
    assert_no_spills(reports)
    allocated = json.loads((tmp_path / "smem.json").read_text())
    for dtype in dtypes:
        plan = persistent.plan_for(batch, 1000, dtype, "rowgroup")
        counted = {
            plan.smem_bytes(layout="rowgroup"),
            pb.backward_smem_bytes(plan, layout="rowgroup"),
        }
        assert counted <= set(allocated), allocated
    assert max(allocated) <= H100.smem_per_block_optin
    print(f"batch {batch}: shared memory per block (B)", sorted(set(allocated)))
