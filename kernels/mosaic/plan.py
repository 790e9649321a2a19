"""Static plan of the persistent whole-sequence highway kernel: ownership, shared memory,
co-residency and L2 traffic (its time prediction: `rhhjax.ops.persistent_cost`).

The persistent kernel runs every micro-layer phase of a sequence inside ONE launch. Its grid
is ``row_blocks x col_blocks`` blocks, at most one per SM. Block ``(r, g)`` owns

* rows ``r * rows_per_block ..`` of the batch (``row_blocks = 1``: the whole batch), and
* units ``g * units_per_block ..`` of the state, i.e. ``2 * units_per_block`` gate columns:
  the h-columns AND the t-columns of its units, so the gate combine is block-local.

Per forward phase a block streams its rows of the full state ``[rows, K]`` (bf16 / f32) and
its weight slice ``[K, 2, units]`` through a ``stages``-deep shared-memory pipeline in
``k_chunk``-wide chunks (K chunks in a fixed order, float32 accumulation), applies scale,
bias, gates and combine in the epilogue, writes its state slice and saved gates, then meets
the others at a grid barrier. The backward phase is the transpose (rows of ``W`` for its
units, ``K = 2 * n_pad``): the same bytes. ``tests/persistent_schedule.py`` emulates this
schedule in pure JAX; this module only counts, and `rhhjax.ops.persistent_cost` turns the
counts into a labelled time PREDICTION.

Padded extents: ``n_pad = col_blocks * units_per_block`` (``units_per_block =
ceil(n / col_blocks)``, rounded up to ``UNIT_MULTIPLE`` so ``2 * units`` is a wgmma N),
``k_pad = n`` rounded up to ``k_chunk`` (backward: ``k2_pad = 2 * n_pad`` likewise),
``b_pad = row_blocks * rows_per_block`` with ``rows_per_block`` a multiple of 64 (the wgmma M
of one warpgroup).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from rhhjax.kernels.hardware import H100

from rhhjax.errors import UserError

WGMMA_M = 64  # rows of one warpgroup's wgmma tile
UNIT_MULTIPLE = 4  # 2 * units_per_block must be a multiple of 8 (wgmma N)
DTYPES = ("float32", "bfloat16")


class PlanError(UserError):
    """A persistent-kernel plan that an H100 cannot run co-resident (one clear line)."""


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def forward_inputs(has_z: bool, z_inside: bool = False) -> tuple[str, ...]:
    """The forward kernel's f32 [rows, u] epilogue inputs staged in shared memory, in slot
    order: those loaded every phase, then x U's halves (loaded at layer 0, kept for the
    step's layers). A dropout mask is not among them: its uint8 tile shares the buffer of
    the state's matmul-dtype cast (`kernels/mosaic/keep_mask.py`). ``z_inside`` (the hyper
    cell inside the kernel): z's slot holds ``s_hyper P_l`` from the kernel's own GEMM, and
    "pz", the projection's bias p_l broadcast over rows, is loaded beside it (z = both)."""
    scales = ("z", "pz") if z_inside else ("z",) if has_z else ()
    return ("b_h", "b_t", *scales, "x_h", "x_t")


def forward_saved_rows(save: bool, has_z: bool) -> tuple[str, ...]:
    """The forward kernel's saved-row tiles, in packed's order after the input state's row
    (row 0, stored from the state buffer; none in f32: `PersistentPlan.state_in_packed`):
    the gates h, tg, or with z the halves of the
    unscaled pre-activation ``full``, from which the backward recomputes the gates (it needs
    ``full`` for dz anyway: two saved rows, not four)."""
    if not save:
        return ()
    return ("full_h", "full_t") if has_z else ("h", "t")


def forward_staging_slots(has_z: bool, save: bool, z_inside: bool = False) -> tuple[int, tuple]:
    """(number of f32 [rows, u] staging slots, the slot of each saved-row tile): a saved row
    reuses the slot of an input loaded every phase (all read before any is overwritten),
    past those it takes a slot of its own (x U's slots must survive the step's layers).
    With ``z_inside`` two saved rows take b's slots: z's stays free for z's own store."""
    ins = forward_inputs(has_z, z_inside)
    reused = len(ins) - 2
    outs = forward_saved_rows(save, has_z)
    where = tuple(i if i < reused else len(ins) + i - reused for i in range(len(outs)))
    return len(ins) + max(0, len(outs) - reused), where


