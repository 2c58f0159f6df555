"""Rollout schedules for RLVR (METHODS.md section 4) and the group-normalised advantage they feed.

Three ways to fill one training step's groups of scored responses, all driven by a ``sample(prompts, k)``
callback that returns k scored responses per prompt (the policy plus the verifier, or a stub in tests):

- ``fixed_rollout`` (GRPO): n responses for every prompt.
- ``dynamic_sampling`` (DAPO): n responses per prompt; a group whose rewards are all equal carries no
  advantage and is discarded, and fresh prompts are sampled until the batch holds ``n_prompts`` useful groups
  or ``max_rounds`` generation rounds have run.
- ``adaptive_rollout`` (AR3PO): S stages of k responses for the prompts still without a correct response (a
  prompt leaves the pool at its first correct one); after S stages a prompt with none takes one earlier correct
  response from the ``ReplayBuffer`` in place of one incorrect response. The reused response is stop-gradient:
  it only shapes the group baseline, so the on-policy incorrect responses get a negative advantage.

Example:
    >>> import random
    >>> def sample(prompts, k):  # a stub policy: prompt "easy" is always right, "hard" never
    ...     return [[Response(p, "r", float(p == "easy"), 3) for _ in range(k)] for p in prompts]
    >>> groups, stats = adaptive_rollout(["easy", "hard"], stages=3, k=2, sample=sample, buffer=ReplayBuffer(2))
    >>> [len(groups["easy"]), len(groups["hard"])], stats.generated
    ([2, 6], 8)
"""
from __future__ import annotations

import random
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator

from posttrain.rng_state import rng_state, set_rng_state


@dataclass
class Response:
    """One scored response; ``payload`` carries what the trainer needs (token ids), opaque here."""

    prompt: str
    text: str
    reward: float
    n_tokens: int
    payload: Any = None
    reused: bool = False  # drawn from the replay buffer: shapes the baseline, receives no gradient


SampleFn = Callable[[list[str], int], list[list[Response]]]


@dataclass
class RolloutStats:
    """What one step's rollout cost and found."""

    generated: int = 0  # responses generated (reused ones excluded)
    reward_sum: float = 0.0  # the verifier's rewards of those responses (discarded and replaced ones included)
    tokens: int = 0  # tokens generated
    rounds: int = 0  # generation calls (stages for AR3PO, rounds for DAPO)
    buffer_hits: int = 0  # prompts that took a response from the replay buffer
    per_prompt: Counter = field(default_factory=Counter)  # responses generated per prompt
    solved: set = field(default_factory=set)  # prompts with a correct generated response

    def add_round(self, groups: list[list[Response]]) -> None:
        """Count one generation call's responses."""
        for rs in groups:
            for r in rs:
                self.generated += 1
                self.reward_sum += r.reward
                self.tokens += r.n_tokens
                self.per_prompt[r.prompt] += 1
                if r.reward > 0:
                    self.solved.add(r.prompt)
        self.rounds += 1


