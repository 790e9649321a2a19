"""`persistent`: the RHN recurrence as TWO persistent Mosaic GPU kernels, one for the whole
forward time loop and one for the whole backward (a `rhhjax.ops.spec.Implementation`, run
by `rhhjax.ops.recurrence.highway_sequence`).

Each kernel is ONE launch over a grid of at most one block per SM
(`rhhjax.kernels.mosaic.plan.PersistentPlan`): block ``(r, g)`` owns batch rows and the
h- and t-columns of a slice of the units, keeps its own f32 state (or carried state gradient)
in shared memory, and meets the others at a grid barrier (`rhhjax.kernels.mosaic.grid_barrier`)
after every micro-layer phase, T * L of them per direction:

* forward (`rhhjax.kernels.mosaic.persistent_forward`): per phase the block's slice of
  ``s @ W_l`` (K chunks through a TMA pipeline, wgmma), the input projection at layer 0,
  hyper scale, bias, gates, gate dropout and combine; it writes the state in the matmul
  dtype for the next phase's GEMM and, for the backward, its input state and the gates
  (with z instead the unscaled pre-activation ``full``: `saved_rows`).
* backward (`rhhjax.kernels.mosaic.persistent_backward`): per phase (in reverse) the block's slice
  of ``d_scaled_above @ W_above^T`` fused with its gate backward (with z on the gates
  recomputed from ``full``), dz, and each block's column sums of ``da`` for the bias
  gradient; the input-projection and the weight gradients (from the kernels' own
  matmul-dtype buffers and layer 0's f32 d_scaled) are XLA GEMMs after the loop; the
  gradient of s0 is one XLA matmul.

The hyper cell (``hyper_input="x"``: it reads x, not the main state) runs by default as its
own persistent kernels: its recurrence first, every z computed at once
(`rhhjax.models.cores.HyperRHNCore`), the main kernels reading z as an input, its backward
after the main one's. With `HYPER_INSIDE` on (measured slower on an H100, less peak memory)
it runs INSIDE the main kernels wherever `hyper_inside_plans` has plans (the paper's
HyperRHN in both dtypes): `hyper_forward_loop`, called by
`rhhjax.ops.recurrence.hyper_highway_sequence`, runs both cells' T * L phases in one launch,
the hyper cell one phase ahead on the blocks of its own plan, z from the kernel's own GEMM
(`persistent_forward.HyperInside`). Its backward is ONE
kernel too (`hyper_backward_loop`): the main cell recomputes z from the hyper cell's saved A
buffer by the forward's own GEMM (`RecomputedScales`, `persistent_backward.ScalesInside`),
so z is never written, and the hyper cell runs one phase behind, its state gradient through
z (dz P^T) its own GEMM (`persistent_backward.HyperBackward`); dP, the projection's
gradient, is an XLA GEMM over dz after it. The switches `RECOMPUTE_SCALES` and
`HYPER_BACKWARD_INSIDE` give back each cell's own backward kernel, z's VJP between. A
HyperRHN whose plans leave no room runs the default's kernels.

Where it runs: compiled on a Hopper GPU; with `model.pallas_mode="interpret"`
(`spec.interpret`) the same kernels executed in GPU interpret mode on the host, race detector
on (`rhhjax.kernels.mosaic.interpret`, jax >= 0.11.2; slow, for checking), at the plan of the
fewest blocks (`interpret_plan`: the interpreter runs them as one cluster, with a cluster
barrier in place of the grid barrier);
with `model.pallas_mode="compiled"` lowered for a GPU without one. `unavailable` refuses
anything else in one line. `spec.references`, which `resolve` never sets, runs the kernels'
pure-JAX references in their place (the tests' way of checking everything around the
kernels under any jax). f32 models run their matmuls as TF32 on a GPU, in f32 interpreted. A
grid barrier that times out (blocks not co-resident) ends the step with one error line
(`grid_barrier.check_status`) instead of hanging.

Not supported: variational dropout (`unsupported`). Rank-d HyperRHNs run `fused` instead,
said in the start-up line (`substitute`). Not in `impl="auto"` until measured on a GPU.

Layout (`geometry`, from `persistent_cost.plan_for`: the runnable plan of the lowest
PREDICTED phase time): the batch padded to the block rows (a multiple of 64),
the units to ``col_blocks * units_per_block``; weights stacked over layers in the kernels'
orders (`persistent_forward.forward_weights`, `persistent_backward.backward_weights`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from rhhjax.kernels.layout import Geometry
from rhhjax.kernels.mosaic import grid_barrier, keep_mask
from rhhjax.kernels.mosaic import interpret as gpu_interpret
from rhhjax.kernels.mosaic import persistent_backward as pb
from rhhjax.kernels.mosaic import persistent_forward as pf
from rhhjax.kernels.mosaic.plan import PersistentPlan, PlanError, scales_width
from rhhjax.ops import cells, fused, loops
from rhhjax.ops.persistent_cost import candidates, inside_plans, plan_for, predicted_phase_us

if TYPE_CHECKING:
    from rhhjax.ops.sequence_spec import ModelFacts, SequenceSpec

Array = jax.Array

NAME = "persistent"
INTERPRETABLE = True  # model.pallas_mode="interpret": GPU interpret mode (jax >= 0.11.2).
KEEP_DTYPE = jnp.uint8  # The kernels read the keep decisions as uint8 (`keep_mask`).
# The backward kernel reads layer L - 1's cotangent alone when the model reads only that layer
# (`SequenceSpec.last_layer_only`): no dense [T, L, Bp, Np] of zeros is built or read.
LAST_LAYER_COTANGENT = True
# The kernels' launch layout (`kernels/mosaic/rowgroup_layout.py`): "grid" (a grid barrier) or
# "rowgroup" (one cluster per row group, a cluster barrier; plans of <= 16 column blocks).
# "grid" until a GPU has measured both (`benchmarks/calibrate_persistent.py`).
LAYOUT = "grid"
# The HyperRHN's hyper cell inside the main kernels where `hyper_inside_plans` has plans
# (True: 1,402 grid-barrier phases a step, the least peak memory); False: its own persistent
# kernels before and after the main ones, z between. Off: on an H100 the paper step measured
# 34.2 / 33.1 ms (bf16 / f32) apart against 40.5 / 38.5 inside, at 0.57 / 0.52 GB more peak
# memory (`results/gpu_h100_2026-11-26b.md`).
HYPER_INSIDE = False
# With the hyper cell inside: the main backward kernel recomputes z from the hyper cell's saved
# A buffer (`persistent_backward.ScalesInside`) where its shared memory allows, so z is never
# written; False: the forward writes z and the backward reads it. On until a GPU has measured
# both (in bf16 the backward's main GEMM then runs at 2 pipeline stages, not 3).
RECOMPUTE_SCALES = True
# With z recomputed: the hyper cell's backward inside the main backward kernel, one phase
# behind (`hyper_backward_loop`: P + 1 barriers for both cells, not 2 P in two launches);
# False: its own kernel after the main one's, as before. On until a GPU has measured both.
HYPER_BACKWARD_INSIDE = True


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["s_mm", "tail", "proj", "proj_bias"],
    meta_fields=["plan"],
)
@dataclasses.dataclass(frozen=True)
class RecomputedScales:
    """The main cell's z operand when its backward recomputes z (`RECOMPUTE_SCALES`): the
    hyper cell's plan inside the forward and what `persistent_backward.ScalesInside` reads
    (its A buffer [P * Bp, kh_pad] and tail [Bp, kh_pad] in the matmul dtype, the projection
    [L * Np, kh_pad] and its bias rows [L, Bp, Np]). A pytree: it travels as a residual."""

    s_mm: jax.Array
    tail: jax.Array
    proj: jax.Array
    proj_bias: jax.Array
    plan: PersistentPlan

    def kernel_operand(self) -> pb.ScalesInside:
        """The backward kernel's ``scales`` operand."""
        return pb.ScalesInside(self.plan, self.s_mm, self.tail, self.proj, self.proj_bias)


