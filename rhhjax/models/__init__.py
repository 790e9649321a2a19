"""Flax (linen) models: RHN cell, HyperRHN cell, stacked LSTM and the character LM.

The language model is Embedding(V, E) -> recurrent core -> Dense(V) (Suarez 2017).
All implementations (`ModelConfig.impl`: `scan`, `fused`, `pallas`, `mosaic`, `persistent`,
or `auto`, the fastest measured one for the platform: `rhhjax.ops.spec`, whose registry is the
only list) read the same parameter tree, so a checkpoint runs on any of them.

    config.py        `ModelConfig`, its allowed values (MODEL_TYPES, IMPLS, DTYPES, ...),
                     `ConfigError`, validation and `sequence_spec` (the implementation,
                     resolved once).
    initializers.py  parameter initialisers (orthogonal / PyTorch-uniform, stacked per layer).
    cells.py         `RHNCell`, `HyperRHNCell`, `LSTMCell`, `Linear`; the RHN cells record
                     their transform gates (collection "intermediates", `GATES_NAME`).
    cores.py         the cores over time (`RHNCore`, `HyperRHNCore`, `LSTMCore`), their one
                     dispatch on the spec (scan or op) and the dropout keys (`DropoutKeys`).
    lm.py            `CharLM`, `build_model`, `init_params`, `count_params`,
                     `implementation_line` (the start-up line of the impl choice).

Every public name is re-exported here: ``from rhhjax import models; models.ModelConfig``.
"""

from rhhjax.models.cells import (
    GATES_COLLECTION,
    GATES_NAME,
    HyperRHNCell,
    Linear,
    LSTMCell,
    RHNCell,
)
from rhhjax.models.config import (
    DROPOUT_MODES,
    DTYPES,
    HYPER_INPUTS,
    IMPLS,
    INITS,
    MODEL_TYPES,
    ConfigError,
    ModelConfig,
    sequence_spec,
)
from rhhjax.models.cores import CORES, DropoutKeys, HyperRHNCore, LSTMCore, RHNCore
from rhhjax.models.initializers import (
    float32_init,
    matrix_init,
    rhn_bias_init,
    stacked,
    uniform_init,
)
from rhhjax.models.lm import (
    CharLM,
    build_model,
    count_params,
    implementation_line,
    init_params,
    uses_dropout,
)

__all__ = [
    "CORES",
    "DROPOUT_MODES",
    "DTYPES",
    "GATES_COLLECTION",
    "GATES_NAME",
    "HYPER_INPUTS",
    "IMPLS",
    "INITS",
    "MODEL_TYPES",
    "CharLM",
    "ConfigError",
    "DropoutKeys",
    "HyperRHNCell",
    "HyperRHNCore",
    "LSTMCell",
    "LSTMCore",
    "Linear",
    "ModelConfig",
    "RHNCell",
    "RHNCore",
    "build_model",
    "count_params",
    "float32_init",
    "implementation_line",
    "init_params",
    "matrix_init",
    "rhn_bias_init",
    "sequence_spec",
    "stacked",
    "uniform_init",
    "uses_dropout",
]
