"""Preference pairs balanced by solution form, so a PM cannot score a response by its form alone.

SePPO's reference samples are wrong mostly as `cot` derivations (an arithmetic slip) and right mostly as `pot`
programs, so of the training pairs whose two responses differ in form, 85% prefer the `pot` one (stop 69's
data/seppo/pairs.jsonl: 2,851 against 517). A PM trained on them learns the form: on the preference benchmark it
is right on 94% of the decisive pairs where a `pot` response beats a `cot` one and on 46% of those where the `cot`
one wins, and between two responses of different forms, both right or both wrong, it takes the `pot` side 77% of
the time (``form_bias``). Balanced (``balance_solution_forms``; `bench/preference.py --balance-forms`), form alone says
nothing about which side wins.

Measured, not adopted (stop 71, docs/results.md): trained on balanced pairs the PM loses the bias (cot right 0.83,
pot side on ties 0.53) but also accuracy (0.739 against 0.794 on the benchmark, pot right 0.81), and PM-only RLHF
from it falls further (0.608 and 0.581 against 0.689 and 0.671, seeds 0-1). The form is a shortcut, but one that
is right more often than the content the PM can read instead. So `train_rm` trains on the pairs as they come.

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


def form_bias(pairs: list[dict], g: list[float]) -> dict:
    """How far a PM scores the form rather than the answer, on benchmark pairs (question/a/b, label A, B or tie) and
    its logits ``g`` (> 0: a is better), over the pairs of a ``pot`` and a ``cot`` response: its accuracy on the
    decisive ones by the form of the right response, and on the tie ones the share where it takes the ``pot`` side.
    A PM that reads answers is as right whichever form wins and takes either side of a tie; one that reads the form
    is right where its favourite wins and wrong where it loses. A logit of exactly 0 counts half, as a coin would."""
    right: dict[str, list[float]] = {"pot": [], "cot": []}
    pot_side: list[float] = []
    for p, x in zip(pairs, g):
        forms = solution_form(p["a"]), solution_form(p["b"])
        if set(forms) != {"pot", "cot"}:
            continue
        side_a = 0.5 if x == 0 else float(x > 0)  # how much the PM sides with a
        if p["label"] == "tie":
            pot_side.append(side_a if forms[0] == "pot" else 1 - side_a)
        else:
            winner = forms[0] if p["label"] == "A" else forms[1]
            right[winner].append(side_a if p["label"] == "A" else 1 - side_a)

    def mean(xs: list[float]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    return {"pm_accuracy_pot_right": mean(right["pot"]), "n_pot_right": len(right["pot"]),
            "pm_accuracy_cot_right": mean(right["cot"]), "n_cot_right": len(right["cot"]),
            "tie_pot_side_share": mean(pot_side), "n_tie_two_forms": len(pot_side)}