def unsupported(model: ModelFacts) -> str | None:
    """Why `persistent` cannot run `model`, or None. Rank-d is not refused: `substitute`
    runs `fused` for it."""
    reason = loops.whole_sequence_unsupported(NAME, model)
    if reason is None and model.dropout == "variational":
        reason = (
            f"model.impl={NAME!r} supports dropout='gate' or 'none'; use impl='fused' "
            "for variational dropout"
        )
    return reason


def substitute(model: ModelFacts) -> tuple[str, str] | None:
    """(the implementation that runs instead, why) for a rank-d HyperRHN, else None."""
    if model.hyper_rank > 0:
        return fused.NAME, (
            f"model.impl={NAME!r} has no rank-d kernels (model.hyper_rank="
            f"{model.hyper_rank}): runs {fused.NAME!r} instead"
        )
    return None


def unavailable(pallas_mode: str, platform: str | None) -> str | None:
    """Why `persistent` cannot run here, or None (`loops.hopper_unavailable`)."""
    return loops.hopper_unavailable(NAME, pallas_mode, platform)


@functools.cache
def interpret_plan(batch: int, width: int, dtype_name: str, layout: str = "grid") -> PersistentPlan:
    """The plan of GPU interpret mode: among the plans both kernels can run on an H100
    (`persistent_cost.candidates`), the one of the FEWEST blocks (then the lowest predicted
    phase time): the interpreter runs them as one cluster of threads (`grid_barrier.launch`).
    Raises PlanError (one line) when none fits, or when the fewest are more blocks than the
    interpreter runs here (`gpu_interpret.cluster_too_large`)."""
    plans = list(candidates(batch, width, dtype_name, layout))
    if not plans:
        return plan_for(batch, width, dtype_name, layout)  # its one-line PlanError

    def cost(plan):
        forward, backward = predicted_phase_us(plan), predicted_phase_us(plan, backward=True)
        return plan.grid, forward + backward, plan.n_pad

    plan = min(plans, key=cost)
    reason = gpu_interpret.cluster_too_large(plan.grid)
    if reason is not None and "NPROC" not in reason:
        reason += f"; use impl='mosaic' (also interpreted) or a model narrower than {width}"
    if reason is not None:
        raise PlanError(f"model.impl={NAME!r} needs {plan.grid} blocks for width {width}: {reason}")
    return plan


