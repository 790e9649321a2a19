"""Static plan of the persistent highway kernels: ownership, padding, shared memory and
co-residency. Block (r, g) of row_blocks x col_blocks owns rows ``r * rows_per_block ..``
and units ``g * units_per_block ..`` (h- and t-columns). docs/design.md."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from rhhjax.kernels.hardware import H100

from rhhjax.errors import UserError

WGMMA_M = 64
UNIT_MULTIPLE = 4  # 2 * units must be a multiple of 8 (wgmma N)
REGISTER_UNITS = 32  # `in_registers`: the swizzled epilogue tiles' rows, 32 B and up
BIAS_ROWS = 2  # `in_registers`: a block's bias, the h and t gates' rows
DTYPES = ("float32", "bfloat16")
MBARRIER_BYTES = 8
PHASE_BARRIERS = 2  # the row-group layout's cluster barriers, one per phase parity


class PlanError(UserError):
    """A persistent-kernel plan an H100 cannot run co-resident."""


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def forward_inputs(has_z: bool, in_registers: bool = False) -> tuple[str, ...]:
    """The forward's staged f32 [rows, u] epilogue inputs, in slot order; in registers the
    bias is one row (`BIAS_ROWS`), not tiles."""
    return ("b_h", "b_t") * (not in_registers) + ("z",) * has_z + ("x_h", "x_t")


def forward_saved_rows(save: bool, has_z: bool) -> tuple[str, ...]:
    """The forward's saved-row tiles after the input state: h, t, or with z ``full``'s
    halves (the backward recomputes the gates from them)."""
    if not save:
        return ()
    return ("full_h", "full_t") if has_z else ("h", "t")


def forward_staging_slots(has_z: bool, save: bool, in_registers: bool = False) -> tuple[int, tuple]:
    """(number of f32 [rows, u] staging slots, the slot of each saved row)."""
    ins = forward_inputs(has_z, in_registers)
    reused = len(ins) - 2
    outs = forward_saved_rows(save, has_z)
    where = tuple(i if i < reused else len(ins) + i - reused for i in range(len(outs)))
    return len(ins) + max(0, len(outs) - reused), where


def layout_smem_bytes(layout: str) -> int:
    """The shared memory ``layout`` adds to a block: row groups' `PHASE_BARRIERS` mbarriers."""
    return MBARRIER_BYTES * PHASE_BARRIERS * (layout == "rowgroup")


def scales_width(width: int, units: int, n_pad: int, multiple: int = 4) -> int:
    """`PersistentPlan.z_width`: never exactly one block's units when there are several
    (a whole-row box would be a bulk copy not clipped at z_width)."""
    z_width = min(n_pad, max(_round_up(width, multiple), units))
    return n_pad if z_width == units else z_width


