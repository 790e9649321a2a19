"""`persistent`: the RHN recurrence as one persistent Mosaic GPU kernel for the whole forward
and one for the whole backward (a barrier after each of the T * L phases), `PersistentVariant`
their layout and pipeline; weight gradients are XLA GEMMs. docs/persistent_design.md."""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from rhhjax.kernels.layout import Geometry
from rhhjax.kernels.mosaic import grid_barrier, keep_mask, rowgroup_layout
from rhhjax.kernels.mosaic import interpret as gpu_interpret
from rhhjax.kernels.mosaic import persistent_backward as pb
from rhhjax.kernels.mosaic import persistent_forward as pf
from rhhjax.kernels.mosaic import persistent_pair as pair
from rhhjax.kernels.mosaic import persistent_pair_backward as ppb
from rhhjax.kernels.mosaic.plan import PersistentPlan, PlanError
from rhhjax.ops import cells, fused, loops
from rhhjax.ops.persistent_plans import candidates, plan_for
from rhhjax.ops.persistent_variant import (  # noqa: F401 (the op's variant API, re-exported)
    DEFAULT_TEXT,
    PAIRED,
    REMOVED,
    TUNING,
    PersistentVariant,
    VariantError,
    from_fields,
    parse_variant,
    tuning_space,
)

if TYPE_CHECKING:
    from rhhjax.ops.sequence_spec import SequenceSpec

Array = jax.Array

NAME = "persistent"
INTERPRETABLE = True
KEEP_DTYPE = jnp.uint8
# With `SequenceSpec.last_layer_only` the backward reads layer L - 1's cotangent alone.
LAST_LAYER_COTANGENT = True


def variant_of(spec: SequenceSpec) -> PersistentVariant:
    return getattr(spec, "variant", None) or PersistentVariant()


def variant_at(spec: SequenceSpec, batch: int, width: int) -> PersistentVariant:
    """A cell's: the spec's if not the default, else the default where it runs, else grid."""
    variant = variant_of(spec)
    if variant != PersistentVariant():
        return variant
    interpret = bool(spec.interpret and not spec.references)
    choose = interpret_plan if interpret else plan_for
    try:
        plan = choose(batch, width, jnp.dtype(spec.dtype).name, variant.kernel_layout)
        rowgroup_layout.check(plan, variant.kernel_layout, True if interpret else None)
    except PlanError:
        return dataclasses.replace(variant, layout="grid")
    return variant


def variant_plans(
    variant: PersistentVariant, batch: int, width: int, hyper_width: int, dtype_name: str,
    interpret: bool = False,
) -> tuple:  # fmt: skip
    """(layout, main plan, hyper plan or None: hyper_width 0) at ``variant``, else PlanError."""
    from rhhjax.ops.sequence_spec import SequenceSpec

    spec = SequenceSpec(NAME, 1.0, jnp.dtype(dtype_name), interpret=interpret, variant=variant)
    main = _plan_of(spec, batch, width)
    hyper = _plan_of(spec, batch, hyper_width) if hyper_width else None
    for plan in filter(None, (main, hyper)):
        rowgroup_layout.check(plan, variant.kernel_layout, True if interpret else None)
    if variant.layout == PAIRED and hyper is not None:
        main, hyper = pair.fit_plans(main, hyper)
        pair.check_pair(main, hyper, True if interpret else None)
    return variant.layout, main, hyper


def variant_candidates(
    batch: int, width: int, hyper_width: int, dtype_name: str, interpret: bool = False
) -> list[PersistentVariant]:
    """`tuning_space` where `variant_plans` runs it (else in the grid), one a distinct plan."""
    args = (batch, width, hyper_width, dtype_name, interpret)
    layout = "rowgroup" if _plans_or_none(PersistentVariant(), *args) else "grid"
    runs = {}
    for variant in tuning_space():
        if variant.layout != PAIRED:
            variant = dataclasses.replace(variant, layout=layout)
        plans = _plans_or_none(variant, *args)
        if plans is not None:
            runs.setdefault(plans, variant)
    return list(runs.values())


def _plans_or_none(variant: PersistentVariant, *args) -> tuple | None:
    try:
        return variant_plans(variant, *args)
    except PlanError:
        return None


