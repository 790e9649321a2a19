"""`kernels/mosaic/gemm.py`: the K loop of every Mosaic GPU kernel, with no wgmma left in
flight. On a CPU: the traced K loop waits for each wgmma before it refills a stage.
`TestCompiled`: a one-block kernel of `gemm_nt_to_smem` against ``jnp.dot`` with fewer, as
many and more K steps than stages, f32 and bf16: compiled on a GPU, executed in GPU
interpret mode (`TestInterpret`, jax >= 0.11.2, race detector on). The staged form (on
buffers that outlive one GEMM): two GEMMs in a row against ``jnp.dot``, and its traced
copies; with A multicast in a cluster of blocks, two GEMMs a block against ``jnp.dot``
(interpret mode copies A to each block: only a GPU multicasts) and the traced order of a
refill."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_cases import MosaicGpuMode
from rhhjax.kernels.mosaic import gemm
from rhhjax.kernels.mosaic import interpret as gpu_interpret
from rhhjax.kernels.mosaic.gemm import gemm_nt_to_smem

ROWS, COLS, TILE_K = 64, 32, 32


def _gemm_kernel(k_steps: int, stages: int, interpret):
    """One block: out [ROWS, COLS] f32 = A[block 1] @ B[block 1]^T of A [2 ROWS, K] and
    B [2 COLS, K]."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def kernel(a_g, b_g, out_g, out_s):
        gemm_nt_to_smem(
            out_s, a_g, b_g, 1, 1,
            tile_k=TILE_K, k_steps=k_steps, stages=stages,
        )  # fmt: skip
        plgpu.copy_smem_to_gmem(out_s, out_g)
        plgpu.wait_smem_to_gmem(0)

    return plgpu.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct((ROWS, COLS), jnp.float32),
        scratch_types=dict(out_s=plgpu.SMEM((ROWS, COLS), jnp.float32)),
        interpret=interpret,
    )


def _operands(dtype, k_steps: int, seed: int):
    ka, kb = jax.random.split(jax.random.key(seed))
    k = k_steps * TILE_K
    a = jax.random.normal(ka, (2 * ROWS, k), jnp.float32).astype(dtype)
    b = jax.random.normal(kb, (2 * COLS, k), jnp.float32).astype(dtype)
    return a, b


def _primitives(jaxpr):
    """(name, equation) of every equation, sub-jaxprs in place (depth first)."""
    for eqn in jaxpr.eqns:
        yield eqn.primitive.name, eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, tuple | list) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _primitives(inner)


def _wait_n(eqn) -> int:
    """A wgmma_wait's group count: a parameter (jax 0.12), or its operand (jax 0.10)."""
    return eqn.params["n"] if "n" in eqn.params else eqn.invars[0].val


def test_a_stage_is_refilled_only_after_its_wgmma_is_waited_for(monkeypatch):
    """Traced (no kernel runs): the K loop issues wgmma, waits for it, and only then copies
    into a stage (no ``delay_release``); nothing is left to wait for after the loop."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    specs, pipeline = [], plgpu.emit_pipeline

    def recording(body, **kwargs):
        specs.extend(kwargs["in_specs"])
        return pipeline(body, **kwargs)

    monkeypatch.setattr(plgpu, "emit_pipeline", recording)
    kernel = _gemm_kernel(5, 2, None)
    a, b = _operands(jnp.bfloat16, 5, 0)
    seq = list(_primitives(jax.make_jaxpr(kernel)(a, b).jaxpr))
    assert [spec.delay_release for spec in specs] == [0, 0]
    names = [name for name, _ in seq]
    issue = names.index("wgmma_ref")
    wait = names.index("wgmma_wait", issue)
    assert _wait_n(seq[wait][1]) == 0
    assert "copy_gmem_to_smem" not in names[issue:wait]
    refill = names.index("copy_gmem_to_smem", wait)  # the loop's refill, after the wait
    waits = [_wait_n(eqn) for name, eqn in seq[refill:] if name == "wgmma_wait"]
    assert waits == []


def _staged_kernel(k_steps: int, stages: int, dtype, interpret):
    """One block, two GEMMs on the same stages: out [2, ROWS, COLS] f32, out[i] = A[1 - i]
    @ B[1 - i]^T."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def kernel(a_g, b_g, out_g, out_s, **buffers):
        staged = gemm.StagedOperands(**buffers)
        for i in range(2):
            gemm.gemm_nt_staged(out_s.at[i], staged, a_g, b_g, 1 - i, 1 - i, k_steps=k_steps)
        plgpu.copy_smem_to_gmem(out_s, out_g)
        plgpu.wait_smem_to_gmem(0)

    return plgpu.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct((2, ROWS, COLS), jnp.float32),
        scratch_types=dict(
            out_s=plgpu.SMEM((2, ROWS, COLS), jnp.float32),
            **gemm.staged_scratch(ROWS, COLS, TILE_K, stages, dtype),
        ),
        interpret=interpret,
    )


