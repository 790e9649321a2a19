"""Gradient-flow and gate analysis of trained (or freshly initialised) models, run by
``python -m rhhjax.tools.analyze --workdir=DIR[@WHICH] --init=CONFIG --out=DIR``.

    subjects.py   the models analysed: workdirs at a checkpoint, or configs at init.
    weights.py    weight-matrix norms (Suarez 2017 Figs. 2-3).
    gradients.py  ||d loss_{T-1} / d x_t|| over held-out windows (Figs. 4-6).
    gates.py      transform-gate activity per step (RHN paper Fig. 5b).
    lesion.py     the loss with one micro-layer's transform gate closed (RHN section 6).
    figures.py    the PNGs; report.py the driver writing ``analysis.json``.

LSTMs get weights and gradients only. Details: docs/design.md (module notes).
"""

from rhhjax.analysis.figures import plot_gates, plot_input_gradients, plot_lesion, plot_weight_norms
from rhhjax.analysis.gates import GATED_TYPES, can_trace_gates, gate_activity, make_gate_trace
from rhhjax.analysis.gradients import (
    embed_fn,
    final_step_loss,
    input_gradients,
    make_input_gradient_norms,
    scaled_norm,
)
from rhhjax.analysis.lesion import LESION_BIAS, gated_cells, heldout_loss, lesion, lesion_params
from rhhjax.analysis.report import ANALYSES, JSON_FILE, Settings, analyse, run, write_outputs
from rhhjax.analysis.subjects import (
    AnalysisError,
    Subject,
    heldout_windows,
    init_params,
    load_config_spec,
    parse_which,
    split_workdir_spec,
    subject_from_config,
    subject_from_workdir,
    to_float64,
)
from rhhjax.analysis.weights import weight_norms

__all__ = [
    "ANALYSES",
    "GATED_TYPES",
    "JSON_FILE",
    "LESION_BIAS",
    "AnalysisError",
    "Settings",
    "Subject",
    "analyse",
    "can_trace_gates",
    "embed_fn",
    "final_step_loss",
    "gate_activity",
    "gated_cells",
    "heldout_loss",
    "heldout_windows",
    "init_params",
    "input_gradients",
    "lesion",
    "lesion_params",
    "load_config_spec",
    "make_gate_trace",
    "make_input_gradient_norms",
    "parse_which",
    "plot_gates",
    "plot_input_gradients",
    "plot_lesion",
    "plot_weight_norms",
    "run",
    "scaled_norm",
    "split_workdir_spec",
    "subject_from_config",
    "subject_from_workdir",
    "to_float64",
    "weight_norms",
    "write_outputs",
]