@functools.cache
def interpret_plan(batch: int, width: int, dtype_name: str, layout: str = "grid") -> PersistentPlan:
    """The plan of GPU interpret mode: the candidate of the fewest blocks, then the most row
    blocks (as `plan_for`)."""
    plans = list(candidates(batch, width, dtype_name, layout))
    if not plans:
        return plan_for(batch, width, dtype_name, layout)

    plan = min(plans, key=lambda plan: (plan.grid, -plan.row_blocks, plan.n_pad))
    at_once = plan.grid if layout == "grid" else plan.col_blocks  # row groups: one at a time
    reason = gpu_interpret.cluster_too_large(at_once)
    if reason is not None and "NPROC" not in reason:
        reason += f"; use impl='mosaic' (also interpreted) or a model narrower than {width}"
    if reason is not None:
        raise PlanError(f"model.impl={NAME!r} needs {at_once} blocks for width {width}: {reason}")
    return plan


def _plan_of(spec: SequenceSpec, batch: int, width: int) -> PersistentPlan:
    variant = variant_at(spec, batch, width)
    choose = interpret_plan if spec.interpret and not spec.references else plan_for
    layout = variant.kernel_layout
    return variant.planned(choose(batch, width, jnp.dtype(spec.dtype).name, layout))


def _plan(spec: SequenceSpec, geo: Geometry) -> PersistentPlan:
    return _plan_of(spec, geo.batch, geo.n)


def geometry(spec: SequenceSpec, batch: int, width: int) -> Geometry:
    """Rows padded to the plan's ``b_pad``, units to its ``n_pad``."""
    plan = _plan_of(spec, batch, width)
    return Geometry(
        batch, width, plan.rows_per_block, plan.units_per_block, plan.k_chunk,
        plan.b_pad, plan.n_pad,
    )  # fmt: skip


def prepare_weights(spec, geo, kernel_s: Array, transposed: bool = False) -> tuple[Array]:
    """W_l [L, n, 2n] -> (forward [L * 2 * Np, k_pad] or backward [L * Np, 2 * Np],)."""
    plan = _plan(spec, geo)
    if transposed:
        return (pb.backward_weights(plan, kernel_s, spec.dtype),)
    return (pf.forward_weights(plan, kernel_s, spec.dtype),)


def scales_operand(spec: SequenceSpec, geo: Geometry, z: Array | None) -> Array | None:
    """z [T, L, B, n] -> [L, T, Bp, z_width] (the plan's), or None."""
    if z is None:
        return None
    z_width = _plan(spec, geo).z_width
    z_lt = jnp.swapaxes(z, 0, 1)
    pads = [(0, 0), (0, 0), (0, geo.b_pad - geo.batch), (0, z_width - geo.n)]
    return jnp.pad(z_lt, pads)


def saved_rows(has_z: bool) -> loops.Fields:
    """`fused`'s gates, or with z "full" [Bp, 2, Np] alone."""
    return (("full", 2),) if has_z else fused.saved_rows(has_z)


def _phase_major(x: Array | None) -> Array | None:
    return None if x is None else x.reshape(-1, *x.shape[2:])


def _cotangent_rows(g_states: Array) -> Array:
    return g_states if g_states.ndim == 3 else _phase_major(g_states)


def forward_loop(spec, geo, w, bias, s0, xproj, z, keep, hidden, save: bool):
    """The whole forward as one kernel: bias [L, 2, Np], s0 [Bp, Np], xproj [T, Bp, 2, Np],
    z [L, T, Bp, z_width] -> (states [T, L, Bp, Np], (packed [P, Bp, K, Np], s_mm
    [P * Bp, k_pad]) with ``save``, else None)."""
    if hidden is not None:
        raise ValueError(f"impl {NAME!r} has no variational dropout")
    plan, variant = _plan(spec, geo), variant_at(spec, geo.batch, geo.n)
    (stacked,) = w
    args = _kernel_operands(plan, geo, stacked, s0, xproj, bias, z, keep)
    outs = _run_forward(spec, variant, save, *args)
    return _cell_results(plan, outs, save, xproj.shape[0], bias.shape[0])


def _kernel_operands(plan, geo, stacked, s0, xproj, bias, z, keep) -> tuple:
    rows = _bias_rows(geo, bias)
    mask = keep_mask.decisions(_phase_major(keep))
    return plan, stacked, s0, xproj[..., : plan.z_width], rows, z, mask


