"""Pieces the whole-sequence implementations share (`rhhjax.ops.fused`, `pallas`, `mosaic`).

What they refuse to run (`whole_sequence_unsupported`, `kernel_unsupported`), the saved rows of
one micro-layer packed into ONE array per step (`pack` / `unpack`), the per-layer slicing done
once outside the time loops (`per_layer`), the output states from the saved input states
(`states_from_inputs`), the generic forward time loop over a one-micro-layer function
(`forward_scan`) and the gradients formed after the reverse loop from the stacked
pre-activation gradients (`gradients_from_da`).

Shapes: T time, L depth, Bp padded batch, Np padded units, K packed rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from rhhjax.ops import cells

if TYPE_CHECKING:
    from rhhjax.kernels.layout import Geometry
    from rhhjax.ops.sequence_spec import ModelFacts

Array = jax.Array
Fields = tuple[tuple[str, int], ...]  # (name, rows of Np) saved per micro-layer


def whole_sequence_unsupported(name: str, model: ModelFacts) -> str | None:
    """What no whole-sequence op runs: LSTMs, and HyperRHNs whose hyper cell reads the main
    state (the hyper recurrence must run first). None, or the one-line reason."""
    if model.model_type == "lstm":
        return f"model.impl={name!r} is only for RHN models; use 'scan' for lstm"
    if model.model_type == "hyperrhn" and model.hyper_input != "x":
        return (
            f"model.impl={name!r} needs model.hyper_input='x' (x_and_state reads the "
            "main state, so the hyper recurrence cannot run first); use impl='scan'"
        )
    return None


def kernel_unsupported(name: str, model: ModelFacts) -> str | None:
    """What the kernel implementations (`pallas`, `mosaic`) cannot run besides
    `whole_sequence_unsupported`: variational dropout and rank-d HyperRHNs (their kernels
    scale output columns only). None, or the one-line reason."""
    reason = whole_sequence_unsupported(name, model)
    if reason is None and model.dropout == "variational":
        reason = (
            f"model.impl={name!r} supports dropout='gate' or 'none'; use impl='fused' "
            "for variational dropout"
        )
    if reason is None and model.hyper_rank > 0:
        reason = (
            f"model.hyper_rank={model.hyper_rank} is not supported by model.impl={name!r} (its "
            "kernels scale output columns only); use impl='fused' or 'scan'"
        )
    return reason


def available_everywhere(pallas_mode: str, platform: str | None) -> str | None:
    """An `unavailable` that never refuses: the implementation runs on every platform in every
    `model.pallas_mode`."""
    del pallas_mode, platform
    return None


def runs_itself(model: ModelFacts) -> tuple[str, str] | None:
    """A `substitute` that names none: the implementation runs every model it supports."""
    del model
    return None


def padded_scales(geo: Geometry, z: Array | None) -> Array | None:
    """A `scales_operand` that pads: z [T, L, B, n] -> [T, L, Bp, Np] (or None), the layout
    of the time loops that read z per step."""
    return geo.pad_rows(z)


def hopper_unavailable(name: str, pallas_mode: str, platform: str | None) -> str | None:
    """Why the Mosaic GPU implementation `name` (`mosaic`, `persistent`) cannot run here, or
    None: compiled on a GPU ("auto" there); lowered for a GPU anywhere ("compiled": the
    deviceless compile report; `lowering_only` refuses to execute it off a GPU); executed in
    GPU interpret mode anywhere ("interpret") where jax has it."""
    from rhhjax.kernels.mosaic import interpret as gpu_interpret

    if pallas_mode == "compiled":
        return None
    if pallas_mode == "interpret":
        return gpu_interpret.unavailable(f"model.impl={name!r} with model.pallas_mode='interpret'")
    platform = platform or jax.default_backend()
    if platform == "gpu":
        return None
    return (
        f"model.impl={name!r} compiles Mosaic GPU kernels for a Hopper GPU, and the platform "
        f"is {platform}: {_off_gpu_advice()}"
    )


def lowering_only(name: str, pallas_mode: str, platform: str | None) -> str | None:
    """Why the kernels of `name` (`pallas`, `mosaic`, `persistent`) in `pallas_mode` can be
    lowered for a GPU but not executed on `platform`, or None: "compiled" off a GPU (the
    deviceless compile report's mode; nothing executes a GPU kernel on a CPU)."""
    platform = platform or jax.default_backend()
    if pallas_mode != "compiled" or platform == "gpu":
        return None
    return (
        f"model.pallas_mode='compiled' only lowers the kernels of model.impl={name!r} for a GPU "
        f"(the deviceless compile report); they cannot execute on {platform}: "
        f"{_off_gpu_advice(name == 'pallas')}"
    )


def _off_gpu_advice(pallas: bool = False) -> str:
    """What runs the model off a GPU, as settings that work with the installed jax."""
    from rhhjax.kernels.mosaic import interpret as gpu_interpret

    if pallas or gpu_interpret.available():
        how = "Pallas" if pallas else "GPU"
        return (
            f"use model.pallas_mode='interpret' (the kernels executed in {how} interpret "
            "mode: slow, for checking), or model.impl='fused' or 'scan'"
        )
    return (
        "use model.impl='fused' or 'scan' (executing the kernels on a CPU, "
        f"model.pallas_mode='interpret', needs jax >= {gpu_interpret.MIN_JAX})"
    )


def kernel_interpret(spec) -> Any:
    """The ``interpret=`` of a Mosaic GPU kernel call under `spec`: GPU interpret mode's
    parameters (race detector on) when `spec.interpret`, else None (compiled)."""
    from rhhjax.kernels.mosaic import interpret as gpu_interpret

    return gpu_interpret.params() if spec.interpret else None


def dropout_mask(keep: float, keep_l: Array | None, dtype) -> Array | None:
    """Keep decisions [Bp, Np] (bool or int8) -> inverted-dropout mask (0 or 1/keep), or None."""
    return None if keep_l is None else keep_l.astype(dtype) / keep


def per_layer(x: Array) -> tuple[Array, ...]:
    """[L, ...] -> L arrays, sliced once outside the time loops."""
    return tuple(x[layer] for layer in range(x.shape[0]))


def pack(s_in: Array, saved_l: dict, fields: Fields) -> Array:
    """[Bp, Np] input state + saved arrays -> ONE [Bp, K, Np] array (one store per step)."""
    rows = [s_in[:, None]] + [saved_l[name].reshape(s_in.shape[0], n, -1) for name, n in fields]
    return jnp.concatenate(rows, axis=1)


def unpack(packed: Array, fields: Fields) -> tuple[Array, dict]:
    """Inverse of `pack` ([..., Bp, K, Np]): (input state [..., Bp, Np], saved arrays)."""
    saved, offset = {}, 1
    for name, n in fields:
        saved[name] = packed[..., offset, :] if n == 1 else packed[..., offset : offset + n, :]
        offset += n
    return packed[..., 0, :], saved


def states_from_inputs(inputs: Array, s_last: Array) -> Array:
    """[T, L, Bp, Np] input states + final state -> the output state of every micro-layer:
    the output of (t, l) is the input of (t, l + 1), or of (t + 1, 0)."""
    last_layer = jnp.concatenate([inputs[1:, 0], s_last[None]], axis=0)
    return jnp.concatenate([inputs[:, 1:], last_layer[:, None]], axis=1)


def forward_scan(
    layer_forward: Callable, fields: Fields, w, bias, s0, xproj, z, keep, hidden, save: bool
):
    """Forward over all steps with `layer_forward` per micro-layer, in the padded layout.

    layer_forward(s [Bp, Np], w_l, z_l, bias_l, xproj_t, keep_l, hidden_l) -> (s_new, saved)
    (z_l, keep_l, hidden_l [Bp, Np] or None; xproj_t [Bp, 2, Np] at layer 0, else None).
    w, bias: tuples of L per-layer arrays. Returns (states [T, L, Bp, Np], packed
    [T, L, Bp, K, Np] or None): with `save`, each micro-layer's input state and saved arrays
    (`fields`) in one array, so that every step stores one array and the backward reads one.
    """
    depth = len(w)

    def body(s, inputs):
        xproj_t, z_t, keep_t = inputs
        outputs = []
        for layer in range(depth):
            s_in = s
            s, saved_l = layer_forward(
                s,
                w[layer],
                None if z_t is None else z_t[layer],
                bias[layer],
                xproj_t if layer == 0 else None,
                None if keep_t is None else keep_t[layer],
                None if hidden is None else hidden[layer],
            )
            outputs.append(pack(s_in, saved_l, fields) if save else s)
        return s, jnp.stack(outputs)

    s_last, outputs = jax.lax.scan(body, s0, (xproj, z, keep))
    if not save:
        return outputs, None
    return states_from_inputs(outputs[..., 0, :], s_last), outputs


def deferred_weight_gradient(
    dtype, packed: Array, d_scaled: Array, fields: Fields, hidden: Array | None = None
) -> Array:
    """dW [L, Np, 2, Np] after the reverse loop: one [Np, T*Bp] x [T*Bp, 2*Np] matmul per
    layer over the saved input states (packed [T, L, Bp, K, Np], times the variational
    masks ``hidden`` [L, Bp, Np] when given) and d_scaled [T, L, Bp, 2, Np], both in the
    matmul ``dtype``, accumulated in float32."""
    inputs, _ = unpack(packed, fields)
    matmul_inputs = inputs if hidden is None else inputs * hidden[None]
    return jnp.einsum(
        "tlbi,tlbho->liho",
        matmul_inputs.astype(dtype),
        d_scaled.astype(dtype),
        preferred_element_type=cells.accumulation_dtype(dtype),
    )


def gradients_from_da(da: Array, z: Array | None, packed: Array, fields: Fields):
    """After the reverse loop, from the stacked pre-activation gradients da [T, L, Bp, 2, Np]
    (no per-step reduction inside the loop): (d_scaled = da * [z, z] [T, L, Bp, 2, Np], the
    operand of the deferred weight gradient; dz [T, L, Bp, Np] = sum over the halves of
    da * "full", the saved unscaled sum, or None without z; dbias [L, 2, Np])."""
    d_scaled = da if z is None else da * z[:, :, :, None]
    dz = None
    if z is not None:
        _, saved = unpack(packed, fields)
        dz = jnp.sum(da * saved["full"], axis=-2)
    return d_scaled, dz, da.sum((0, 2))
