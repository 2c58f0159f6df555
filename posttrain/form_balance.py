"""Preference pairs balanced by solution form, so a PM cannot score a response by its form alone.

SePPO's reference samples are wrong mostly as `cot` derivations (an arithmetic slip) and right mostly as `pot`
programs, so of the training pairs whose two responses differ in form, 85% prefer the `pot` one (stop 69's
data/seppo/pairs.jsonl: 2,851 against 517). A PM trained on them learns the form: on the preference benchmark it
is right on 94% of the decisive pairs where a `pot` response beats a `cot` one and on 46% of those where the `cot`
one wins, and between two equally right responses of different forms it takes the `pot` side 77% of the time. The
policy then moves to `pot`, also where a program fails (a huge repeated block it must loop through), and the
PM-only RLHF run collapses (docs/results.md). Balanced, form alone says nothing about which side wins.

Example:
    >>> pairs = [{"chosen": " pot\\nprint(5)", "rejected": " cot\\nAnswer: 6"}] * 3 + \\
    ...         [{"chosen": " cot\\nAnswer: 5", "rejected": " pot\\nprint(6)"}]
    >>> kept = balance_solution_forms(pairs, seed=0)
    >>> [(solution_form(p["chosen"]), solution_form(p["rejected"])) for p in kept]
    [('pot', 'cot'), ('cot', 'pot')]
"""
from __future__ import annotations

import random

from posttrain.trajectories import split_choice


def solution_form(response: str) -> str | None:
    """``cot`` or ``pot``: the solution action of the trajectory a response names; None where it names none."""
    trajectory, _ = split_choice(response)
    return trajectory.solution if trajectory else None


def balance_solution_forms(pairs: list[dict], seed: int) -> list[dict]:
    """``pairs`` (chosen/rejected) with as many whose chosen response is ``pot`` and rejected ``cot`` as the other
    way round: the larger side is subsampled (seeded). Pairs of one form, or naming no trajectory, are all kept; the
    order of the kept pairs is theirs in ``pairs``."""
    sides: dict[tuple[str, str], list[int]] = {("pot", "cot"): [], ("cot", "pot"): []}
    for k, p in enumerate(pairs):
        forms = (solution_form(p["chosen"]), solution_form(p["rejected"]))
        if forms in sides:
            sides[forms].append(k)
    n = min(len(ks) for ks in sides.values())
    rng = random.Random(seed)
    dropped = {k for ks in sides.values() for k in ks} - {k for ks in sides.values() for k in rng.sample(ks, n)}
    return [p for k, p in enumerate(pairs) if k not in dropped]