def _run_forward(spec, variant: PersistentVariant, save: bool, *args) -> tuple:
    options = dict(save=save, keep=spec.keep)
    if spec.references:
        return pf.persistent_forward_reference(*args, **options)
    interpret = loops.kernel_interpret(spec)
    options |= dict(interpret=interpret, layout=variant.kernel_layout)
    outs = pf.persistent_forward(*args, **options)
    return _checked(variant, outs, "s_last" if save else None, "persistent forward")


def _checked(variant: PersistentVariant, outs, gave_up_nan: str | None, name: str):
    """``outs``, ``gave_up_nan`` NaN where a grid block gave up (training; else host-checked)."""
    if variant.kernel_layout == "rowgroup":
        return outs
    if gave_up_nan is None:
        grid_barrier.check_status(outs.status, name)
        return outs
    out = jnp.where(jnp.any(outs.status != 0), jnp.nan, getattr(outs, gave_up_nan))
    return outs._replace(**{gave_up_nan: out})


def grid_barrier_runs(
    variant: PersistentVariant, batch: int, width: int, hyper_width: int, dtype: str
) -> bool:
    """Whether a step at ``model.persistent`` ``variant`` runs a grid barrier."""
    from rhhjax.ops.sequence_spec import SequenceSpec

    spec = SequenceSpec(NAME, 1.0, jnp.dtype(dtype), variant=variant)
    widths = (width, hyper_width) if hyper_width else (width,)
    return any(variant_at(spec, batch, w).kernel_layout == "grid" for w in widths)


def _cell_results(plan: PersistentPlan, outs, save: bool, length: int, depth: int):
    if not save:
        return outs.states.reshape(length, depth, *outs.states.shape[1:]), None
    if plan.state_in_packed:
        states = _states_from_packed(outs.packed, outs.s_last, depth)
    else:
        states = _states_from_s_mm(outs.s_mm, outs.s_last, length, depth)
    return states, (outs.packed, outs.s_mm)


def _bias_rows(geo: Geometry, bias: Array) -> Array:
    return jnp.broadcast_to(bias[:, None], (bias.shape[0], geo.b_pad, *bias.shape[1:]))


def _states_from_packed(packed: Array, s_last: Array, depth: int) -> Array:
    """packed [P, Bp, K, Np] (row 0: input states) + s_last -> states [T, L, Bp, Np]."""
    inputs = packed[:, :, 0]
    layers = [inputs[layer + 1 :: depth] for layer in range(depth - 1)]
    layers.append(jnp.concatenate([inputs[depth::depth], s_last], axis=0))
    return jnp.stack(layers, axis=1)


def _states_from_s_mm(s_mm: Array, s_last: Array, length: int, depth: int) -> Array:
    """s_mm [P * Bp, k_pad] (layer-major) + s_last -> states [T, L, Bp, Np]."""
    n_pad = s_last.shape[-1]
    blocks = s_mm.reshape(depth, length, s_last.shape[1], -1)
    blocks = jnp.pad(blocks, [(0, 0)] * 3 + [(0, n_pad - blocks.shape[-1])])
    layers = [blocks[layer + 1] for layer in range(depth - 1)]
    layers.append(jnp.concatenate([blocks[0, 1:], s_last], axis=0))
    return jnp.stack(layers, axis=1)


def backward_loop(spec, geo, w, bias, s0, xproj, z, keep, hidden, saved, g_states):
    """The whole backward as one kernel: g_states [T, L, Bp, Np] or [T, Bp, Np] -> (ds0,
    d_xproj [T, 1, Bp, 2, Np], dz or None, dbias [L, 2, Np], dW [L, k_pad, 2, Np])."""
    del s0, hidden
    packed, s_mm = saved
    (stacked,) = w
    plan = _plan(spec, geo)
    depth = bias.shape[0]
    mask = keep_mask.decisions(_phase_major(keep))
    g = _cotangent_rows(g_states)
    rows = None if z is None else _bias_rows(geo, bias)
    s_prev = None if plan.state_in_packed else s_mm
    variant = variant_at(spec, geo.batch, geo.n)
    outs = _run_backward(spec, variant, plan, stacked, g, packed, z, mask, rows, s_prev)
    return _gradients(spec, geo, stacked, depth, outs, s_mm, z is not None)


def _run_backward(spec, variant: PersistentVariant, *args) -> tuple:
    if spec.references:
        return pb.persistent_backward_reference(*args, keep=spec.keep)
    interpret = loops.kernel_interpret(spec)
    layout = variant.kernel_layout
    outs = pb.persistent_backward(*args, keep=spec.keep, interpret=interpret, layout=layout)
    return _checked(variant, outs, "bias_parts", "persistent backward")


