"""Pre-rollout filtering of solved prompts (``rlvr.skip_solved``), after GRESO (Zheng et al. 2025, "Act Only When It
Pays: Efficient Reinforcement Learning for LLM Reasoning via Selective Rollouts").

On a strong policy most groups are all correct: AR3PO stops sampling such a prompt at its first correct response,
but the k responses of its first stage are still paid for and carry no advantage (stop 85: 0.77 of ar3po's groups).
A prompt whose last group was all correct is likely all correct again, so a step may skip it before generating and
take a fresh prompt in its place: the step keeps its number of prompts, and more of them carry a policy gradient.
A solved prompt is skipped with probability ``p`` < 1, so it still comes back now and then (the policy may have
forgotten it, and its next group then counts it unsolved again).

Example:
    >>> from posttrain.rollout import Response
    >>> solved = SolvedPrompts(p=0.99, seed=0)
    >>> solved.record({"easy": [Response("easy", "a", 1.0, 3)] * 2,
    ...                "mixed": [Response("mixed", "a", 1.0, 3), Response("mixed", "b", 0.0, 3)]})
    >>> solved.select(["easy", "mixed"], more_prompts=iter(["easy", "fresh"]))
    (['mixed', 'fresh'], 1)
"""
from __future__ import annotations

import random
from typing import Iterator

from posttrain.rng_state import rng_state, set_rng_state


class SolvedPrompts:
    """Which prompts' last group was all correct, and the step's prompts with those skipped (probability ``p``)."""

    def __init__(self, p: float, seed: int = 0):
        if not 0 <= p < 1:
            raise ValueError(f"skip probability {p} must be in [0, 1): at 1 a solved prompt never comes back")
        self.p = p
        self.rng = random.Random(seed)
        self.solved: set[str] = set()

    def record(self, groups: dict[str, list]) -> None:
        """After a rollout: a prompt whose generated responses are all correct is solved; any other group it had
        (one wrong response, or a reused one standing in for none right) makes it unsolved again."""
        for prompt, responses in groups.items():
            generated = [r for r in responses if not r.reused]
            if generated and all(r.reward > 0 for r in generated):
                self.solved.add(prompt)
            else:
                self.solved.discard(prompt)

    def _skip(self, prompt: str) -> bool:
        return prompt in self.solved and self.rng.random() < self.p

    def select(self, prompts: list[str], more_prompts: Iterator[str], min_prompts: int = 1,
               max_draws_each: int = 20) -> tuple[list[str], int]:
        """The step's prompts with solved ones skipped, each replaced by a fresh draw from ``more_prompts`` that is
        neither in the step nor skipped itself; and how many were skipped. At most ``max_draws_each`` draws per
        skipped prompt (a stream of solved prompts cannot spin forever: the step is then shorter, never below
        ``min_prompts``, which the step's own prompts make up). At ``p = 0`` the prompts are returned untouched and
        nothing is drawn."""
        if self.p == 0:
            return list(prompts), 0
        kept = [p for p in prompts if not self._skip(p)]
        skipped = len(prompts) - len(kept)
        taken = set(kept)
        for _ in range(skipped * max_draws_each):
            if len(kept) == len(prompts):
                break
            fresh = next(more_prompts, None)
            if fresh is None:
                break
            if fresh not in taken and not self._skip(fresh):
                kept.append(fresh)
                taken.add(fresh)
        kept += [p for p in prompts if p not in taken][:max(min_prompts - len(kept), 0)]
        return kept, skipped

    def state_dict(self) -> dict:
        """JSON-ready state (persisted with every checkpoint)."""
        return {"rng": rng_state(self.rng), "solved": sorted(self.solved)}

    def load_state_dict(self, state: dict) -> None:
        set_rng_state(self.rng, state["rng"])
        self.solved = set(state["solved"])