class ReplayBuffer:
    """Correct responses per prompt, at most ``cap`` each (the oldest leaves first); drawn uniformly."""

    def __init__(self, cap: int, seed: int = 0):
        self.cap = cap
        self.rng = random.Random(seed)
        self.by_prompt: dict[str, list[Response]] = {}

    def add(self, r: Response) -> None:
        kept = self.by_prompt.setdefault(r.prompt, [])
        if any(old.text == r.text for old in kept):
            return  # the same text twice adds nothing to the baseline
        kept.append(r)
        del kept[:-self.cap]

    def draw(self, prompt: str) -> Response | None:
        kept = self.by_prompt.get(prompt)
        return self.rng.choice(kept) if kept else None

    def __len__(self) -> int:
        return sum(map(len, self.by_prompt.values()))

    def state_dict(self) -> dict:
        """JSON-ready state (persisted with every checkpoint)."""
        return {"cap": self.cap, "rng": rng_state(self.rng),
                "by_prompt": {p: [asdict(r) for r in rs] for p, rs in self.by_prompt.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.cap = state["cap"]
        set_rng_state(self.rng, state["rng"])
        self.by_prompt = {p: [Response(**r) for r in rs] for p, rs in state["by_prompt"].items()}


def group_advantages(rewards: list[float], eps: float = 1e-4) -> list[float]:
    """GRPO's (R_i - mean) / (std + eps) over one group (sample std, as TRL); 0 for a group of equal rewards."""
    if len(rewards) < 2:
        return [0.0] * len(rewards)
    mean, std = statistics.fmean(rewards), statistics.stdev(rewards)
    return [0.0 if std == 0 else (r - mean) / (std + eps) for r in rewards]


@dataclass
class AdvantageCensus:
    """Where one step's learning signal went. With 0/1 rewards a group either has equal rewards, and every advantage
    in it is 0, or every response in it has a nonzero advantage."""

    zero_advantage: int = 0  # groups whose rewards are all equal: the policy term gets no gradient from them
    zero_advantage_unsolved: int = 0  # of those, groups without a correct response (the rest are all correct)
    signal_responses: int = 0  # generated responses in the batch with a nonzero advantage


def advantages_by_group(groups: dict[str, list[Response]]
                        ) -> tuple[list[list[tuple[Response, float]]], AdvantageCensus]:
    """Each group's generated responses with their advantage over the whole group (a reused response shapes the
    baseline and is left out of the batch), and the census of which groups carry no advantage and why.

    Example:
        >>> right, wrong = Response("p", "a", 1.0, 3), Response("p", "b", 0.0, 3)
        >>> old = Response("q", "c", 1.0, 3, reused=True)
        >>> rows, census = advantages_by_group({"p": [right, right], "q": [wrong, old], "r": [wrong, wrong]})
        >>> [len(g) for g in rows], census.zero_advantage, census.zero_advantage_unsolved, census.signal_responses
        ([2, 1, 2], 2, 1, 1)
    """
    rows_by_group, census = [], AdvantageCensus()
    for rs in groups.values():
        adv = group_advantages([r.reward for r in rs])
        rows = [(r, a) for r, a in zip(rs, adv) if not r.reused]
        if all(a == 0 for a in adv):
            census.zero_advantage += 1
            census.zero_advantage_unsolved += not any(r.reward > 0 for r in rs)
        census.signal_responses += sum(a != 0 for _, a in rows)
        rows_by_group.append(rows)
    return rows_by_group, census


def groups_with_signal(rows_by_group: list[list[tuple[Response, float]]], min_groups: int = 1
                       ) -> list[list[tuple[Response, float]]]:
    """The groups that carry a policy gradient (some nonzero advantage), for ``rlvr.zero_advantage_groups: drop``.

    A group without advantage adds only KL-penalty tokens to the loss, and TRL divides the loss by all of a step's
    tokens, so with most groups all right the policy term is a small share of the loss. With fewer than
    ``min_groups`` such groups (every process of a multi-process launch needs one), groups without advantage make up
    the count, in order: such a step pays the KL term only, as DAPO's step without a useful group does.

    Example:
        >>> right, wrong = Response("p", "a", 1.0, 3), Response("p", "b", 0.0, 3)
        >>> rows = [[(right, 0.0), (right, 0.0)], [(right, 0.7), (wrong, -0.7)], [(wrong, 0.0)]]
        >>> [len(g) for g in groups_with_signal(rows)], [len(g) for g in groups_with_signal(rows[:1] + rows[2:], 2)]
        ([2], [2, 1])
    """
    signal = [g for g in rows_by_group if any(a != 0 for _, a in g)]
    if len(signal) >= min_groups:
        return signal
    rest = [g for g in rows_by_group if not any(a != 0 for _, a in g)]
    return signal + rest[:min_groups - len(signal)]


def fixed_rollout(prompts: list[str], n: int, sample: SampleFn) -> tuple[dict[str, list[Response]], RolloutStats]:
    """GRPO: n responses for every prompt."""
    stats = RolloutStats()
    out = sample(prompts, n)
    stats.add_round(out)
    return dict(zip(prompts, out)), stats


def dynamic_sampling(prompts: list[str], n: int, sample: SampleFn, more_prompts: Iterator[str], max_rounds: int,
                     min_groups: int = 1) -> tuple[dict[str, list[Response]], RolloutStats]:
    """DAPO: keep only groups with differing rewards; draw more prompts until ``len(prompts)`` groups are kept.

    When no round kept a single group, the last round's groups are returned (all advantages 0: a step that
    only pays the KL term) rather than an empty batch. With fewer than ``min_groups`` groups to return (the
    processes of a multi-process launch each need one), discarded groups, the latest first, make up the count.
    """
    stats, kept, wanted = RolloutStats(), {}, len(prompts)
    candidates, last, discarded = list(prompts), {}, {}
    while candidates and stats.rounds < max_rounds:
        out = sample(candidates, n)
        stats.add_round(out)
        last = dict(zip(candidates, out))
        kept.update({p: rs for p, rs in last.items() if len({r.reward for r in rs}) > 1})
        discarded = {**{p: rs for p, rs in last.items() if p not in kept}, **discarded}  # the latest round first
        candidates = fresh_prompts(more_prompts, wanted - len(kept), taken=set(kept))
    groups = dict(list(kept.items())[:wanted]) if kept else last
    for p, rs in discarded.items():
        if len(groups) >= min_groups:
            break
        groups.setdefault(p, rs)
    return groups, stats


def fresh_prompts(more_prompts: Iterator[str], count: int, taken: set[str], max_draws_each: int = 20) -> list[str]:
    """Up to ``count`` distinct prompts from ``more_prompts`` that are not in ``taken`` (the step's kept groups).

    The stream draws with replacement: a prompt already kept would be generated again and its new group would replace
    the kept one (groups are keyed by prompt), and one drawn twice in a round is generated twice and kept once; either
    way responses are paid for and lost. A discarded prompt may come back: resampled, its group may differ. At most
    ``max_draws_each`` draws per prompt wanted, so a stream of nothing but taken prompts cannot spin forever.
    """
    out: list[str] = []
    for _ in range(max(count, 0) * max_draws_each):
        if len(out) == count:
            break
        p = next(more_prompts, None)
        if p is None:
            break
        if p not in taken and p not in out:
            out.append(p)
    return out


def adaptive_rollout(prompts: list[str], stages: int, k: int, sample: SampleFn,
                     buffer: ReplayBuffer) -> tuple[dict[str, list[Response]], RolloutStats]:
    """AR3PO: S stages of k responses for the still-unsolved prompts, then response reuse from ``buffer``."""
    stats = RolloutStats()
    groups: dict[str, list[Response]] = {p: [] for p in prompts}
    active = list(prompts)
    for _ in range(stages):
        if not active:
            break
        # 1. k responses for every prompt still without a correct one
        out = sample(active, k)
        stats.add_round(out)
        for p, rs in zip(active, out):
            groups[p] += rs
        # 2. a prompt with a correct response leaves the pool
        active = [p for p in active if not any(r.reward > 0 for r in groups[p])]
    for p, rs in groups.items():
        correct = [r for r in rs if r.reward > 0]
        if correct:
            for r in correct:  # 3. newly found correct responses enter the buffer
                buffer.add(r)
            continue
        # 4. no correct response after S stages: one earlier correct response replaces one incorrect one
        old = buffer.draw(p)
        if old is not None:
            rs[-1] = Response(old.prompt, old.text, old.reward, old.n_tokens, old.payload, reused=True)
            stats.buffer_hits += 1
    return groups, stats