def _gradients(spec, geo, stacked, depth: int, outs, s_mm, has_z: bool) -> tuple:
    w0, d_mm = stacked[: geo.n_pad], outs.d_mm
    ds0 = outs.ds_carry0 + jnp.matmul(d_mm[: geo.b_pad], w0.T, preferred_element_type=jnp.float32)
    dbias = pb.bias_gradient(outs.bias_parts, depth)
    d_xproj = _padded_units(geo, outs.d_x)[:, None]
    dz = _padded_units(geo, jnp.swapaxes(outs.dz, 0, 1)) if has_z else None
    return ds0, d_xproj, dz, dbias, _weight_gradient(spec, depth, d_mm, s_mm)


def _padded_units(geo: Geometry, x: Array) -> Array:
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, geo.n_pad - x.shape[-1])])


def _weight_gradient(spec, depth: int, d_mm: Array, s_mm: Array) -> Array:
    """dW [L, k_pad, 2, Np] from d_mm and s_mm: one batched GEMM."""
    s_in = s_mm.reshape(depth, -1, s_mm.shape[-1])
    d_in = d_mm.reshape(depth, -1, d_mm.shape[-1])
    acc = cells.accumulation_dtype(spec.dtype)
    dw = jnp.einsum("lri,lrc->lic", s_in, d_in, preferred_element_type=acc)
    return dw.reshape(depth, s_mm.shape[-1], 2, -1)


def record_timeline(path, variant: PersistentVariant | None = None, batch: int = 256,
                    width: int = 1000, steps: int = 100, depth: int = 7,
                    dtype: str = "bfloat16", *, interpret=None, keep: float = 0.75,
                    seed: int = 0) -> dict:  # fmt: skip
    """The paper main cell's forward and backward once, timeline on (random operands, z and
    dropout on): the raw stamps, also saved to ``path`` (npz)."""
    import numpy as np

    from rhhjax.kernels.mosaic import phase_timeline
    from rhhjax.ops.sequence_spec import SequenceSpec

    spec = SequenceSpec(NAME, 1.0, jnp.dtype(dtype), interpret=interpret is not None)
    if variant is not None and variant.layout == PAIRED:
        raise VariantError("the timeline records the main cell alone: layout=paired has none")
    variant = variant_at(dataclasses.replace(spec, variant=variant), batch, width)
    _, plan, _ = variant_plans(variant, batch, width, 0, dtype, interpret is not None)
    keys = iter(jax.random.split(jax.random.key(seed), 8))
    normal = lambda *shape: 0.3 * jax.random.normal(next(keys), shape)  # noqa: E731
    b, n, zw, phases = plan.b_pad, plan.n_pad, plan.z_width, steps * depth
    kernel_s = normal(depth, width, 2 * width)
    bias, z = normal(depth, b, 2, n), 1.0 + normal(depth, steps, b, zw)
    mask = keep_mask.decisions(jax.random.bernoulli(next(keys), keep, (phases, b, n)))
    options = dict(keep=keep, interpret=interpret, layout=variant.kernel_layout, timeline=True)
    forward = jax.jit(functools.partial(pf.persistent_forward, plan, save=True, **options))
    w_blk = pf.forward_weights(plan, kernel_s, plan.dtype)
    saved, fwd = forward(w_blk, normal(b, n), normal(steps, b, 2, zw), bias, z, mask)
    backward = jax.jit(functools.partial(pb.persistent_backward, plan, **options))
    s_mm = None if plan.state_in_packed else saved.s_mm
    wt = pb.backward_weights(plan, kernel_s, plan.dtype)
    _, bwd = backward(wt, normal(phases, b, n), saved.packed, z, mask, bias, s_mm)
    out = dict(forward_stamps=fwd.stamps, forward_sm=fwd.sm, backward_stamps=bwd.stamps,
               backward_sm=bwd.sm)  # fmt: skip
    out = {k: np.asarray(v) for k, v in out.items()}
    out |= dict(events=np.array(phase_timeline.EVENTS), plan=np.array(str(plan)),
                variant=np.array(variant.text()))  # fmt: skip
    np.savez(path, **out)
    return out