def _plan_of(spec: SequenceSpec, batch: int, width: int) -> PersistentPlan:
    """`interpret_plan` in GPU interpret mode, else `persistent_cost.plan_for` (the H100's)."""
    choose = interpret_plan if spec.interpret and not spec.references else plan_for
    return choose(batch, width, jnp.dtype(spec.dtype).name, LAYOUT)


def _plan(spec: SequenceSpec, geo: Geometry) -> PersistentPlan:
    return _plan_of(spec, geo.batch, geo.n)


def geometry(spec: SequenceSpec, batch: int, width: int) -> Geometry:
    """Rows padded to the plan's ``b_pad``, units to its ``n_pad`` (blocks: the plan's rows
    and units per block, K chunk)."""
    plan = _plan_of(spec, batch, width)
    return Geometry(
        batch, width, plan.rows_per_block, plan.units_per_block, plan.k_chunk,
        plan.b_pad, plan.n_pad,
    )  # fmt: skip


def prepare_weights(spec, geo, kernel_s: Array, transposed: bool = False) -> tuple[Array]:
    """W_l [L, n, 2n] -> ONE stacked array in the matmul dtype (a tuple of one), padded and
    cast once per call: the forward's block-major [L * 2 * Np, k_pad] or (`transposed`, for
    the backward) W as it is [L * Np, 2 * Np]. (One array, not L: each kernel reads every
    layer.)"""
    plan = _plan(spec, geo)
    if transposed:
        return (pb.backward_weights(plan, kernel_s, spec.dtype),)
    return (pf.forward_weights(plan, kernel_s, spec.dtype),)


