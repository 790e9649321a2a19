"""Flax (linen) models: Embedding(V, E) -> recurrent core -> Dense(V) (Suarez 2017).

Every implementation (`scan`, `fused`, `pallas`, `mosaic`, `persistent`, or `auto`; the
registry is `rhhjax.ops.spec`) reads the same parameter tree.

    config.py        `ModelConfig`, its allowed values, `ConfigError`, `sequence_spec`.
    initializers.py  parameter initialisers (orthogonal / PyTorch-uniform, per layer).
    cells.py         `RHNCell`, `HyperRHNCell`, `LSTMCell`, `Linear`; gate recording.
    cores.py         `RHNCore`, `HyperRHNCore`, `LSTMCore`: scan or op; `DropoutKeys`.
    lm.py            `CharLM`, `build_model`, `init_params`, `count_params`.
Every public name is re-exported here.
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
