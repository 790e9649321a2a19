"""Gradient-flow and gate analysis of trained (or freshly initialised) models.

    python -m rhhjax.tools.analyze --workdir=A [--workdir=B@init ...] [--init=CONFIG ...] --out=DIR
        [--checkpoint=best|latest|init|STEP] [--analyses=weights,gradients,gates,lesion]
        [--data_dir=PTB_DIR] [--prefix=NAME_] [--labels=a,b,...]

Each model ("subject", `subjects.py`) is one of

    --workdir=DIR[@WHICH]   a training workdir; WHICH (default ``--checkpoint``) is ``best``
                            (falls back to latest), ``latest``, a step number, or ``init``: the
                            parameters the run started from (``config.json``'s seed, through
                            the trainer's own init). A workdir without a checkpoint yet is
                            analysed at init.
    --init=FILE[:VARIANT][,key=value...]
                            a config (``rhhjax.configs.load``) at initialisation, e.g.
                            ``configs/ptb.py:cpu,model.type=rhn,model.hidden=256``.

What is computed (all numbers go to ``DIR/<prefix>analysis.json``, figures to PNGs beside it,
drawn by `figures.py`; the driver is `report.py`):

    weights    (Suarez 2017 Figs. 2-3, `weights.py`) ``weight_norms.png``: the L2 (Frobenius)
               norm of every weight matrix, in forward order, one bar per layer of stacked
               arrays (``kernel_s [L, n, 2n]`` -> W_0 .. W_{L-1}); biases are left out. The JSON
               also holds the RMS entry (norm / sqrt(size), comparable across shapes) and the
               spectral norm.
    gradients  (Figs. 4-6, `gradients.py`) ``input_gradients.png``: for held-out windows of
               ``--seq_len`` characters (evenly spaced over ``--split``, zero initial state, no
               dropout), the mean over windows of ||d loss_{T-1} / d x_t||_2, where loss_{T-1}
               is the cross-entropy of the window's final prediction and x_t the embedded input
               at step t. One curve per model, log scale.
    gates      (RHN paper Fig. 5b, `gates.py`) ``gates_<label>.png``: the transform gate t of
               every micro-layer averaged over units, per time step, for the first
               ``--gate_sequences`` windows (RHN and the HyperRHN's main cell, any hyper_rank;
               the hyper cell's gates are in the JSON). Recorded by the model itself (Flax
               ``sow``) run with impl="scan".
    lesion     (RHN paper section 6, `lesion.py`) ``lesion.png``: for each micro-layer,
               LESION_BIAS is added to the t-half of its bias, so t = sigmoid(...) = 0 (the
               layer only carries), and the loss (``rhhjax.evaluation`` windows protocol on the
               first ``--lesion_chars`` characters of ``--split``) is compared with the intact
               model's. ``max_gate`` records the largest t of the lesioned layer over the gate
               windows (0 when the lesion works).

LSTMs have no highway gates: they get weight norms and gradients only.
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