def scales_operand(geo: Geometry, z: Array | None) -> Array | None:
    """z [T, L, B, n] -> the kernels' layer-major z [L, T, Bp, z_width] (or None): the
    transpose undoes the model's own (the hyper projection's GEMM writes [L, T * B, n]) and
    at the paper's sizes nothing is padded (1000 units stay 1000: the kernels' TMA reads the
    units past them as zeros), so z reaches the kernels with no copy."""
    if z is None:
        return None
    z_width = scales_width(geo.n, geo.block_n, geo.n_pad)  # the plan's z_width
    z_lt = jnp.swapaxes(z, 0, 1)
    pads = [(0, 0), (0, 0), (0, geo.b_pad - geo.batch), (0, z_width - geo.n)]
    return jnp.pad(z_lt, pads)


def saved_rows(has_z: bool) -> loops.Fields:
    """`fused`'s gates "h", "t" [Bp, Np], or with z "full" [Bp, 2, Np] alone: the backward
    kernel recomputes the gates from it (`persistent_backward`), so the forward writes two
    rows a phase, not four."""
    return (("full", 2),) if has_z else fused.saved_rows(has_z)


def _phase_major(x: Array | None) -> Array | None:
    """[T, L, ...] -> [T * L, ...] (phase p = t * L + l); None stays None."""
    return None if x is None else x.reshape(-1, *x.shape[2:])


def _cotangent_rows(g_states: Array) -> Array:
    """The backward kernel's ``g``: [T, Bp, Np] (the last layer's alone) as it is, or
    [T, L, Bp, Np] phase-major [P, Bp, Np]."""
    return g_states if g_states.ndim == 3 else _phase_major(g_states)


def forward_loop(spec, geo, w, bias, s0, xproj, z, keep, hidden, save: bool):
    """The whole forward as one kernel (its reference when `spec.references`).

    w: (the stacked weights [L * 2 * Np, k_pad],); bias [L, 2, Np]; s0 [Bp, Np]; xproj
    [T, Bp, 2, Np]; z [L, T, Bp, z_width] (`scales_operand`), keep [T, L, Bp, Np], or None.
    Returns (states [T, L, Bp, Np], saved
    or None): saved = (packed [P, Bp, K, Np] phase-major, the kernel's saved rows; s_mm
    [P * Bp, k_pad] the input states in the matmul dtype, the kernel's A buffer,
    layer-major (`persistent_slots`): the operand of `backward_loop`'s weight gradient),
    P = T * L. With ``save`` the kernel writes the last state only; the others are read
    from packed row 0 (`_states_from_packed`)."""
    if hidden is not None:
        raise ValueError(f"impl {NAME!r} has no variational dropout")
    plan = _plan(spec, geo)
    (stacked,) = w
    outs = _run_forward(spec, save, *_kernel_operands(plan, geo, stacked, s0, xproj, bias, z, keep))
    return _cell_results(plan, outs, save, xproj.shape[0], bias.shape[0])


def _kernel_operands(plan, geo, stacked, s0, xproj, bias, z, keep) -> tuple:
    """One cell's forward-kernel operands (plan, w_blk, s0, xproj, bias rows, z, mask) from
    `recurrence`'s padded ones: x U with its units unpadded (the kernel reads past them as
    zeros: XLA drops the slice and `recurrence`'s pad together, so the projection reaches
    the kernel with no copy), the bias broadcast over rows, the uint8 keep decisions."""
    rows = _bias_rows(geo, bias)
    mask = keep_mask.decisions(_phase_major(keep))
    return plan, stacked, s0, xproj[..., : plan.z_width], rows, z, mask


def _run_forward(
    spec, save: bool, *args, hyper: pf.HyperInside | None = None, save_scales: bool = True
) -> tuple:
    """The forward kernel (its reference when `spec.references`) on `_kernel_operands`'
    ``args``; a grid barrier that timed out is one error line."""
    options = dict(save=save, keep=spec.keep, hyper=hyper, save_scales=save_scales)
    if spec.references:
        return pf.persistent_forward_reference(*args, **options)
    interpret = loops.kernel_interpret(spec)
    outs = pf.persistent_forward(*args, **options, interpret=interpret, layout=LAYOUT)
    grid_barrier.check_status(outs[-1], "persistent forward")
    return outs


