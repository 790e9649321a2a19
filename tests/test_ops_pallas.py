"""`pallas` (rhhjax/ops/pallas.py): its layout and weights, the training step lowered for CUDA
with one Triton kernel per micro-layer and direction, the config's kernel block and
`model.pallas_mode` reaching the spec, bad blocks as config errors. Its values against `scan`:
tests/test_ops_recurrence.py."""

import jax
import jax.numpy as jnp
import optax
import pytest
from ops_cases import config as _config
from rhhjax.kernels import triton

from rhhjax import models
from rhhjax.ops import pallas


def test_layout_pads_batch_and_units_to_the_blocks_and_weights_once():
    spec = models.sequence_spec(_config(impl="pallas"))
    geo = pallas.geometry(spec, 5, 20)
    assert (geo.b_pad, geo.n_pad) == (16, 32) and geo == triton.Geometry.make(spec.kernel, 5, 20)
    w = jnp.ones((3, 20, 40))
    forward, backward = (
        pallas.prepare_weights(spec, geo, w),
        pallas.prepare_weights(spec, geo, w, transposed=True),
    )
    assert [x.shape for x in forward] == [(32, 2, 32)] * 3
    assert [x.shape for x in backward] == [(2, 32, 32)] * 3
    assert pallas.saved_rows(True) == pallas.saved_rows(False) == (("pre", 2),)


TRITON_CALL_TARGETS = ("__gpu$xla.gpu.triton", "triton_kernel_call")


@pytest.mark.parametrize("model_type", ["rhn", "hyperrhn"])
def test_pallas_train_step_lowers_for_cuda_with_triton_calls(model_type):
    config = _config(
        type=model_type, impl="pallas", pallas_mode="compiled", hidden=1000, hyper_hidden=128,
        depth=2,
    )  # fmt: skip
    config = models.ModelConfig(**{**config.__dict__, "vocab_size": 50, "embed_dim": 27})
    model = models.build_model(config)
    optimizer = optax.adam(1e-3)
    params = jax.eval_shape(lambda: models.init_params(model, jax.random.key(0)))
    opt_state = jax.eval_shape(optimizer.init, params)
    tokens = jax.ShapeDtypeStruct((256, 11), jnp.int32)

    def train_step(p, state, tokens, key):
        def loss_fn(p):
            logits, _ = model.apply(
                {"params": p}, tokens[:, :-1], train=True, rngs={"dropout": key}
            )
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(p)
        updates, state = optimizer.update(grads, state, p)
        return optax.apply_updates(p, updates), state, loss

    key = jax.eval_shape(lambda: jax.random.key(0))
    with triton.cuda_lowering_device():
        lowered = (
            jax.jit(train_step)
            .trace(params, opt_state, tokens, key)
            .lower(lowering_platforms=("cuda",))
        )
    text = lowered.as_text()
    found = [t for t in TRITON_CALL_TARGETS if t in text]
    assert found, "no Triton custom call in the lowered train step"
    # One forward and one fused backward kernel per micro-layer (hyper and main cells). (The
    # initial state's gradient kernel is dead code here: jax >= 0.12 drops it before lowering.)
    cells = 2 if model_type == "hyperrhn" else 1
    assert text.count('name = "highway_forward_stacked"') == config.depth * cells
    assert text.count('name = "highway_backward_fused_stacked"') == config.depth * cells


def _ptb_model_block():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "configs" / "ptb.py"
    spec = importlib.util.spec_from_file_location("ptb_config_for_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config().model


def test_config_kernel_block_reaches_the_spec():
    """A kernel block set in the config (not the defaults) is the one the pallas op runs."""
    block = _ptb_model_block()
    block.kernel.block_k = 128
    block.kernel.num_stages = 2
    mc = models.ModelConfig.from_config(block, impl="pallas")
    spec = models.sequence_spec(mc)
    expected = triton.HighwayConfig(block_k=128, num_stages=2)
    assert expected != triton.HighwayConfig()
    assert spec.kernel == expected and spec.impl == "pallas"


ON_GPU = jax.default_backend() == "gpu"


@pytest.mark.parametrize(
    ("mode", "interpret"), [("interpret", True), ("compiled", False), ("auto", not ON_GPU)]
)
def test_pallas_mode_decides_interpretation_auto_compiles_on_a_gpu_only(mode, interpret):
    mc = _config(impl="pallas", pallas_mode=mode)
    assert models.sequence_spec(mc).interpret is interpret
    # fused never interprets anything.
    fused = models.ModelConfig(**{**mc.__dict__, "impl": "fused"})
    assert models.sequence_spec(fused).interpret is False


@pytest.mark.parametrize(
    ("kernel", "message"),
    [
        ({"block_b": 48}, "power of two"),
        ({"blok_b": 64}, "no field 'blok_b'"),
        ({"block_b": 128, "block_n": 128, "block_k": 64, "num_stages": 4}, "shared memory"),
    ],
)
def test_bad_kernel_blocks_are_one_line_config_errors(kernel, message):
    block = dict(_ptb_model_block().items())
    block["kernel"] = {**dict(block["kernel"].items()), **kernel}
    with pytest.raises(models.ConfigError, match=message) as error:
        models.ModelConfig.from_config(block)
    assert "\n" not in str(error.value)