def check_arrays(expected: dict, what: str) -> None:
    """One-line `PlanError` unless each array of ``expected`` (name -> (array, shape, dtype
    name)) has that shape and dtype; ``what`` begins the line (the kernel and operand)."""
    for name, (array, shape, dtype) in expected.items():
        if tuple(array.shape) != tuple(shape) or jnp.dtype(array.dtype).name != dtype:
            raise PlanError(
                f"{what} {name} is {jnp.dtype(array.dtype).name}{list(array.shape)}, "
                f"expected {dtype}{list(shape)}."
            )


def scales_width(width: int, units: int, n_pad: int) -> int:
    """`PersistentPlan.z_width` of a plan of ``units`` per block padded to ``n_pad``.

    Never exactly one block's units when there are more blocks: a block's box [rows, units]
    would then span whole rows of z, a contiguous slice, which Mosaic GPU copies with a
    plain bulk copy (``cp.async.bulk``, no TMA descriptor) bounded only by the array's end,
    so the boxes of the blocks past z_width would land on the next rows instead of being
    dropped (on an H100 the padding blocks' zero dz overwrote the real dz). Such a plan
    reads and writes z at its full ``n_pad`` instead."""
    z_width = min(n_pad, max(_round_up(width, 4), units))
    return n_pad if z_width == units else z_width