def _cell_results(plan: PersistentPlan, outs, save: bool, length: int, depth: int):
    """One cell's kernel outputs (states, or with ``save`` s_last, packed, s_mm, ...) ->
    (states [T, L, Bp, Np], saved (packed, s_mm) or None): `forward_loop`'s return."""
    if not save:
        return outs[0].reshape(length, depth, *outs[0].shape[1:]), None
    s_last, packed, s_mm = outs[:3]
    if plan.state_in_packed:
        states = _states_from_packed(packed, s_last, depth)
    else:  # f32: the input states are s_mm's rows
        states = _states_from_s_mm(s_mm, s_last, length, depth)
    return states, (packed, s_mm)


def hyper_inside_plans(
    spec: SequenceSpec, batch: int, width: int, hyper_width: int
) -> tuple[PersistentPlan, PersistentPlan] | None:
    """(main plan, hyper plan) of the forward kernel with the hyper cell inside
    (`persistent_forward.HyperInside`), or None where there is none (or `HYPER_INSIDE` is
    off): `persistent_cost.inside_plans` of each cell's own plan (`geometry`'s), whose
    layouts the backward reads."""
    if not HYPER_INSIDE:
        return None
    return inside_plans(_plan_of(spec, batch, width), _plan_of(spec, batch, hyper_width))


def scales_backward_plan(
    plan: PersistentPlan, hyper_plan: PersistentPlan, depth: int, has_mask: bool
) -> PersistentPlan | None:
    """The backward kernel's plan when it recomputes z (`persistent_backward.ScalesInside`):
    ``plan`` at the most pipeline stages (at least 2) whose shared memory fits beside z's GEMM
    and p_l's tile (the paper's bf16 plan: 2, not 3), or None where none does or
    `RECOMPUTE_SCALES` is off. Stages change no layout: the forward's buffers are read as
    they are."""
    if not RECOMPUTE_SCALES:
        return None
    return _deepest_backward_plan(plan, True, has_mask, depth, hyper_plan)


def _deepest_backward_plan(plan: PersistentPlan, *check_args) -> PersistentPlan | None:
    """``plan`` at the most pipeline stages (>= 2) that `persistent_backward.check_plan`
    accepts with ``check_args``, or None."""
    for stages in range(plan.stages, 1, -1):
        candidate = dataclasses.replace(plan, stages=stages)
        try:
            pb.check_plan(candidate, *check_args)
        except PlanError:
            continue
        return candidate
    return None


def hyper_forward_loop(spec, geos, kernels, operands, proj_kernel, proj_bias, save: bool):
    """Both cells' forward as ONE kernel, the hyper cell inside (`hyper_inside_plans`).

    geos, operands: (hyper, main) pairs of `forward_loop`'s geo and padded operands (the
    main cell's z None); kernels: (hyper, main) W [L, n, 2n] (blocked here for the plans
    inside, which split the hyper cell's units another way than its own plan);
    proj_kernel [L, h, n], proj_bias [L, n] f32.
    Returns ((states, saved) of the hyper cell, (states, saved) of the main cell, z): as
    `forward_loop` returns them for each cell, and with ``save`` the main cell's backward
    operand for z: `RecomputedScales` where its backward recomputes z
    (`scales_backward_plan`), else z [L, T, Bp, z_width] (`scales_operand`'s layout, written
    by the kernel); without ``save`` None."""
    geo_h, geo_m = geos
    plan, hyper_plan = hyper_inside_plans(spec, geo_m.batch, geo_m.n, geo_h.n)
    ops_h, ops_m = operands
    if ops_h[-1] is not None or ops_m[-1] is not None:
        raise ValueError(f"impl {NAME!r} has no variational dropout")
    length, depth = ops_m[2].shape[0], ops_m[0].shape[0]

    def kernel_operands(cell_plan, geo, kernel_s, ops):
        bias, s0, xproj, _, keep, _ = ops
        stacked = pf.forward_weights(cell_plan, kernel_s, spec.dtype)
        return _kernel_operands(cell_plan, geo, stacked, s0, xproj, bias, None, keep)

    args_h = kernel_operands(hyper_plan, geo_h, kernels[0], ops_h)
    args_m = kernel_operands(plan, geo_m, kernels[1], ops_m)
    hyper = pf.HyperInside(
        hyper_plan, *args_h[1:5], args_h[6],
        pf.projection_weights(plan, hyper_plan, proj_kernel, spec.dtype),
        _bias_rows(geo_m, _padded_units(geo_m, proj_bias)),  # p [L, n] -> [L, Bp, Np]
    )  # fmt: skip
    recompute = scales_backward_plan(plan, hyper_plan, depth, args_m[6] is not None) is not None
    outs = _run_forward(spec, save, *args_m, hyper=hyper, save_scales=not recompute)
    n_cell = 2 + save  # (states or s_last, [packed,] s_mm) of each cell
    main = _cell_results(plan, outs[:n_cell], save, length, depth)
    hyper_out = _cell_results(hyper_plan, outs[n_cell : 2 * n_cell], save, length, depth)
    if not save:
        return hyper_out, main, None
    if not recompute:
        return hyper_out, main, outs[2 * n_cell]
    tail = outs[-2]
    z = RecomputedScales(hyper_out[1][1], tail, hyper.proj, hyper.proj_bias, hyper_plan)
    return hyper_out, main, z


