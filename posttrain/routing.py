"""Uncertainty routing (METHODS.md section 3): which response pairs the costly judge sees, and the pairwise
advantages that result.

Per prompt with n responses:
1. the PM scores every ordered pair; ``antisymmetrize`` gives s_ij = (r_ij - r_ji) / 2 and u_ij = the mean
   (or max) of both orders' uncertainties;
2. ``route_batch`` picks, among all the unordered pairs (i < j) of a batch (an RLHF step's prompts, or a
   benchmark), the ones the judge decides, by policy: ``uncertainty`` (u above a threshold),
   ``uncertainty_budget`` (the k most uncertain, k = round(budget x eligible pairs)), ``random`` (k pairs
   uniformly), ``rm_only`` (none), ``judge_only`` (all eligible);
3. ``apply_verdicts``: A better -> s_ij = +2, B better -> -2, tie -> 0, and s_ji = -s_ij;
4. ``pairwise_advantages``: A_i = scale / (n - 1) * sum_{j != i} s_ij.

Example:
    >>> s = torch.tensor([[0.0, 1.0, -1.0], [-1.0, 0.0, 3.0], [1.0, -3.0, 0.0]])
    >>> pairwise_advantages(s, scale=1.0).tolist()
    [0.0, 1.0, -1.0]
"""
from __future__ import annotations

import random
from decimal import ROUND_HALF_UP, Decimal
from typing import Literal

import torch

Policy = Literal["uncertainty", "uncertainty_budget", "random", "rm_only", "judge_only"]
VERDICT_LOGIT = {"A": 2.0, "B": -2.0, "tie": 0.0}


def antisymmetrize(r: torch.Tensor, u: torch.Tensor, reduce: str = "mean") -> tuple[torch.Tensor, torch.Tensor]:
    """(s, u) from the PM's ordered-pair logits r[i, j] and uncertainties u[i, j] (n x n, diagonal ignored)."""
    s = (r - r.T) / 2
    u_sym = (u + u.T) / 2 if reduce == "mean" else torch.maximum(u, u.T)
    s.fill_diagonal_(0)
    return s, u_sym


def upper_pairs(n: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(n) for j in range(i + 1, n)]


def budget_count(n_pairs: int, budget: float) -> int:
    """k = budget x pairs, rounded half up (so 10% of 10 pairs is exactly 1, and 5% of 10 rounds to 1).

    The product is taken on the budget as written (its shortest decimal), because in binary 0.35 x 90 is
    31.499999999999996 and would round down.
    """
    exact = Decimal(repr(float(budget))) * n_pairs
    return min(n_pairs, int(exact.to_integral_value(rounding=ROUND_HALF_UP)))


def route_batch(u: torch.Tensor, policy: Policy, threshold: float, budget: float, rng: random.Random,
                eligible: list[bool] | None = None) -> list[int]:
    """The pairs to send to the judge among many (an RLHF step's, a benchmark's): u is a vector of their
    uncertainties, the result a sorted list of indices into it.

    Only pairs marked ``eligible`` (default: all) are ever picked. Budget policies pick k = budget x the eligible
    pairs, so a budget is a share of what ``judge_only`` would pay: 10% costs a tenth of judging everything,
    however many pairs are ineligible (identical responses in RLHF, 36-42% of a step's). ``uncertainty`` uses the
    threshold.
    """
    pool = [i for i in range(len(u)) if eligible is None or eligible[i]]
    if policy == "rm_only":
        return []
    if policy == "judge_only":
        return pool
    if policy == "uncertainty":
        return [i for i in pool if u[i] > threshold]
    k = budget_count(len(pool), budget)
    if policy == "uncertainty_budget":
        return sorted(sorted(pool, key=lambda i: -float(u[i]))[:k])
    if policy == "random":
        return sorted(rng.sample(pool, k))
    raise ValueError(f"unknown routing policy {policy!r}")


def answer_shares(answers: list) -> torch.Tensor:
    """Each response's self-consistency estimate of being right: the share of the prompt's responses giving its
    final answer (0 for a response that gives none)."""
    return torch.tensor([0.0 if a is None else answers.count(a) / len(answers) for a in answers])


