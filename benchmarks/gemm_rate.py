"""bench.py's ``gemm`` part: the GEMM rate inside one jitted ``lax.fori_loop`` of dependent
GEMMs (each reads the previous result: XLA can neither hoist nor batch them), at a large
square and at the recurrence's own shapes, each of those followed by its transposed GEMM so
the loop carries ``[B, n]`` (orthonormal rows keep the values bounded)."""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from hlo import launches as hl

from rhhjax import models


def gemm_shapes(n: int, h: int, batch: int, square: int) -> list[tuple[str, int, int, int]]:
    """(name, M, K, N) of the measured GEMMs: the large square, then the recurrence's own:
    main cell [B, n] x [n, 2n], hyper cell [B, h] x [h, 2h], hyper projection [B, h] x [h, n]
    (n = hidden, h = hyper_hidden, B = the batch)."""
    return [
        ("square", square, square, square),
        ("main", batch, n, 2 * n),
        ("hyper", batch, h, 2 * h),
        ("hyper_proj", batch, h, n),
    ]


def orthonormal_rows(k: int, n: int, seed: int) -> np.ndarray:
    """[k, n] (k <= n) with orthonormal rows: ``w @ w.T = I``, so ``(a @ w) @ w.T = a``
    (computed on the host: no LAPACK call under jit)."""
    g = np.random.default_rng(seed).standard_normal((n, k))
    q, _ = np.linalg.qr(g)  # [n, k], orthonormal columns
    return q.T.astype(np.float32)


def gemm_loop(square: bool, iters: int):
    """Jitted ``(a [m, k], w [k, n], wt [n, k]) -> a`` after ``iters`` dependent iterations
    of ``a <- a @ w`` (``square``) or ``a <- (a @ w) @ wt`` (float32 accumulation, the result
    in a's dtype). An optimization barrier between the two GEMMs keeps XLA from
    re-associating them into one loop-invariant product."""

    def run(a, w, wt):
        def body(_, a):
            c = jnp.matmul(a, w, preferred_element_type=jnp.float32).astype(a.dtype)
            if square:
                return c
            c = jax.lax.optimization_barrier(c)
            return jnp.matmul(c, wt, preferred_element_type=jnp.float32).astype(a.dtype)

        return jax.lax.fori_loop(0, iters, body, a)

    return jax.jit(run)


def gemm_row(
    name: str, m: int, k: int, n: int, dtype: str, iters: int, repeats: int, device: str
) -> dict:
    """Times the GEMM loop on ``device`` (its name, for the row): microseconds per GEMM and
    TFLOP/s (median of ``repeats`` calls after a compile-and-warm-up call)."""
    dt = models.DTYPES[dtype]
    w = orthonormal_rows(k, n, 1) if k <= n else orthonormal_rows(n, k, 1).T
    a = np.random.default_rng(0).standard_normal((m, k)).astype(np.float32)
    a, w, wt = (jnp.asarray(x, dt) for x in (a, w, np.ascontiguousarray(w.T)))
    f = gemm_loop(m == k == n, iters).lower(a, w, wt).compile()
    loop = [lp for lp in hl.find_loops(hl.parse_module(f.as_text())) if lp.trips == iters]
    body = loop[0].launches if loop else []
    out = f(a, w, wt).block_until_ready()
    if not bool(jnp.isfinite(out.astype(jnp.float32)).all()):
        raise RuntimeError(f"GEMM loop {name} {dtype}: non-finite result")
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        f(a, w, wt).block_until_ready()
        times.append(time.perf_counter() - start)
    gemms = iters * (1 if m == k == n else 2)
    seconds = statistics.median(times) / gemms
    return {
        "gemm": name,
        "shape": f"[{m},{k}]x[{k},{n}]",
        "m": m,
        "k": k,
        "n": n,
        "dtype": dtype,
        "device": device,
        "iters": iters,
        "gemms": gemms,
        "us_per_gemm": 1e6 * seconds,
        "tflops": 2.0 * m * k * n / seconds / 1e12,
        # what XLA compiled: launches per loop iteration (GEMMs + pads / converts / the loop
        # counter) and the FLOPs of each GEMM in the loop (padded shapes count more)
        "launches_per_iter": hl.per_step(body),
        "loop_gemm_flops": [lc.flops for lc in body if lc.flops],
    }


def format_gemm(row: dict) -> str:
    return (
        f"gemm {row['gemm']:<11}{row['shape']:<26}{row['dtype']:<10}"
        f"{row['us_per_gemm']:>10.1f} us{row['tflops']:>10.3f} TFLOP/s"
        f"  ({row['launches_per_iter']} launches per iteration)"
    )
