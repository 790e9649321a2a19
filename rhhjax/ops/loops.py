"""What the whole-sequence implementations share: the saved rows packed into one array per
step (`pack`, `unpack`), the generic forward scan and the gradients formed after the reverse
loop. Shapes: [T, L, Bp, Np], K packed rows."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from rhhjax.ops import cells

if TYPE_CHECKING:
    from rhhjax.kernels.layout import Geometry

Array = jax.Array
Fields = tuple[tuple[str, int], ...]  # (name, rows of Np) saved per micro-layer


def padded_scales(spec, geo: Geometry, z: Array | None) -> Array | None:
    """A `scales_operand` that pads: z [T, L, B, n] -> [T, L, Bp, Np], or None."""
    del spec
    return geo.pad_rows(z)


def kernel_interpret(spec) -> Any:
    """``interpret=`` of a Mosaic GPU kernel call: interpret params or None (compiled)."""
    from rhhjax.kernels.mosaic import interpret as gpu_interpret

    return gpu_interpret.params() if spec.interpret else None


def dropout_mask(keep: float, keep_l: Array | None, dtype) -> Array | None:
    """Keep decisions [Bp, Np] -> mask (0 or 1/keep), or None."""
    return None if keep_l is None else keep_l.astype(dtype) / keep


def per_layer(x: Array) -> tuple[Array, ...]:
    """[L, ...] -> L arrays, sliced once outside the time loops."""
    return tuple(x[layer] for layer in range(x.shape[0]))


def pack(s_in: Array, saved_l: dict, fields: Fields) -> Array:
    """Input state [Bp, Np] + saved arrays -> one [Bp, K, Np] array."""
    rows = [s_in[:, None]] + [saved_l[name].reshape(s_in.shape[0], n, -1) for name, n in fields]
    return jnp.concatenate(rows, axis=1)


def unpack(packed: Array, fields: Fields) -> tuple[Array, dict]:
    """Inverse of `pack`: [..., Bp, K, Np] -> (input state [..., Bp, Np], saved)."""
    saved, offset = {}, 1
    for name, n in fields:
        saved[name] = packed[..., offset, :] if n == 1 else packed[..., offset : offset + n, :]
        offset += n
    return packed[..., 0, :], saved


def states_from_inputs(inputs: Array, s_last: Array) -> Array:
    """Input states [T, L, Bp, Np] + final state -> each micro-layer's output state."""
    last_layer = jnp.concatenate([inputs[1:, 0], s_last[None]], axis=0)
    return jnp.concatenate([inputs[:, 1:], last_layer[:, None]], axis=1)


def forward_scan(
    layer_forward: Callable, fields: Fields, w, bias, s0, xproj, z, keep, hidden, save: bool
):
    """Forward over all steps with ``layer_forward`` per micro-layer.

    layer_forward(s, w_l, z_l, bias_l, xproj_t, keep_l, hidden_l) -> (s_new, saved).
    Returns (states [T, L, Bp, Np], packed [T, L, Bp, K, Np] with ``save`` else None).
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
    """dW [L, Np, 2, Np]: one matmul per layer over the saved inputs [T, L, Bp, K, Np]
    (times ``hidden``) and d_scaled [T, L, Bp, 2, Np], f32 accumulation."""
    inputs, _ = unpack(packed, fields)
    matmul_inputs = inputs if hidden is None else inputs * hidden[None]
    return jnp.einsum(
        "tlbi,tlbho->liho",
        matmul_inputs.astype(dtype),
        d_scaled.astype(dtype),
        preferred_element_type=cells.accumulation_dtype(dtype),
    )


def gradients_from_da(da: Array, z: Array | None, packed: Array, fields: Fields):
    """da [T, L, Bp, 2, Np] -> (d_scaled, dz [T, L, Bp, Np] or None, dbias [L, 2, Np])."""
    d_scaled = da if z is None else da * z[:, :, :, None]
    dz = None
    if z is not None:
        _, saved = unpack(packed, fields)
        dz = jnp.sum(da * saved["full"], axis=-2)
    return d_scaled, dz, da.sum((0, 2))