@dataclasses.dataclass(frozen=True)
class PersistentPlan:
    """One persistent-kernel call's configuration (hashable). ``units``: per block (None:
    the fewest covering ``width``); ``multicast_a`` / ``_b``: each A chunk once per row group
    / each weight chunk once per column's cluster; ``split_k``: `gemm.SplitK` (backward);
    ``in_registers``: the GEMM tile's epilogue reads its accumulators in registers (no f32
    tile in shared memory, `gemm.Tile`); ``producer``: a second warpgroup issues the K
    loop's loads (`gemm.Producer`)."""

    batch: int
    width: int
    dtype: str = "bfloat16"
    col_blocks: int = H100.sms
    row_blocks: int = 1
    k_chunk: int = 64
    stages: int = 4
    sm_count: int = H100.sms
    smem_limit: int = H100.smem_per_block_optin
    units: int | None = None
    multicast_a: bool = False
    multicast_b: bool = False
    split_k: bool = False
    in_registers: bool = False
    producer: bool = False

    def __post_init__(self):
        for name in ("batch", "width", "col_blocks", "row_blocks", "k_chunk", "stages"):
            if getattr(self, name) < 1:
                raise PlanError(f"PersistentPlan.{name} must be >= 1, got {getattr(self, name)}.")
        if self.dtype not in DTYPES:
            raise PlanError(f"PersistentPlan.dtype must be one of {DTYPES}, got {self.dtype!r}.")
        if self.k_chunk % 8:
            raise PlanError(f"PersistentPlan.k_chunk must be a multiple of 8, got {self.k_chunk}.")
        if self.units is not None and (self.units % UNIT_MULTIPLE or self.units < 1):
            raise PlanError(
                f"PersistentPlan.units must be a positive multiple of {UNIT_MULTIPLE}, "
                f"got {self.units}."
            )
        if self.units is not None and self.units * self.col_blocks < self.width:
            raise PlanError(
                f"PersistentPlan: {self.col_blocks} blocks of {self.units} units do not cover "
                f"width {self.width}."
            )

    @property
    def grid(self) -> int:
        return self.row_blocks * self.col_blocks

    @property
    def units_per_block(self) -> int:
        if self.units is not None:
            return self.units
        return _round_up(-(-self.width // self.col_blocks), UNIT_MULTIPLE)

    @property
    def cols_per_block(self) -> int:
        return 2 * self.units_per_block

    @property
    def n_pad(self) -> int:
        return self.col_blocks * self.units_per_block

    @property
    def z_width(self) -> int:
        """Units of z [L, T, b_pad, z_width] and dz; TMA reads past it as zero."""
        multiple = 32 if self.in_registers else 4  # swizzled f32 TMA boxes
        return scales_width(self.width, self.units_per_block, self.n_pad, multiple)

    @property
    def state_in_packed(self) -> bool:
        """Whether ``packed`` holds each phase's input state (not in f32: ``s_mm`` does)."""
        return self.dtype != "float32"

    @property
    def packed_rows(self) -> int:
        """K of ``packed [P, b_pad, K, n_pad]``."""
        return 2 + self.state_in_packed

    @property
    def k_pad(self) -> int:
        """K of the forward GEMM: the width in whole chunks."""
        return _round_up(self.width, self.k_chunk)

    @property
    def k2_pad(self) -> int:
        """K of the backward GEMM: ``2 * n_pad`` in whole chunks."""
        return _round_up(2 * self.n_pad, self.k_chunk)

    @property
    def rows_per_block(self) -> int:
        return _round_up(-(-self.batch // self.row_blocks), WGMMA_M)

    @property
    def b_pad(self) -> int:
        return self.row_blocks * self.rows_per_block

    @property
    def itemsize(self) -> int:
        return jnp.dtype(self.dtype).itemsize

    @property
    def staged(self) -> bool:
        """Whether the main GEMM's stages are the kernel's own buffers (`gemm.gemm_nt_staged`
        or the `gemm.Producer`'s), not `gemm.gemm_nt_to_smem`'s."""
        return self.multicast or self.producer

    @property
    def multicast(self) -> bool:
        return self.multicast_a or self.multicast_b

    def staged_options(self) -> str:
        """The fields that make it `staged`, for an error line."""
        fields = ("multicast_a", "multicast_b", "producer")
        return " and ".join(f for f in fields if getattr(self, f))

    def staged_stages(self, k_steps: int) -> int:
        """Stages of `gemm.StagedOperands` for a K loop of ``k_steps`` chunks."""
        return max(min(self.stages, k_steps), 1)

    def pipeline_barriers(self, stages: int) -> int:
        """mbarriers of a K pipeline of ``stages``: a stage's (A and B apart in the kernel's own
        buffers), a multicast's free one, a producer's free one, and its go."""
        return stages * (1 + self.staged + self.multicast + self.producer) + self.producer

    def smem_bytes(
        self, has_z: bool = True, has_mask: bool = True, save: bool = True, layout: str = "grid"
    ) -> int:
        """Shared memory per block of the forward kernel in ``layout``, every option by default."""
        rows, units, item = self.rows_per_block, self.units_per_block, self.itemsize
        slots, _ = forward_staging_slots(has_z, save, self.in_registers)
        pipeline = [
            self.stages * rows * self.k_chunk,
            self.stages * self.cols_per_block * self.k_chunk,
        ]
        pre = 0 if self.in_registers else rows * self.cols_per_block * 4
        buffers = [rows * units * 4, slots * rows * units * 4, rows * units * item]
        buffers.append(BIAS_ROWS * units * 4 * self.in_registers)
        barriers = self.pipeline_barriers(self.stages)
        barriers += len(forward_inputs(has_z, self.in_registers)) + has_mask + self.in_registers
        sizes = [b * item for b in pipeline] + [pre, *buffers]
        tiles = sum(map(self._aligned, sizes))
        return tiles + MBARRIER_BYTES * barriers + layout_smem_bytes(layout)

    @staticmethod
    def _aligned(nbytes: int) -> int:
        return _round_up(nbytes, H100.smem_alignment)

    def check(self, layout: str = "grid") -> None:
        """PlanError unless K suits the kernels and a block fits the shared memory in ``layout``."""
        if self.k_pad > self.n_pad:
            raise PlanError(
                f"persistent plan has k_pad {self.k_pad} > n_pad {self.n_pad} (width "
                f"{self.width} in k_chunk {self.k_chunk}, {self.col_blocks} column blocks): "
                "the forward would read unwritten state columns; lower k_chunk."
            )
        self.check_backward_k()
        if self.in_registers and self.units_per_block % REGISTER_UNITS:
            raise PlanError(
                f"persistent plan in_registers needs units_per_block a multiple of "
                f"{REGISTER_UNITS} (the uint8 mask tile's 32-byte swizzle), got "
                f"{self.units_per_block}: choose units so it is."
            )
        if self.producer and (self.multicast or self.split_k):
            raise PlanError("persistent plan: producer runs without multicast and split_k.")
        need = self.smem_bytes(layout=layout)
        if need > self.smem_limit:
            raise PlanError(
                f"persistent plan needs {need} B of shared memory per block, over the "
                f"{self.smem_limit} B limit ({self.dtype}, rows {self.rows_per_block}, "
                f"k_chunk {self.k_chunk}, stages {self.stages}): lower stages or k_chunk, "
                "or raise row_blocks."
            )

    def check_interpretable(self) -> None:
        """PlanError unless GPU interpret mode can run the grid as one cluster."""
        from rhhjax.kernels.mosaic import interpret as gpu_interpret

        reason = gpu_interpret.cluster_too_large(self.grid)
        if reason is not None:
            raise PlanError(
                f"persistent plan of {self.row_blocks} x {self.col_blocks} blocks (batch "
                f"{self.batch}, width {self.width}): {reason}"
                + ("" if "NPROC" in reason else "; choose a plan of fewer blocks")
            )

    def check_backward_k(self) -> None:
        if (2 * self.n_pad) % self.k_chunk:
            raise PlanError(
                f"persistent plan has 2 * n_pad = {2 * self.n_pad} not a multiple of k_chunk "
                f"{self.k_chunk} (the backward's K); lower k_chunk or change col_blocks."
            )

    def check_grid(self) -> None:
        """PlanError unless grid <= SMs (else the grid layout's grid barrier deadlocks)."""
        if self.grid > self.sm_count:
            raise PlanError(
                f"persistent grid of {self.grid} blocks exceeds the {self.sm_count} SMs: "
                "blocks would not be co-resident and the grid barrier would deadlock; use "
                "layout 'rowgroup' (clusters of at most 16 blocks) or fewer row blocks."
            )


def paper_plan(dtype: str = "bfloat16", **overrides) -> PersistentPlan:
    """The paper's main cell (n = 1000, batch 256) on an H100."""
    return PersistentPlan(batch=256, width=1000, dtype=dtype, **overrides)