def _bias_rows(geo: Geometry, bias: Array) -> Array:
    """bias [L, 2, Np] -> [L, Bp, 2, Np] broadcast over the rows: the kernels' bias operand."""
    return jnp.broadcast_to(bias[:, None], (bias.shape[0], geo.b_pad, *bias.shape[1:]))


def _states_from_packed(packed: Array, s_last: Array, depth: int) -> Array:
    """packed [P, Bp, K, Np] (row 0: each phase's input state), s_last [1, Bp, Np] (the state
    after the last phase) -> states [T, L, Bp, Np]: the state after phase p is the input of
    phase p + 1, so the forward kernel does not write every state twice. Built layer by
    layer from strided slices of packed, so that a consumer of one layer (the model reads
    the last) reads that layer only."""
    inputs = packed[:, :, 0]  # [P, Bp, Np]
    layers = [inputs[layer + 1 :: depth] for layer in range(depth - 1)]
    layers.append(jnp.concatenate([inputs[depth::depth], s_last], axis=0))
    return jnp.stack(layers, axis=1)


def _states_from_s_mm(s_mm: Array, s_last: Array, length: int, depth: int) -> Array:
    """s_mm [P * Bp, k_pad] f32 (layer-major slots, `persistent_slots`: block l * T + t is
    the input of phase (t, l)), s_last [1, Bp, Np] -> states [T, L, Bp, Np]: the state after
    (t, l) is the input of (t, l + 1), slot (l + 1) * T + t, and after (t, L - 1) the input
    of (t + 1, 0), slot t + 1; units past k_pad are zero. Each layer is a contiguous run of
    blocks, so a consumer of one layer reads that layer only."""
    n_pad = s_last.shape[-1]
    blocks = s_mm.reshape(depth, length, s_last.shape[1], -1)
    blocks = jnp.pad(blocks, [(0, 0)] * 3 + [(0, n_pad - blocks.shape[-1])])
    layers = [blocks[layer + 1] for layer in range(depth - 1)]
    layers.append(jnp.concatenate([blocks[0, 1:], s_last], axis=0))
    return jnp.stack(layers, axis=1)


def backward_loop(spec, geo, w, bias, s0, xproj, z, keep, hidden, saved, g_states):
    """`backward_loop_and_scale_bias`'s gradients (the `rhhjax.ops.spec.Implementation`
    loop)."""
    args = (spec, geo, w, bias, s0, xproj, z, keep, hidden, saved, g_states)
    return backward_loop_and_scale_bias(*args)[:5]