def test_the_staged_loop_issues_the_first_chunks_then_refills():
    """Traced: `gemm_nt_staged` issues B's and A's first chunks before its loop, and in the
    loop refills A and B alike."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def kernel(a_g, b_g, out_s, **buffers):
        staged = gemm.StagedOperands(**buffers)
        gemm.gemm_nt_staged(out_s, staged, a_g, b_g, 1, 1, k_steps=5)

    a, b = _operands(jnp.bfloat16, 5, 0)
    traced = plgpu.kernel(
        kernel,
        out_type=(),
        scratch_types=dict(
            out_s=plgpu.SMEM((ROWS, COLS), jnp.float32),
            **gemm.staged_scratch(ROWS, COLS, TILE_K, 2, jnp.bfloat16),
        ),
    )
    seq = list(_primitives(jax.make_jaxpr(traced)(a, b).jaxpr))
    copies = [eqn for name, eqn in seq if name == "copy_gmem_to_smem"]
    loop = [i for i, (name, _) in enumerate(seq) if name in ("scan", "while")][0]
    before = [eqn for name, eqn in seq[:loop] if name == "copy_gmem_to_smem"]
    assert len(before) == 4  # B's two stages and A's
    assert len(copies) == 6  # and in the loop one refill of A and one of B


def _split_kernel(k_steps: int, stages: int, dtype, interpret):
    """One block of two warpgroups, two GEMMs in a row split between them (`gemm.SplitK`):
    out [2, ROWS, COLS] f32, out[i] = A[1 - i] @ B[1 - i]^T."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def kernel(a_g, b_g, out_g, out_s, **scratch):
        lead = gemm.StagedOperands(**{k[5:]: v for k, v in scratch.items() if k[:5] == "lead_"})
        helper = gemm.StagedOperands(**{k[5:]: v for k, v in scratch.items() if k[:5] == "help_"})
        split = gemm.SplitK(helper, scratch["partial"], scratch["go"], scratch["done"])
        warpgroup = jax.lax.axis_index("wg")

        @pl.when(warpgroup == 0)
        def _():
            for i in range(2):
                gemm.lead_gemm(
                    out_s.at[i], lead, split, a_g, b_g, 1 - i, 1 - i, k_steps=k_steps,
                )  # fmt: skip
            plgpu.copy_smem_to_gmem(out_s, out_g)
            plgpu.wait_smem_to_gmem(0)

        @pl.when(warpgroup == 1)
        def _():
            for i in range(2):
                gemm.helper_gemm(split, a_g, b_g, 1 - i, 1 - i, k_steps=k_steps)

    def stage_types(prefix, steps):
        steps = max(min(stages, steps), 1)
        types = gemm.staged_scratch(ROWS, COLS, TILE_K, steps, dtype)
        return {prefix + name: t for name, t in types.items()}

    lead_steps, helper_steps = gemm.SplitK.halves(k_steps)
    return plgpu.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct((2, ROWS, COLS), jnp.float32),
        scratch_types=dict(
            out_s=plgpu.SMEM((2, ROWS, COLS), jnp.float32),
            **stage_types("lead_", lead_steps), **stage_types("help_", helper_steps),
            **gemm.split_scratch(ROWS, COLS),
        ),
        num_threads=2, thread_name="wg", interpret=interpret,
    )  # fmt: skip


CLUSTER = 2  # blocks sharing an operand in `_multicast_kernel`


