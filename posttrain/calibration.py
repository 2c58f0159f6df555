"""How good and how honest a preference model's probabilities are, on pairs with a known better response.

All functions take, per decisive pair, ``p`` = P(A is better) and ``label_a`` = whether A really is better.

Example:
    >>> round(expected_calibration_error([0.9, 0.8, 0.3], [True, True, False]), 3)
    0.2
"""
from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def pair_correct(p, label_a) -> np.ndarray:
    """Per pair, 1 where ``p`` picks the better response, 0 where it picks the worse, and 1/2 at p = 1/2: a model
    that cannot tell the two apart is right half the time, not always on the side the comparison breaks to (the
    antisymmetrised score of two texts it scores alike is exactly 0)."""
    p, label_a = np.asarray(p, float), np.asarray(label_a, bool)
    return np.where(p == 0.5, 0.5, ((p > 0.5) == label_a).astype(float))


def _confidence_correct(p, label_a) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(p, float)
    return np.maximum(p, 1 - p), pair_correct(p, label_a)


def reliability_bins(p, label_a, n_bins: int = 10) -> list[dict]:
    """Equal-width confidence bins on [0.5, 1]: count, mean confidence and accuracy in each."""
    conf, correct = _confidence_correct(p, label_a)
    edges = np.linspace(0.5, 1.0, n_bins + 1)
    which = np.clip(np.digitize(conf, edges[1:-1]), 0, n_bins - 1)
    return [{"low": float(edges[b]), "high": float(edges[b + 1]), "count": int((which == b).sum()),
             "confidence": float(conf[which == b].mean()) if (which == b).any() else None,
             "accuracy": float(correct[which == b].mean()) if (which == b).any() else None} for b in range(n_bins)]


def expected_calibration_error(p, label_a, n_bins: int = 10) -> float:
    """sum over bins of (bin share) x |accuracy - mean confidence|."""
    n = len(p)
    return float(sum(b["count"] / n * abs(b["accuracy"] - b["confidence"])
                     for b in reliability_bins(p, label_a, n_bins) if b["count"]))


def spearman(x, y) -> float:
    """Spearman rank correlation (ties get average ranks); NaN when either side is constant."""
    return float(pd.Series(np.asarray(x, float)).corr(pd.Series(np.asarray(y, float)), method="spearman"))


def accuracy_by_decile(uncertainty, correct, n: int = 10) -> list[dict]:
    """Accuracy within each uncertainty decile, lowest uncertainty first (ties broken by position)."""
    order = np.argsort(np.asarray(uncertainty, float), kind="stable")
    correct = np.asarray(correct, float)[order]
    u = np.asarray(uncertainty, float)[order]
    return [{"decile": i + 1, "count": len(idx), "mean_uncertainty": float(u[idx].mean()),
             "accuracy": float(correct[idx].mean())} for i, idx in enumerate(np.array_split(np.arange(len(u)), n))
            if len(idx)]


def plot_reliability(curves: dict[str, list[dict]], path: Path, title: str) -> None:
    """One reliability line per model/variant; the diagonal is perfect calibration."""
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot([0.5, 1], [0.5, 1], color="grey", linestyle=":", label="perfect")
    for name, bins in curves.items():
        pts = [(b["confidence"], b["accuracy"]) for b in bins if b["count"]]
        ax.plot(*zip(*pts), marker="o", label=name)
    ax.set(xlabel="confidence", ylabel="accuracy", xlim=(0.5, 1), ylim=(0, 1.02), title=title)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_decile_accuracy(deciles: list[dict], path: Path, title: str) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar([d["decile"] for d in deciles], [d["accuracy"] for d in deciles], color="tab:blue")
    ax.set(xlabel="uncertainty decile (1 = most certain)", ylabel="accuracy", ylim=(0, 1), title=title)
    ax.set_xticks([d["decile"] for d in deciles])
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
