"""DOTS optimal-trajectory search (arXiv 2410.03864, Algorithm 1), batched across questions.

For each question, every candidate trajectory is run ``n_eval`` times per iteration by the solver; the
running success rate over all samples so far ranks the candidates (ties: fewer actions first, then the
fixed order of TRAJECTORIES), and iteration k keeps the top ``keep[k]``. The best survivor after the
last iteration is the optimal trajectory. A question that every trajectory solves, or none does, in
the first iteration (where all 12 run) is dropped: it carries no signal about which one to use.

The solver is a callable, so the search runs on a stub with known success rates in tests and on the
warm-up model (batched generation + verifier) in the stage::

    def run_samples(jobs: list[tuple[str, Trajectory]], n: int) -> list[int]:
        '''For each (question id, trajectory), how many of n samples were correct.'''

Example:
    >>> rates = {"cot": 0.0, "pot": 1.0}
    >>> solver = lambda jobs, n: [n if rates.get(t.name, 0.5) == 1.0 else 0 for _, t in jobs]
    >>> search_trajectories(["q1"], solver, SearchConfig(iterations=1, n_eval=2, keep=(3,)))[0].optimal
    'pot'
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from posttrain.trajectories import TRAJECTORIES, Trajectory

RunSamples = Callable[[list[tuple[str, Trajectory]], int], list[int]]


@dataclass(frozen=True)
class SearchConfig:
    """The search's sizes; the solver's sampling temperature belongs to ``run_samples``."""

    iterations: int = 2  # K: search iterations
    n_eval: int = 4  # samples per candidate per iteration
    keep: tuple[int, ...] = (8, 3)  # N_k: candidates kept after iteration k

    def __post_init__(self):
        if len(self.keep) != self.iterations:
            raise ValueError(f"keep has {len(self.keep)} entries, expected one per iteration ({self.iterations})")


@dataclass
class SearchResult:
    id: str
    successes: dict[str, int] = field(default_factory=dict)  # trajectory name -> correct samples so far
    trials: dict[str, int] = field(default_factory=dict)  # trajectory name -> samples so far
    survivors: list[str] = field(default_factory=list)  # ranked candidates after the last iteration
    optimal: str | None = None
    dropped: str | None = None  # "all solved" | "all failed" | None

    def rate(self, name: str) -> float:
        return self.successes[name] / self.trials[name] if self.trials.get(name) else 0.0

    def to_record(self) -> dict:
        return {"id": self.id, "optimal": self.optimal, "dropped": self.dropped, "survivors": self.survivors,
                "successes": self.successes, "trials": self.trials}


_ORDER = {t.name: i for i, t in enumerate(TRAJECTORIES)}


def rank(result: SearchResult, names: list[str]) -> list[str]:
    """Best first: higher success rate, then fewer actions, then the fixed trajectory order."""
    return sorted(names, key=lambda n: (-result.rate(n), Trajectory.from_name(n).n_actions, _ORDER[n]))


def search_trajectories(question_ids: list[str], run_samples: RunSamples, cfg: SearchConfig) -> list[SearchResult]:
    """Run the search for every question; one ``run_samples`` call per iteration covers all of them."""
    results = {q: SearchResult(q) for q in question_ids}
    candidates = {q: [t.name for t in TRAJECTORIES] for q in question_ids}
    for k in range(cfg.iterations):
        active = [q for q in question_ids if results[q].dropped is None]
        jobs = [(q, Trajectory.from_name(n)) for q in active for n in candidates[q]]
        if not jobs:
            break
        # 1. every remaining candidate runs n_eval times
        counts = run_samples(jobs, cfg.n_eval)
        for (q, t), c in zip(jobs, counts, strict=True):
            r = results[q]
            r.successes[t.name] = r.successes.get(t.name, 0) + int(c)
            r.trials[t.name] = r.trials.get(t.name, 0) + cfg.n_eval
        for q in active:
            r = results[q]
            # 2. questions every trajectory solves, or none does, carry no signal
            if k == 0:
                rates = [r.rate(n) for n in candidates[q]]
                if all(x == 1.0 for x in rates):
                    r.dropped = "all solved"
                elif all(x == 0.0 for x in rates):
                    r.dropped = "all failed"
            # 3. rank on the running success rate and keep the top N_k
            candidates[q] = rank(r, candidates[q])[: cfg.keep[k]]
    for q, r in results.items():
        r.survivors = candidates[q]
        r.optimal = None if r.dropped else candidates[q][0]
    return [results[q] for q in question_ids]
