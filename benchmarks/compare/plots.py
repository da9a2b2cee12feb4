"""The report's plots: each method's held-out GenEval curve against one cost axis, with its 95% band."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from benchmarks.common import LABELS
from benchmarks.compare.analysis import AXES, Analysis


def plot_curves(analysis: Analysis, axis: str, path: Path, title: str) -> None:
    """Mean curve and band of every method against ``axis`` (a key of :data:`~benchmarks.compare.analysis.AXES`),
    as PNG."""
    fig = Figure(figsize=(6.5, 4))  # no pyplot: no global figure state and no interactive backend to choose
    ax = fig.subplots()
    point, _ = analysis.weights("geneval")
    for m, g in analysis.groups.items():
        _, reps = analysis.statistic([(m, g)], lambda c: c.mean(axis=-2))
        low, high = np.quantile(reps, [0.025, 0.975], axis=0)
        ax.plot(g.axes[axis], g.mean_curve(point), marker="o", label=f"{LABELS[m]} ({g.seeds} seeds)")
        ax.fill_between(g.axes[axis], low, high, alpha=0.15)
    ax.set_xlabel(AXES[axis])
    ax.set_ylabel("held-out GenEval strict")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
