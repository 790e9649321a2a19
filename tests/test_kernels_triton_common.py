"""What the Triton kernels share (kernels/triton/common.py): the one pallas_call (absent
operands left out, an aliased operand updated in place), the BlockSpecs of the padded layout,
the dot precision, the dropout scale and the one-line operand checks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_cases import TEST_CONFIG
from rhhjax.kernels.layout import Geometry
from rhhjax.kernels.triton import common

GEO = Geometry.make(TEST_CONFIG, 20, 40)  # 16-blocks: b_pad 32, n_pad 48, grid (2, 3)


def _add_kernel(x_ref, y_ref, acc_ref, out_ref, acc_out_ref):
    """out = x + y; acc += x (acc_ref is the aliased input; the output is written)."""
    out_ref[...] = x_ref[...] + (0.0 if y_ref is None else y_ref[...])
    acc_out_ref[...] = acc_ref[...] + x_ref[...]


def test_launch_leaves_absent_operands_out_and_updates_an_aliased_one():
    x = jnp.arange(GEO.b_pad * GEO.n_pad, dtype=jnp.float32).reshape(GEO.b_pad, GEO.n_pad)
    acc = jnp.ones_like(x)
    rows = common.rows_spec(GEO)
    shape = jax.ShapeDtypeStruct(x.shape, jnp.float32)

    def run(y):
        def kernel(*refs):
            refs = list(refs)
            x_ref = refs.pop(0)
            y_ref = common.pop_optional(refs, y is not None)
            _add_kernel(x_ref, y_ref, *refs)

        operands = [(x, rows), (y, rows), (acc, rows, 1)]
        return common.launch(kernel, operands, [(shape, rows), (shape, rows)], geo=GEO,
                             config=TEST_CONFIG, interpret=True, name="add")  # fmt: skip

    out, acc_out = run(None)
    np.testing.assert_array_equal(out, x)
    np.testing.assert_array_equal(acc_out, acc + x)
    out, _ = run(2 * x)
    np.testing.assert_array_equal(out, 3 * x)


def test_block_specs_of_the_padded_layout():
    assert GEO.grid == (2, 3)
    assert common.rows_spec(GEO).block_shape == (16, 16)
    assert common.rows_spec(GEO, (3, 2)).index_map(1, 2) == (0, 0, 1, 2)
    assert common.halves_spec(GEO).index_map(1, 2) == (1, 0, 2)
    assert common.whole_rows_spec(GEO).block_shape == (16, GEO.n_pad)
    assert common.bias_spec(GEO).index_map(1, 2) == (0, 2)
    h, t = common.weight_specs(GEO)
    assert (h.index_map(1, 2), t.index_map(1, 2)) == ((0, 0, 2), (0, 1, 2))
    h, t = common.weight_t_specs(GEO)
    assert (h.index_map(1, 2), t.index_map(1, 2)) == ((0, 0, 2), (1, 0, 2))


def test_precision_dropout_scale_and_operand_checks():
    assert common.dot_precision(jnp.float32, False) == jax.lax.Precision.HIGHEST
    assert common.dot_precision(jnp.float32, True) is None
    assert common.dot_precision(jnp.bfloat16, False) is None
    assert common.dropout_scale(None, 0.0) == 1.0
    assert common.dropout_scale(jnp.ones(2, jnp.int8), 0.5) == 2.0
    with pytest.raises(ValueError, match="keep must be in"):
        common.dropout_scale(jnp.ones(2, jnp.int8), 1.5)
    common.check_operand("z", None, (2, 2))  # absent: nothing to check
    with pytest.raises(ValueError, match=r"z must have padded shape \(2, 2\), got \(2, 3\)"):
        common.check_operand("z", jnp.zeros((2, 3)), (2, 2))
    with pytest.raises(ValueError, match="keep must have dtype int8, got float32"):
        common.check_operand("keep", jnp.zeros((2, 2)), (2, 2), common.MASK_DTYPES)
