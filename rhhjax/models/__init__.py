"""Flax models (Suarez 2017): Embedding -> core -> Dense; every implementation (`scan`, `fused`,
`mosaic`, `persistent`, `auto`: `rhhjax.ops.spec`) reads the same parameters.
config.py (`ModelConfig`), initializers.py, cells.py (the cells), cores.py (a cell over a
sequence), lm.py (`CharLM`, `build_model`); every public name is re-exported here."""

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