def decisive_chance(answers: list) -> torch.Tensor:
    """d[i, j]: the chance that exactly one of responses i and j is right, so the judge will not call the pair a tie,
    estimated by self-consistency from the prompt's responses' final answers (None: none given).

    Two responses with the same answer (or none) are both right or both wrong: 0. With different answers at most one
    is right, so the chance is P(a_i right) + P(a_j right), each estimated by ``answer_shares``.

    Example:
        >>> decisive_chance([7, 7, 3, None]).tolist()[0]
        [0.0, 0.0, 0.75, 0.5]
    """
    n, share = len(answers), answer_shares(answers)
    d = torch.zeros(n, n)
    for i, j in upper_pairs(n):
        if answers[i] != answers[j]:
            d[i, j] = d[j, i] = share[i] + share[j]
    return d


def right_side(p: torch.Tensor, answers: list) -> torch.Tensor:
    """q[i, j]: the probability that i is the right one of the pair, given that exactly one is. Two independent
    pieces of evidence, combined by multiplying their odds: the PM's calibrated p_ij / (1 - p_ij) (the PM learnt
    from pairs in both orders, so its prior odds are even) and self-consistency's share_i / share_j. A response
    with no final answer is never the right one; where neither gives one (never decisive), q is p.

    On the SFT policy's own samples (bench/routing_online.py, three draws, two PMs) ranking by this q instead of p
    closed 0.6-1.6 points more of the separation gap at 10% of the calls in 5 of 6 cases (docs/results.md).

    Example:
        >>> [round(q, 2) for q in right_side(torch.tensor([[0.5, 0.5, 0.8], [0.5, 0.5, 0.8], [0.2, 0.2, 0.5]]),
        ...                                  [7, 7, 3])[0].tolist()]
        [0.5, 0.5, 0.89]
    """
    share = answer_shares(answers)
    p = p.clamp(1e-6, 1 - 1e-6)  # a saturated PM must not override a response that has no answer at all
    for_i, for_j = p * share[:, None], (1 - p) * share[None, :]
    return torch.where(for_i + for_j > 0, for_i / (for_i + for_j).clamp_min(1e-12), p)


def expected_gain(s: torch.Tensor, q: torch.Tensor, chance: torch.Tensor) -> torch.Tensor:
    """How much the judge's verdict is expected to raise s toward the right response of each pair: if i is right
    the verdict sets s_ij = +2, a gain of 2 - s_ij, if j is, -2, a gain of 2 + s_ij; weighted by q_ij, the
    probability that i is the right one (``right_side``), 2 - s_ij (2 q_ij - 1), and by the chance the pair is
    decisive at all (a tie verdict moves no right response above a wrong one). Negative where the PM already leans
    harder the way it is probably right than a verdict would.

    Example:
        >>> [round(g, 2) for g in expected_gain(torch.tensor([0.0, 1.5, -1.0]), torch.tensor([0.5, 0.9, 0.9]),
        ...                                      torch.ones(3)).tolist()]
        [2.0, 0.8, 2.8]
    """
    return chance * (VERDICT_LOGIT["A"] - s * (2 * q - 1))


def apply_verdicts(s: torch.Tensor, verdicts: dict[tuple[int, int], str]) -> torch.Tensor:
    """Overwrite s_ij (and s_ji = -s_ij) for every judged pair; 'A' means response i is better."""
    s = s.clone()
    for (i, j), verdict in verdicts.items():
        s[i, j] = VERDICT_LOGIT[verdict]
        s[j, i] = -VERDICT_LOGIT[verdict]
    return s


def pairwise_advantages(s: torch.Tensor, scale: float) -> torch.Tensor:
    """A_i = scale / (n - 1) * sum_{j != i} s_ij: a leave-one-out baseline on pairwise preferences."""
    n = s.shape[0]
    return scale / max(n - 1, 1) * (s.sum(1) - s.diagonal())
