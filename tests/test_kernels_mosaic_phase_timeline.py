"""The persistent kernels' phase timeline (`kernels/mosaic/phase_timeline.py`): with it on
the kernels' outputs are unchanged and each block stamps every phase's events in order.
`TestCompiled`: compiled, on a GPU only (real clocks); `TestInterpret`: in GPU interpret mode
on a CPU (a per-block event counter); the lowering without a GPU: no timer read unless on."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_cases import (
    KEEP,
    MosaicGpuMode,
    backward_case,
    backward_packed,
    backward_rest,
    forward_operands,
    forward_problem,
)
from rhhjax.kernels.mosaic import persistent_backward as pb
from rhhjax.kernels.mosaic import persistent_forward as pf
from rhhjax.kernels.mosaic import phase_timeline as ptl
from rhhjax.kernels.mosaic import rowgroup_layout
from rhhjax.kernels.mosaic.plan import PersistentPlan

TIMER_READS = ("%globaltimer", "%clock", "%smid")


def _check_stamps(stamps, phases: int, blocks: int, order) -> None:
    """Shape, SMs, and per block the events of each phase in order, the phases in ``order``
    (execution order) each starting no earlier than the last one's."""
    assert stamps.stamps.shape == (phases, blocks, ptl.WORDS)
    assert stamps.sm.shape == (blocks,)
    assert (np.asarray(stamps.sm) >= 0).all()
    d = ptl.deltas(stamps.stamps)
    assert (np.diff(d, axis=-1) >= 0).all(), d
    assert (d[..., -1] > 0).all()  # a phase takes time
    start = ptl.start_ns(stamps.stamps)[list(order)]
    assert (np.diff(start, axis=0) > 0).all(), start


def _assert_same(off, on) -> None:
    assert len(off) == len(on)
    for a, b in zip(off, on, strict=True):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


class TestCompiled(MosaicGpuMode):
    """The kernels with the timeline on against off: compiled (a GPU only), and in
    `TestInterpret` executed in GPU interpret mode."""

    CASES = {
        # (PersistentPlan arguments, steps, depth)
        "case": [((64, 64, "bfloat16", 2, 1, 32), 2, 2), ((100, 37, "float32", 3, 2, 16), 2, 2)],
    }  # fmt: skip

    @pytest.mark.parametrize("layout", rowgroup_layout.LAYOUTS)
    def test_forward_outputs_are_unchanged_and_every_phase_is_stamped_in_order(self, case, layout):
        plan_args, steps, depth = case
        plan = PersistentPlan(*plan_args)
        ops = forward_operands(plan, forward_problem(3, plan.batch, plan.width, steps, depth),
                               True, True)  # fmt: skip
        run = lambda timeline: jax.jit(functools.partial(  # noqa: E731
            pf.persistent_forward, plan, save=True, keep=KEEP, interpret=self.interpret(),
            layout=layout, timeline=timeline,
        ))(*ops)  # fmt: skip
        outs, stamps = run(True)
        _assert_same(run(False), outs)
        _check_stamps(stamps, steps * depth, plan.grid, range(steps * depth))

    @pytest.mark.parametrize(("layout", "split_k"), [("grid", False), ("rowgroup", True)])
    def test_backward_outputs_are_unchanged_and_every_phase_is_stamped_in_order(
        self, case, layout, split_k
    ):
        """Also with the GEMM split between two warpgroups (warpgroup 0 stamps)."""
        plan_args, steps, depth = case
        plan = PersistentPlan(*plan_args, split_k=split_k)
        bc = backward_case(4, plan, steps, depth, True, True)
        wt = pb.backward_weights(plan, bc["kernel_s"], jnp.dtype(plan.dtype))
        args = (wt, bc["g"], backward_packed(bc), *backward_rest(bc))
        run = lambda timeline: jax.jit(functools.partial(  # noqa: E731
            pb.persistent_backward, plan, keep=KEEP, interpret=self.interpret(),
            layout=layout, timeline=timeline,
        ))(*args)  # fmt: skip
        outs, stamps = run(True)
        _assert_same(run(False), outs)
        phases = steps * depth
        _check_stamps(stamps, phases, plan.grid, reversed(range(phases)))


class TestInterpret(TestCompiled):
    INTERPRET = True


def _lowered_text(direction: str, timeline: bool) -> str:
    """The kernel lowered for cuda without a GPU (the backward with its GEMM split)."""
    if direction == "forward":
        plan = PersistentPlan(64, 64, "bfloat16", col_blocks=2, k_chunk=32)
        args = forward_operands(plan, forward_problem(1, 64, 64, 2, 2), True, True)
        f = functools.partial(pf.persistent_forward, plan, save=True, keep=KEEP)
    else:
        plan = PersistentPlan(64, 64, "bfloat16", col_blocks=2, k_chunk=32, split_k=True)
        bc = backward_case(1, plan, 2, 2, True, True)
        wt = pb.backward_weights(plan, bc["kernel_s"], jnp.bfloat16)
        args = (wt, bc["g"], backward_packed(bc), *backward_rest(bc))
        f = functools.partial(pb.persistent_backward, plan, keep=KEEP)
    f = functools.partial(f, timeline=timeline)
    try:
        return jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    except ValueError as error:  # jax 0.12's layout inference, without a GPU
        pytest.skip(f"the kernel does not lower for cuda without a GPU here: {error}")


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_the_lowered_kernel_reads_no_timer_unless_the_timeline_is_on(direction):
    assert not any(read in _lowered_text(direction, False) for read in TIMER_READS)
    assert all(read in _lowered_text(direction, True) for read in TIMER_READS)


def test_deltas_are_cycles_from_barrier_passed_across_a_clock_wrap():
    clocks = np.array([2**32 - 5, 2**32 - 1, 3, 10, 20, 30], np.int64)
    stamps = np.concatenate([[7, 1], clocks]).astype(np.uint32).view(np.int32)[None, None]
    np.testing.assert_array_equal(ptl.deltas(stamps)[0, 0], [0, 4, 8, 15, 25, 35])
    assert ptl.start_ns(stamps)[0, 0] == 7 + 2**32