@dataclasses.dataclass(frozen=True)
class PersistentPlan:
    """Configuration of one persistent-kernel call (hashable: a static argument).

    Attributes:
      batch, width: the problem (B rows, n units).
      dtype: matmul input dtype name, "bfloat16" or "float32" (accumulation is float32).
      col_blocks: blocks along the gate columns (each owns ``units_per_block`` units).
      row_blocks: blocks along the batch (``grid = row_blocks * col_blocks``).
      k_chunk: K elements per pipeline stage.
      stages: shared-memory pipeline depth.
      sm_count: SMs of the target (``H100.sms``); ``smem_limit``: bytes per block.
      units: units per block, or None for the fewest that cover ``width`` (rounded up to
        UNIT_MULTIPLE); set it to give the backward a wgmma N of 8 or more.
    """

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

    # --- ownership and padded extents -----------------------------------------------------

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
        """Gate columns a block owns: the h- and t-columns of its units."""
        return 2 * self.units_per_block

    @property
    def n_pad(self) -> int:
        return self.col_blocks * self.units_per_block

    @property
    def z_width(self) -> int:
        """Units of the hyper scales ``z [L, T, b_pad, z_width]`` the kernels read and of the
        dz they write: the width rounded up to 4 (f32 TMA rows of 16-byte multiples; 1000
        stays 1000, so the scales need no padding copy), more than one block's units (a TMA
        box inside the array, never a whole row of it: `scales_width`), else ``n_pad``. TMA
        reads the units past it as zeros and drops stores there."""
        return scales_width(self.width, self.units_per_block, self.n_pad)

    @property
    def state_in_packed(self) -> bool:
        """Whether the kernels' ``packed`` holds each phase's input state (row 0): not in f32,
        where the A buffer ``s_mm`` holds the same values (the state's "cast" to f32 is the
        state), from which the backward reads it; in bf16 ``s_mm`` is rounded."""
        return self.dtype != "float32"

    @property
    def packed_rows(self) -> int:
        """K of ``packed [P, b_pad, K, n_pad]``: the input state (`state_in_packed`), then the
        gates h, tg, or with z the halves of ``full`` (`forward_saved_rows`)."""
        return 2 + self.state_in_packed

    @property
    def k_pad(self) -> int:
        """K of the forward GEMM: the true width in whole chunks (state columns past ``width``
        are zero, so the K loop stops at the last chunk holding a real unit)."""
        return _round_up(self.width, self.k_chunk)

    @property
    def k2_pad(self) -> int:
        """K of the backward GEMM (both halves of the gate columns, ``2 * n_pad``), in chunks."""
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

    # --- resources ---------------------------------------------------------------------------

    def weight_slice_bytes(self) -> int:
        """One block's slice of ONE layer's weight: the larger of ``[k_pad, 2, units]``
        (forward) and the transposed ``[k2_pad, units]`` (backward)."""
        forward = self.k_pad * self.cols_per_block
        backward = self.k2_pad * self.units_per_block
        return max(forward, backward) * self.itemsize

    def smem_bytes(
        self,
        has_z: bool = True,
        has_mask: bool = True,
        save: bool = True,
        hyper: PersistentPlan | None = None,
    ) -> int:
        """Shared memory per block (bytes) that the forward kernel
        (`kernels/mosaic/persistent_forward.py`) allocates; by default with every option (the
        most). Each buffer is rounded up to Mosaic GPU's 1024-byte scratch alignment:

            stages * rows * k_chunk * itemsize        A pipeline buffers (the state rows)
            stages * 2u * k_chunk * itemsize          B pipeline buffers (the weight slice)
            rows * u * 4                              the block's f32 state
            rows * 2u * 4                             the accumulator's copy
            slots * rows * u * 4                      staged f32 epilogue tiles
                                                      (`forward_staging_slots`: 5 at most)
            rows * u * itemsize                       the state's matmul-dtype cast, which
                                                      the uint8 mask tile (rows * u bytes)
                                                      shares (a RefUnion: disjoint lifetimes)
            + 8 * (stages + inputs)                   mbarriers (pipeline, staged inputs,
                                                      the mask)

        With the ``hyper`` cell inside (its plan; z computed in the kernel): one more staged
        tile (p_l), the hyper cell's own state, staged tiles, cast and mbarriers, its GEMM
        tile sharing ``pre`` (the larger of the two), and the z and hyper GEMMs' pipelines
        (at most as many stages as K steps) reusing the main GEMM's buffers (run one after
        another; the larger counts) but with mbarriers of their own when their stage count
        differs.

        The backward kernel counts its own (`persistent_backward`)."""
        rows, units, item = self.rows_per_block, self.units_per_block, self.itemsize
        z_inside = hyper is not None
        slots, _ = forward_staging_slots(has_z or z_inside, save, z_inside)
        pipeline = [
            self.stages * rows * self.k_chunk,
            self.stages * self.cols_per_block * self.k_chunk,
        ]
        pre = rows * self.cols_per_block * 4
        buffers = [rows * units * 4, slots * rows * units * 4, rows * units * item]
        barriers = self.stages + len(forward_inputs(has_z or z_inside, z_inside)) + has_mask
        if z_inside:
            h_units, h_chunk = hyper.units_per_block, hyper.k_chunk
            h_stages = min(hyper.stages, hyper.k_pad // h_chunk)  # the pipeline's own cap
            h_slots, _ = forward_staging_slots(False, save)
            buffers += [rows * h_units * 4, h_slots * rows * h_units * 4, rows * h_units * item]
            pre = max(pre, rows * hyper.cols_per_block * 4)
            z_gemm = [h_stages * rows * h_chunk, h_stages * units * h_chunk]
            h_gemm = [h_stages * rows * h_chunk, h_stages * hyper.cols_per_block * h_chunk]
            pipeline = max(pipeline, z_gemm, h_gemm, key=lambda b: sum(map(self._aligned, b)))
            # Scoped mbarriers are reserved per kind (their count): the z and hyper GEMMs'
            # pipelines share one kind, the main GEMM's another unless the counts agree.
            barriers += len(forward_inputs(False)) + has_mask + h_stages * (h_stages != self.stages)
        sizes = [b * item for b in pipeline] + [pre, *buffers]
        return sum(map(self._aligned, sizes)) + 8 * barriers

    @staticmethod
    def _aligned(nbytes: int) -> int:
        return _round_up(nbytes, H100.smem_alignment)

    def accumulator_registers(self, warpgroups: int = 1) -> int:
        """f32 accumulator registers per thread of the compute warpgroups (128 threads each)."""
        return self.rows_per_block * self.cols_per_block // (128 * warpgroups)

    def _operand_elems(self, backward: bool) -> tuple[int, int]:
        """(A elements, B elements) one block reads per phase: forward its rows of the
        state ``[rows, k_pad]`` and its weight slice ``[k_pad, 2u]``; backward its rows of
        the layer above's ``d_scaled`` ``[rows, k2_pad]`` and ``[k2_pad, u]`` rows of W."""
        if backward:
            return self.rows_per_block * self.k2_pad, self.k2_pad * self.units_per_block
        return self.rows_per_block * self.k_pad, self.k_pad * self.cols_per_block

    def l2_bytes_per_phase(self, multicast: int = 1, backward: bool = False) -> int:
        """Bytes every block together reads per main-cell phase (its A rows and its weight
        slice); ``multicast`` blocks of a cluster sharing rows read A once (TMA multicast)."""
        a, b = self._operand_elems(backward)
        blocks_reading_a = -(-self.grid // multicast)
        return (blocks_reading_a * a + self.grid * b) * self.itemsize

    def ingest_bytes_per_block(self, backward: bool = False) -> int:
        """Bytes one block takes into shared memory per phase (A rows + weight slice)."""
        return sum(self._operand_elems(backward)) * self.itemsize

    def flops_per_block(self, backward: bool = False) -> int:
        """GEMM FLOPs of one block per phase (padded extents)."""
        a, b = self._operand_elems(backward)
        return 2 * a * b // (self.k2_pad if backward else self.k_pad)

    def check(self) -> None:
        """Raises :class:`PlanError` (one line) unless every block can be resident at once
        (grid <= SM count: one block per SM; shared memory <= the per-block limit) and the
        K extents suit the kernels: ``k_pad <= n_pad`` (every state column the forward's K
        loop reads is written by some block) and ``2 * n_pad`` a multiple of ``k_chunk``
        (the backward's K)."""
        if self.k_pad > self.n_pad:
            raise PlanError(
                f"persistent plan has k_pad {self.k_pad} > n_pad {self.n_pad} (width "
                f"{self.width} in k_chunk {self.k_chunk}, {self.col_blocks} column blocks): "
                "the forward would read unwritten state columns; lower k_chunk."
            )
        self.check_backward_k()
        self.check_grid()
        need = self.smem_bytes()
        if need > self.smem_limit:
            raise PlanError(
                f"persistent plan needs {need} B of shared memory per block, over the "
                f"{self.smem_limit} B limit ({self.dtype}, rows {self.rows_per_block}, "
                f"k_chunk {self.k_chunk}, stages {self.stages}): lower stages or k_chunk, "
                "or raise row_blocks."
            )

    def check_interpretable(self) -> None:
        """PlanError (one line) unless GPU interpret mode can run the plan here: its grid as
        ONE cluster (`grid_barrier.launch`) of at most `gpu_interpret.max_blocks` blocks."""
        from rhhjax.kernels.mosaic import interpret as gpu_interpret

        reason = gpu_interpret.cluster_too_large(self.grid)
        if reason is not None:
            raise PlanError(
                f"persistent plan of {self.row_blocks} x {self.col_blocks} blocks (batch "
                f"{self.batch}, width {self.width}): {reason}"
                + ("" if "NPROC" in reason else "; choose a plan of fewer blocks")
            )

    def check_backward_k(self) -> None:
        """PlanError (one line) unless the backward's K, ``2 * n_pad``, is whole chunks."""
        if (2 * self.n_pad) % self.k_chunk:
            raise PlanError(
                f"persistent plan has 2 * n_pad = {2 * self.n_pad} not a multiple of k_chunk "
                f"{self.k_chunk} (the backward's K); lower k_chunk or change col_blocks."
            )

    def check_grid(self) -> None:
        """PlanError (one line) unless every block can have an SM of its own (grid <= SMs):
        otherwise blocks would not be co-resident and the grid barrier would deadlock."""
        if self.grid > self.sm_count:
            raise PlanError(
                f"persistent grid of {self.grid} blocks exceeds the {self.sm_count} SMs: "
                "blocks would not be co-resident and the grid barrier would deadlock."
            )

    def summary(self) -> dict:
        """The plan's derived figures, for reports."""
        return {
            "grid": self.grid,
            "units_per_block": self.units_per_block,
            "cols_per_block": self.cols_per_block,
            "b_pad": self.b_pad,
            "n_pad": self.n_pad,
            "k_pad": self.k_pad,
            "smem_bytes": self.smem_bytes(),
            "weight_slice_bytes": self.weight_slice_bytes(),
            "accumulator_registers": self.accumulator_registers(),
            "l2_bytes_per_phase": self.l2_bytes_per_phase(),
        }


def paper_plan(dtype: str = "bfloat16", **overrides) -> PersistentPlan:
    """The plan of the paper's main cell (n = 1000, batch 256) on an H100."""
    return PersistentPlan(batch=256, width=1000, dtype=dtype, **overrides)