def pair_plans(spec: SequenceSpec, batch: int, width: int, hyper_width: int):
    """(main, hyper) forward plans of a HyperRHN's two cells in one launch (``layout=paired``),
    or None at another layout; PlanError (one line) where they cannot run so."""
    variant = variant_of(spec)
    if variant.layout != PAIRED:
        return None
    interpret = bool(spec.interpret and not spec.references)
    dtype_name = jnp.dtype(spec.dtype).name
    _, main, hyper = variant_plans(variant, batch, width, hyper_width, dtype_name, interpret)
    return main, hyper


def pair_forward_loop(spec, geos, kernels, operands, proj_kernel, proj_bias, save: bool):
    """Both cells' forward in one launch: geos, kernels (W [L, n, 2n]) and operands (as
    `forward_loop` takes them) are (hyper, main) pairs. Returns (hyper (states, saved), main
    (states, saved), z [L, T, Bp, z_width] for the main cell's backward)."""
    geo_h, geo_m = geos
    plan, hyper_plan = pair_plans(spec, geo_m.batch, geo_m.n, geo_h.n)
    if operands[0][5] is not None or operands[1][5] is not None:
        raise ValueError(f"impl {NAME!r} has no variational dropout")
    length, depth = operands[1][2].shape[0], operands[1][0].shape[0]

    def cell(cell_plan, geo, kernel_s, ops):
        bias, s0, xproj, _, keep, _ = ops
        stacked = pf.forward_weights(cell_plan, kernel_s, spec.dtype)
        args = _kernel_operands(cell_plan, geo, stacked, s0, xproj, bias, None, keep)
        return pair.CellOperands(*args[1:5], args[6])

    main = cell(plan, geo_m, kernels[1], operands[1])
    cells_in = (main, cell(hyper_plan, geo_h, kernels[0], operands[0]))
    proj = pair.projection_weights(plan, hyper_plan, proj_kernel, spec.dtype)
    args = (plan, hyper_plan, *cells_in, proj, pair.projection_bias(plan, proj_bias))
    if spec.references:
        outs = pair.persistent_pair_forward_reference(*args, save=save, keep=spec.keep)
    else:
        interpret = loops.kernel_interpret(spec)
        outs = pair.persistent_pair_forward(*args, save=save, keep=spec.keep, interpret=interpret)
        main = _checked(variant_of(spec), outs.main, "s_last" if save else None, "persistent pair")
        outs = outs._replace(main=main)
    hyper = _cell_results(hyper_plan, outs.hyper, save, length, depth)
    return hyper, _cell_results(plan, outs.main, save, length, depth), outs.z


def pair_backward_loop(spec, args_h, args_m, proj_kernel) -> tuple:
    """Both cells' backward in one launch: args_h and args_m as `backward_loop` takes them
    (the hyper cell's g every phase's, dz @ P_l still to add). Returns (hyper's, main's)
    `backward_loop` results."""
    cells_in = []
    for (cell_spec, geo, w, bias, _, _, z, keep, _, saved, g_states), has_z in (
        (args_m, True), (args_h, False)
    ):  # fmt: skip
        plan = _plan(cell_spec, geo)
        (stacked,) = w
        mask = keep_mask.decisions(_phase_major(keep))
        s_prev = None if plan.state_in_packed else saved[1]
        rows = _bias_rows(geo, bias) if has_z else None
        g = _cotangent_rows(g_states)
        ops = ppb.BackwardOperands(stacked, g, saved[0], z, mask, rows, s_prev)
        cells_in.append((plan, geo, stacked, ops, saved[1]))
    (plan, geo_m, w_m, main, s_mm_m), (hyper_plan, geo_h, w_h, hyper, s_mm_h) = cells_in
    plan, hyper_plan = ppb.fit_plans(plan, hyper_plan)
    args = (plan, hyper_plan, main, hyper, ppb.projection(plan, hyper_plan, proj_kernel))
    if spec.references:
        outs = ppb.persistent_pair_backward_reference(*args, keep=spec.keep)
    else:
        interpret = loops.kernel_interpret(spec)
        outs = ppb.persistent_pair_backward(*args, keep=spec.keep, interpret=interpret)
        main_out = _checked(variant_of(spec), outs.main, "bias_parts", "persistent pair backward")
        outs = outs._replace(main=main_out)
    depth = args_m[3].shape[0]
    hyper_grads = _gradients(spec, geo_h, w_h, depth, outs.hyper, s_mm_h, False)
    return hyper_grads, _gradients(spec, geo_m, w_m, depth, outs.main, s_mm_m, True)
