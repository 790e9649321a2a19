"""`benchmarks/gemm_rate.py`: the GEMM loop measures the dependent GEMMs it claims to."""

import jax.numpy as jnp
import numpy as np
import pytest
from benchmark_scripts import load

gemm_rate = load("gemm_rate")
hl = load("hlo.launches")


@pytest.mark.parametrize("m, k, n", [(8, 16, 32), (16, 16, 16)])
def test_gemm_loop_keeps_every_dependent_gemm_inside_one_loop(m, k, n):
    """The instrument measures what it claims: the compiled loop runs 2 GEMMs per iteration
    (1 for a square), none hoisted or re-associated, and (a @ w) @ w.T returns a."""
    iters = 3
    w = gemm_rate.orthonormal_rows(k, n, 1) if k < n else gemm_rate.orthonormal_rows(n, n, 1)
    a = np.random.default_rng(0).standard_normal((m, k)).astype(np.float32)
    f = gemm_rate.gemm_loop(m == k == n, iters)
    args = (jnp.asarray(a), jnp.asarray(w), jnp.asarray(np.ascontiguousarray(w.T)))
    text = f.lower(*args).compile().as_text()
    comps = hl.parse_module(text)
    (loop,) = [lp for lp in hl.find_loops(comps) if lp.trips == iters]
    gemm_flops = [lc.flops for lc in loop.launches if lc.flops]
    assert gemm_flops == [2 * m * k * n] * (1 if m == k == n else 2)
    out = np.asarray(f(*args))
    expected = a @ np.linalg.matrix_power(w, iters) if m == k == n else a
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
    row = gemm_rate.gemm_row("x", m, k, n, "float32", iters, 1, "cpu")  # what XLA compiled
    assert row["loop_gemm_flops"] == gemm_flops and row["launches_per_iter"] >= len(gemm_flops)
    assert row["gemms"] == iters * len(gemm_flops)


def test_the_shapes_are_the_square_then_the_recurrences_own():
    shapes = gemm_rate.gemm_shapes(1000, 128, 256, 8192)
    assert shapes == [
        ("square", 8192, 8192, 8192),
        ("main", 256, 1000, 2000),
        ("hyper", 256, 128, 256),
        ("hyper_proj", 256, 128, 1000),
    ]
