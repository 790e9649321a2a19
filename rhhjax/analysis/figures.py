"""Matplotlib figures of the analysis results (the dicts of `report.analyse`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rhhjax import outputs

DPI = 80


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: Path) -> Path:
    try:
        with outputs.atomic_path(path, "--out") as tmp:
            fig.savefig(tmp, dpi=DPI)
    finally:
        plt.close(fig)
    return path


def plot_weight_norms(results: list[dict], path: Path) -> Path:
    """One bar chart of weight norms per model with ``weight_norms``."""
    plt = _pyplot()
    rows = [r for r in results if r.get("weight_norms")]
    fig, axes = plt.subplots(len(rows), 1, figsize=(8, 2.4 * len(rows) + 0.4), squeeze=False)
    for ax, r in zip(axes[:, 0], rows, strict=True):
        norms = r["weight_norms"]
        blocks = list(dict.fromkeys(w["block"] for w in norms))
        colours = {b: f"C{i % 10}" for i, b in enumerate(blocks)}
        xs = np.arange(len(norms))
        ax.bar(xs, [w["fro"] for w in norms], color=[colours[w["block"]] for w in norms])
        ax.set_xticks(xs)
        ax.set_xticklabels([w["label"] for w in norms], rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("L2 norm")
        ax.set_title(f"{r['label']} ({r['num_params']:,} params)", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("Frobenius norm of each weight matrix (forward order)", fontsize=10)
    fig.tight_layout()
    return _save(plt, fig, path)


def plot_input_gradients(results: list[dict], path: Path) -> Path:
    """The gradient-norm curves of every model with ``input_gradients``, log scale."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        g = r.get("input_gradients")
        if not g:
            continue
        y = np.asarray(g["mean_norm"], np.float64)
        y = np.where(y > 0, y, np.nan)
        ax.semilogy(g["t"], y, label=r["label"])
    g0 = next(r["input_gradients"] for r in results if r.get("input_gradients"))
    ax.set_xlabel(f"input time step t (loss at the final step t = {g0['seq_len'] - 1})")
    ax.set_ylabel("mean ||d loss_T / d x_t||_2")
    ax.set_title(f"Gradient of the final-step loss w.r.t. each input ({g0['sequences']} windows)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(plt, fig, path)


def plot_gates(result: dict, path: Path) -> Path:
    """Mean gate activity [L, T] of the main cell, one panel per recorded window."""
    plt = _pyplot()
    rows = result["gates"]["main"]["sequences"]
    fig, axes = plt.subplots(
        len(rows), 1, figsize=(8, 0.9 * len(rows) + 1.2), squeeze=False, layout="constrained"
    )
    image = None
    for i, (ax, row) in enumerate(zip(axes[:, 0], rows, strict=True)):
        activity = np.asarray(row["activity"])
        image = ax.imshow(
            activity, aspect="auto", cmap="Reds", vmin=0.0, vmax=1.0, interpolation="nearest"
        )
        ax.set_ylabel(chr(ord("A") + i % 26), rotation=0, labelpad=10)
        ax.set_yticks(range(activity.shape[0]))
        ax.tick_params(labelsize=6)
        if i < len(rows) - 1:
            ax.set_xticklabels([])
    axes[-1, 0].set_xlabel("time step (rows: micro-layer 0 at top)")
    fig.suptitle(f"Mean transform-gate activity: {result['label']}", fontsize=10)
    if image is not None:
        fig.colorbar(image, ax=axes[:, 0].tolist(), fraction=0.03, pad=0.01, label="mean t")
    return _save(plt, fig, path)


def plot_lesion(results: list[dict], path: Path) -> Path:
    """BPC increase per lesioned micro-layer, one panel per model with ``lesion``."""
    plt = _pyplot()
    rows = [r for r in results if r.get("lesion")]
    fig, axes = plt.subplots(1, len(rows), figsize=(3.2 * len(rows) + 0.6, 3.2), squeeze=False)
    for ax, r in zip(axes[0], rows, strict=True):
        les = r["lesion"]
        cell_names = list(dict.fromkeys(x["cell"] for x in les["layers"]))
        width = 0.8 / len(cell_names)
        for k, name in enumerate(cell_names):
            items = [x for x in les["layers"] if x["cell"] == name]
            xs = np.array([x["layer"] for x in items]) + (k - (len(cell_names) - 1) / 2) * width
            ax.bar(xs, [x["delta_bpc"] for x in items], width=width, label=f"{name} cell")
        ax.set_xlabel("lesioned micro-layer")
        ax.set_ylabel("BPC increase")
        ax.set_title(f"{r['label']}\nintact {les['baseline']['bpc']:.3f} BPC", fontsize=8)
        ax.set_xticks(range(max(x["layer"] for x in les["layers"]) + 1))
        ax.grid(axis="y", alpha=0.3)
        if len(cell_names) > 1:
            ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(plt, fig, path)
