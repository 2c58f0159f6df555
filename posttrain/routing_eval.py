"""Routing evaluation on the preference benchmark: accuracy against the fraction of pairs sent to the judge,
for uncertainty routing vs random routing (several seeds), with rm_only and judge_only as the two ends.

The judge's verdict on every decisive pair is fetched once (the cache makes that free on a re-run); each
routing policy then uses it exactly on the pairs it routes and the PM's sign elsewhere, which is what calling
the judge on those pairs alone would give. A failed judge call falls back to the PM, as in training.

Example:
    >>> rows = routing_curve(["A", "B"], torch.tensor([1.0, 1.0]), torch.tensor([0.1, 0.9]), ["A", "B"],
    ...                      budgets=[0.0, 0.5], seeds=[0])
    >>> [(r["policy"], r["budget"], r["accuracy"]) for r in rows if r["policy"] == "uncertainty_budget"]
    [('uncertainty_budget', 0.0, 0.5), ('uncertainty_budget', 0.5, 1.0)]
"""
from __future__ import annotations

import random
import statistics
from pathlib import Path

import matplotlib
import torch

from posttrain.routing import route_batch

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _accuracy(labels: list[str], g: torch.Tensor, verdicts: list[str | None], routed: set[int]) -> float:
    """The share of pairs decided right: by the verdict where routed and given, else by the PM's sign (g = 0, the PM
    unable to choose, counts a half, as ``posttrain.calibration.pair_correct`` does)."""
    correct = 0.0
    for i, label in enumerate(labels):
        v = verdicts[i] if i in routed else None
        if v is None and g[i] == 0:
            correct += 0.5
            continue
        decision = v if v is not None else ("A" if g[i] > 0 else "B")
        correct += decision == label
    return correct / len(labels)


def routing_curve(labels: list[str], g: torch.Tensor, u: torch.Tensor, verdicts: list[str | None],
                  budgets: list[float], seeds: list[int]) -> list[dict]:
    """Rows {policy, budget, seed, calls, call_fraction, accuracy} for decisive pairs (labels 'A'/'B')."""
    rows = []
    n = len(labels)
    for policy, policy_seeds in (("rm_only", [0]), ("judge_only", [0]), ("uncertainty_budget", [0]),
                                 ("random", seeds)):
        for budget in (budgets if policy in ("uncertainty_budget", "random") else [None]):
            for seed in policy_seeds:
                routed = set(route_batch(u, policy, threshold=0.0, budget=budget or 0.0, rng=random.Random(seed)))
                rows.append({"policy": policy, "budget": budget, "seed": seed, "calls": len(routed),
                             "call_fraction": len(routed) / n, "accuracy": _accuracy(labels, g, verdicts, routed)})
    return rows


def summarize_curve(rows: list[dict]) -> dict:
    """Per budget: uncertainty accuracy, random mean and std over seeds, and the share of the rm_only ->
    judge_only gap that uncertainty routing closes."""
    rm = next(r["accuracy"] for r in rows if r["policy"] == "rm_only")
    judge = next(r["accuracy"] for r in rows if r["policy"] == "judge_only")
    out = {"rm_only": rm, "judge_only": judge, "budgets": {}}
    for budget in sorted({r["budget"] for r in rows if r["budget"] is not None}):
        unc = next(r["accuracy"] for r in rows if r["policy"] == "uncertainty_budget" and r["budget"] == budget)
        rnd = [r["accuracy"] for r in rows if r["policy"] == "random" and r["budget"] == budget]
        out["budgets"][str(budget)] = {
            "uncertainty": unc, "random_mean": statistics.mean(rnd),
            "random_std": statistics.stdev(rnd) if len(rnd) > 1 else 0.0,  # the seeds' sample sd
            "gap_closed_uncertainty": (unc - rm) / (judge - rm) if judge != rm else None,
            "gap_closed_random": (statistics.mean(rnd) - rm) / (judge - rm) if judge != rm else None}
    return out


def plot_curve(rows: list[dict], path: Path, title: str) -> None:
    summary = summarize_curve(rows)
    budgets = sorted(float(b) for b in summary["budgets"])
    unc = [summary["budgets"][str(b)]["uncertainty"] for b in budgets]
    mean = [summary["budgets"][str(b)]["random_mean"] for b in budgets]
    std = [summary["budgets"][str(b)]["random_std"] for b in budgets]
    fig, ax = plt.subplots(figsize=(6, 4))
    x = [100 * b for b in budgets]
    ax.plot(x, unc, marker="o", label="uncertainty routing")
    ax.errorbar(x, mean, yerr=std, marker="s", capsize=3, label="random routing (mean ± std)")
    ax.axhline(summary["rm_only"], color="grey", linestyle=":", label="PM only")
    ax.axhline(summary["judge_only"], color="black", linestyle="--", label="judge on every pair")
    ax.set(xlabel="pairs sent to the judge (%)", ylabel="benchmark accuracy", title=title)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