def _multicast_kernel(k_steps: int, stages: int, dtype, interpret, shared="a"):
    """A cluster of CLUSTER blocks along "c", two GEMMs each on the same stages with the
    ``shared`` operand's chunks multicast: out [CLUSTER, 2, ROWS, COLS] f32, out[c, i] = the
    shared operand's block 1 - i against the other's block i * CLUSTER + c; a cluster
    barrier between the two GEMMs (`gemm_nt_staged`'s contract)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    axes = dict(a_axis="c") if shared == "a" else dict(b_axis="c")

    def kernel(a_g, b_g, out_g, out_s, between, **buffers):
        staged, c = gemm.StagedOperands(**buffers, **axes), jax.lax.axis_index("c")
        for i in range(2):
            if i:
                plgpu.barrier_arrive(between)
                plgpu.barrier_wait(between)
            own, other = 1 - i, i * CLUSTER + c
            a_block, b_block = (own, other) if shared == "a" else (other, own)
            gemm.gemm_nt_staged(
                out_s.at[i], staged, a_g, b_g, a_block, b_block, k_steps=k_steps,
            )  # fmt: skip
        plgpu.copy_smem_to_gmem(out_s, out_g.at[c])
        plgpu.wait_smem_to_gmem(0)

    return plgpu.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct((CLUSTER, 2, ROWS, COLS), jnp.float32),
        scratch_types=dict(
            out_s=plgpu.SMEM((2, ROWS, COLS), jnp.float32),
            between=plgpu.ClusterBarrier(collective_axes=("c",)),
            **gemm.staged_scratch(ROWS, COLS, TILE_K, stages, dtype, **axes),
        ),
        grid=(1,), grid_names=("x",), cluster=(CLUSTER,), cluster_names=("c",),
        interpret=interpret,
    )  # fmt: skip


def _multicast_operands(dtype, k_steps: int, seed: int, shared: str):
    """A [.., K] and B [.., K]: the shared operand 2 blocks, the other 2 * CLUSTER."""
    ka, kb = jax.random.split(jax.random.key(seed))
    k = k_steps * TILE_K
    a_rows = 2 * ROWS * (1 if shared == "a" else CLUSTER)
    b_rows = 2 * COLS * (1 if shared == "b" else CLUSTER)
    a = jax.random.normal(ka, (a_rows, k), jnp.float32).astype(dtype)
    return a, jax.random.normal(kb, (b_rows, k), jnp.float32).astype(dtype)


@pytest.mark.parametrize("shared", ["a", "b"])
def test_a_multicast_refill_waits_for_every_block_to_free_the_stage(shared):
    """Traced: the shared operand's copies are collective along the cluster axis, the
    other's are not; in the loop a refill comes after the wgmma wait and after arriving at
    and waiting on the stage's cluster barrier; the GEMM issues B's first chunks itself."""
    a, b = _multicast_operands(jnp.bfloat16, 5, 0, shared)
    kernel = _multicast_kernel(5, 2, a.dtype, None, shared)
    seq = list(_primitives(jax.make_jaxpr(kernel)(a, b).jaxpr))
    names = [name for name, _ in seq]
    copies = [eqn.params["collective_axes"] for name, eqn in seq if name == "copy_gmem_to_smem"]
    on_a, on_b = (("c",), None) if shared == "a" else (None, ("c",))
    # per GEMM: B's 2 first chunks, A's 2, then the loop's refill of A and of B
    assert copies == [on_b, on_b, on_a, on_a, on_a, on_b] * 2, copies
    loop = [i for i, name in enumerate(names) if name in ("scan", "while")][0]
    in_loop = names[loop + 1 :]
    wait, refill = in_loop.index("wgmma_wait"), in_loop.index("copy_gmem_to_smem")
    assert in_loop[wait:refill].count("barrier_arrive") == 1
    assert in_loop[wait:refill].count("barrier_wait") == 1


class TestCompiled(MosaicGpuMode):
    """`gemm_nt_to_smem` in a one-block kernel against ``jnp.dot`` on fresh random
    operands. f32 runs as TF32 in a compiled wgmma: its compiled tolerance is TF32's."""

    CASES = {
        # (k_steps, stages): fewer K steps than stages, as many, more, one step
        "steps": [(2, 4), (3, 3), (5, 2), (1, 2)],
        "dtype": ["bfloat16", "float32"],
    }
    TOL = {"bfloat16": 1e-4, "float32": 2e-2}

    def test_matches_jnp_dot(self, steps, dtype):
        k_steps, stages = steps
        a, b = _operands(jnp.dtype(dtype), k_steps, seed=k_steps * 10 + stages)
        kernel = _gemm_kernel(k_steps, stages, self.interpret())
        got = jax.block_until_ready(jax.jit(kernel)(a, b))
        want = jnp.dot(
            a[ROWS:].astype(jnp.float32),
            b[COLS:].astype(jnp.float32).T,
            precision=jax.lax.Precision.HIGHEST,
        )
        tol = self.TOL[dtype]
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol)

    def test_two_staged_gemms_in_a_row_match_jnp_dot(self, steps, dtype):
        """`gemm_nt_staged` twice on the same stages (the second GEMM waits each stage's
        mbarriers a second time)."""
        k_steps, stages = steps
        a, b = _operands(jnp.dtype(dtype), k_steps, seed=k_steps * 10 + stages + 1)
        got = jax.block_until_ready(
            jax.jit(_staged_kernel(k_steps, stages, a.dtype, self.interpret()))(a, b)
        )
        tol = self.TOL[dtype]
        for i in range(2):
            rows, cols = (
                slice((1 - i) * ROWS, (2 - i) * ROWS),
                slice((1 - i) * COLS, (2 - i) * COLS),
            )
            want = jnp.dot(
                a[rows].astype(jnp.float32),
                b[cols].astype(jnp.float32).T,
                precision=jax.lax.Precision.HIGHEST,
            )
            np.testing.assert_allclose(np.asarray(got[i]), np.asarray(want), rtol=tol, atol=tol)

    def test_two_gemms_split_between_two_warpgroups_match_jnp_dot(self, steps, dtype):
        """`lead_gemm` and `helper_gemm` (warpgroup 0 the first half of the K chunks, 1 the
        rest into the partial tile it adds), twice in a row on the same stages."""
        k_steps, stages = steps
        if k_steps < 2:
            pytest.skip("a split needs 2 K steps")
        a, b = _operands(jnp.dtype(dtype), k_steps, seed=k_steps * 10 + stages + 3)
        kernel = _split_kernel(k_steps, stages, a.dtype, self.interpret())
        got = jax.block_until_ready(jax.jit(kernel)(a, b))
        a32, b32, tol = a.astype(jnp.float32), b.astype(jnp.float32), self.TOL[dtype]
        for i in range(2):
            a_i, b_i = a32[(1 - i) * ROWS : (2 - i) * ROWS], b32[(1 - i) * COLS : (2 - i) * COLS]
            want = jnp.dot(a_i, b_i.T, precision=jax.lax.Precision.HIGHEST)
            np.testing.assert_allclose(np.asarray(got[i]), np.asarray(want), rtol=tol, atol=tol)

    @pytest.mark.parametrize("shared", ["a", "b"])
    def test_a_multicast_in_a_cluster_matches_jnp_dot(self, steps, dtype, shared):
        """`gemm_nt_staged` with an operand's multicast axis: each block of the cluster gets
        the same chunks of that operand and its own of the other, twice on the same stages."""
        k_steps, stages = steps
        if self.INTERPRET and (reason := gpu_interpret.cluster_too_large(CLUSTER)):
            pytest.skip(reason)
        seed = k_steps * 10 + stages + 2
        a, b = _multicast_operands(jnp.dtype(dtype), k_steps, seed, shared)
        kernel = _multicast_kernel(k_steps, stages, a.dtype, self.interpret(), shared)
        got = jax.block_until_ready(jax.jit(kernel)(a, b))
        a32, b32 = a.astype(jnp.float32), b.astype(jnp.float32)
        tol = self.TOL[dtype]
        for c in range(CLUSTER):
            for i in range(2):
                own, other = 1 - i, i * CLUSTER + c
                a_block, b_block = (own, other) if shared == "a" else (other, own)
                a_i = a32[a_block * ROWS : (a_block + 1) * ROWS]
                b_i = b32[b_block * COLS : (b_block + 1) * COLS]
                want = jnp.dot(a_i, b_i.T, precision=jax.lax.Precision.HIGHEST)
                np.testing.assert_allclose(got[c, i], want, rtol=tol, atol=tol)


class TestInterpret(TestCompiled):
    INTERPRET = True
    # fewer and more steps than stages
    CASES = {"steps": [(2, 4), (5, 2)], "dtype": ["bfloat16", "float32"]}
    TOL = {"bfloat16": 1e-4, "float32": 1e-4}