def backward_loop_and_scale_bias(spec, geo, w, bias, s0, xproj, z, keep, hidden, saved, g_states):
    """The whole backward as one kernel (its reference when `spec.references`), then the
    gradients in the layouts the kernels write (phase-major, no [T, L] reshapes of the
    large arrays: every XLA pass reads only what it needs).

    w: ([L * Np, 2 * Np],) (`prepare_weights(..., transposed=True)`); saved: `forward_loop`'s
    (packed, s_mm); g_states [T, L, Bp, Np] the padded cotangents of the states, or [T, Bp,
    Np] the last layer's alone (``spec.last_layer_only``: the kernel reads it at layer L - 1
    and zero elsewhere). Returns
    (ds0 [Bp, Np], d_scaled of layer 0 [T, 1, Bp, 2, Np] = da * [z, z] in f32 (the gradient
    of xproj, the kernel's d_x), dz [T, L, Bp, Np] or None, dbias [L, 2, Np] (from the
    kernel's column sums of da), dW [L, k_pad, 2, Np], with z the sum of dz over steps and
    rows [L, Np] from the kernel's column sums (the gradient of the bias p of z = s P + p,
    with no pass over dz), else None): dW from the kernels' matmul-dtype operands, s_mm
    (the input states) and d_mm (d_scaled), the values `loops.deferred_weight_gradient`
    would cast."""
    del s0, hidden  # hidden: None (`forward_loop` refused it).
    packed, s_mm = saved
    (stacked,) = w
    plan = _plan(spec, geo)
    depth = bias.shape[0]
    mask = keep_mask.decisions(_phase_major(keep))
    g = _cotangent_rows(g_states)
    rows = None  # with z the kernel recomputes the gates from full: it needs the bias
    if z is not None:
        rows = _bias_rows(geo, bias)
    scales = None
    if isinstance(z, RecomputedScales):  # the kernel recomputes z from the hyper cell's buffer
        scales = z.kernel_operand()
        plan = scales_backward_plan(plan, z.plan, depth, mask is not None)
        z = None
    s_prev = None if plan.state_in_packed else s_mm  # f32: the input states are s_mm's rows
    args = (plan, stacked, g, packed, z, mask, rows, s_prev)
    outs = _run_backward(spec, *args, scales=scales)
    has_z = rows is not None  # z read, or recomputed: the kernel returns dz and its sums
    return _gradients(spec, geo, stacked, depth, outs, s_mm, has_z)


def _run_backward(spec, *args, **cells) -> tuple:
    """The backward kernel (its reference when `spec.references`) on ``args``; a grid
    barrier that timed out is one error line."""
    if spec.references:
        return pb.persistent_backward_reference(*args, keep=spec.keep, **cells)
    interpret = loops.kernel_interpret(spec)
    outs = pb.persistent_backward(
        *args, keep=spec.keep, interpret=interpret, layout=LAYOUT, **cells
    )
    grid_barrier.check_status(outs[-1], "persistent backward")
    return outs


def _gradients(spec, geo, stacked, depth: int, outs, s_mm, has_z: bool) -> tuple:
    """One cell's backward-kernel outputs (d_x, d_mm, ds_carry0, bias_parts, then with
    ``has_z`` dz, dz_sums) -> `backward_loop_and_scale_bias`'s gradients."""
    d_x, d_mm, ds_carry0, bias_parts = outs[:4]
    # The state gradient of s0 through W_0 (no gate backward below it): one XLA matmul.
    w0 = stacked[: geo.n_pad]
    ds0 = ds_carry0 + jnp.matmul(d_mm[: geo.b_pad], w0.T, preferred_element_type=jnp.float32)
    dbias = pb.bias_gradient(bias_parts, depth)
    d_xproj = _padded_units(geo, d_x)[:, None]
    dz = _padded_units(geo, jnp.swapaxes(outs[4], 0, 1)) if has_z else None
    dp = pb.scale_bias_gradient(outs[5]) if has_z else None
    return ds0, d_xproj, dz, dbias, _weight_gradient(spec, depth, d_mm, s_mm), dp


