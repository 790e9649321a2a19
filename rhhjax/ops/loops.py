"""Pieces the whole-sequence implementations share (`rhhjax.ops.fused`, `rhhjax.ops.pallas`).

The saved rows of one micro-layer packed into ONE array per step (`pack` / `unpack`), the
per-layer slicing done once outside the time loops (`per_layer`), the output states from the
saved input states (`states_from_inputs`) and the generic forward time loop over a
one-micro-layer function (`forward_scan`).

Shapes: T time, L depth, Bp padded batch, Np padded units, K packed rows.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

Array = jax.Array
Fields = tuple[tuple[str, int], ...]  # (name, rows of Np) saved per micro-layer


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
