"""Analysis of trained or initial models (``python -m rhhjax.tools.analyze``): subjects.py (the
models), weights.py (norms, Figs. 2-3), gradients.py (gradient flow, Figs. 4-6), gates.py (gate
activity, RHN Fig. 5b), lesion.py (a gate closed), figures.py, report.py (the driver).
Details: docs/design.md."""

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