def hyper_backward_plan(
    plan: PersistentPlan, hyper_plan: PersistentPlan, depth: int, has_mask: bool
) -> PersistentPlan | None:
    """The backward kernel's plan with the hyper cell inside it (`hyper_backward_loop`) and
    z recomputed: ``plan`` at the most pipeline stages (>= 2) whose shared memory fits both
    (the paper's bf16 plan: 2), or None where none does or `HYPER_BACKWARD_INSIDE` is off."""
    if not HYPER_BACKWARD_INSIDE:
        return None
    return _deepest_backward_plan(plan, True, has_mask, depth, hyper_plan, hyper_plan, has_mask)


def hyper_backward_loop(spec, args_h, args_m, proj_kernel):
    """Both cells' backward as ONE kernel, the hyper cell inside one phase behind the main
    cell (`persistent_backward.HyperBackward`), or None where it does not run (the main
    cell's z is not `RecomputedScales`, no `hyper_backward_plan`): then each cell runs
    `backward_loop_and_scale_bias` in turn, z's VJP between them.

    args_h, args_m: each cell's `backward_loop_and_scale_bias` arguments (spec, geo, w, bias,
    s0, xproj, z, keep, hidden, saved, g_states), the hyper cell's g_states its states'
    cotangent from outside the op; proj_kernel P [L, h, n]. Returns (the hyper cell's
    `backward_loop` gradients, the main cell's `backward_loop_and_scale_bias` gradients):
    the kernel adds ds_h = dz P^T to the hyper cell's cotangent itself."""
    _, geo_m, (stacked_m,), bias_m, _, _, z, keep_m, _, saved_m, g_m = args_m
    _, geo_h, (stacked_h,), _, _, _, _, keep_h, _, saved_h, g_h = args_h
    if not isinstance(z, RecomputedScales):
        return None
    depth, has_mask, hp = bias_m.shape[0], keep_m is not None, z.plan
    plan = hyper_backward_plan(_plan(spec, geo_m), hp, depth, has_mask)
    if plan is None:
        return None
    (packed_m, s_mm_m), (packed_h, s_mm_h) = saved_m, saved_h
    g_h = _cotangent_rows(g_h)  # [T, ...]: its last layer's alone
    hyper = pb.HyperBackward(
        hp, stacked_h, g_h, packed_h, keep_mask.decisions(_phase_major(keep_h)),
        None if hp.state_in_packed else s_mm_h,
        pb.projection_rows(plan, hp, proj_kernel, spec.dtype),
    )  # fmt: skip
    scales = z.kernel_operand()
    g = _cotangent_rows(g_m)
    mask = keep_mask.decisions(_phase_major(keep_m))
    s_prev = None if plan.state_in_packed else s_mm_m
    args = (plan, stacked_m, g, packed_m, None, mask, _bias_rows(geo_m, bias_m), s_prev)
    outs = _run_backward(spec, *args, scales=scales, hyper=hyper)
    main = _gradients(spec, geo_m, stacked_m, depth, outs[:6], s_mm_m, True)
    hyper_grads = _gradients(spec, geo_h, stacked_h, depth, outs[6:10], s_mm_h, False)
    return hyper_grads[:5], main


def _padded_units(geo: Geometry, x: Array) -> Array:
    """[..., z_width or n] (the backward kernel's unpadded d_x and dz, a bias) -> [..., Np]
    zero-padded, as the other implementations return them: `recurrence` unpads it again,
    and XLA folds the pad and that slice into the consumers' reads (no copy)."""
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, geo.n_pad - x.shape[-1])])


def _weight_gradient(spec, depth: int, d_mm: Array, s_mm: Array) -> Array:
    """dW [L, k_pad, 2, Np] from the kernels' matmul-dtype buffers d_mm [P * Bp, 2 * Np] and
    s_mm [P * Bp, k_pad]. They are layer-major (`persistent_slots`): layer l's rows are
    contiguous, so dW is one batched GEMM over views of the whole buffers (no transpose, no
    slice copy)."""
    s_in = s_mm.reshape(depth, -1, s_mm.shape[-1])
    d_in = d_mm.reshape(depth, -1, d_mm.shape[-1])
    acc = cells.accumulation_dtype(spec.dtype)
    dw = jnp.einsum("lri,lrc->lic", s_in, d_in, preferred_element_type=acc)
    return dw.reshape(depth, s_mm.shape[-1], 2, -1)
