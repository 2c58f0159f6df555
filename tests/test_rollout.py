"""RLVR rollout schedules (posttrain.rollout) on stub policies with known success probabilities, and the
RLVRTrainer batch they produce (reused responses shape the baseline but never enter the batch)."""
import random
from collections import Counter

import pytest

from posttrain.rollout import (ReplayBuffer, Response, adaptive_rollout, advantages_by_group, dynamic_sampling,
                               fixed_rollout, group_advantages)


def stub_policy(p_correct: dict[str, float], seed: int = 0):
    """sample(prompts, k): k responses per prompt, each correct with the prompt's probability; records calls."""
    rng, calls = random.Random(seed), []

    def sample(prompts, k):
        calls.append((list(prompts), k))
        return [[Response(p, f"{p}-{len(calls)}-{i}", float(rng.random() < p_correct[p]), 10) for i in range(k)]
                for p in prompts]
    return sample, calls


def scheduled_policy(first_correct_call: dict[str, int | None]):
    """Deterministic stub: prompt p is answered correctly from its n-th generation call on (None: never)."""
    seen = Counter()

    def sample(prompts, k):
        out = []
        for p in prompts:
            seen[p] += 1
            ok = first_correct_call[p] is not None and seen[p] >= first_correct_call[p]
            out.append([Response(p, f"{p}-{seen[p]}-{i}", float(ok and i == 0), 5) for i in range(k)])
        return out
    return sample


@pytest.mark.parametrize("k", [1, 2])
def test_adaptive_rollout_prompts_leave_at_their_first_correct_stage(k):
    schedule = {"s1": 1, "s2": 2, "s3": 3, "never": None}
    groups, stats = adaptive_rollout(list(schedule), stages=3, k=k, sample=scheduled_policy(schedule),
                                     buffer=ReplayBuffer(cap=2))
    stages_taken = {"s1": 1, "s2": 2, "s3": 3, "never": 3}
    assert {p: len(rs) for p, rs in groups.items()} == {p: k * n for p, n in stages_taken.items()}
    assert stats.generated == 9 * k and stats.rounds == 3 and stats.tokens == 9 * k * 5
    assert dict(stats.per_prompt) == {p: k * n for p, n in stages_taken.items()}


@pytest.mark.parametrize("k", [1, 2])
def test_adaptive_rollout_mean_responses_match_the_closed_form(k):
    """With success probability q per response, E[responses] = k * sum_{s<S} (1-q)^(k s)."""
    S, q, n = 4, 0.3, 4000
    prompts = [f"p{i}" for i in range(n)]
    sample, _ = stub_policy({p: q for p in prompts}, seed=1)
    groups, stats = adaptive_rollout(prompts, stages=S, k=k, sample=sample, buffer=ReplayBuffer(cap=4))
    expected = k * sum((1 - q) ** (k * s) for s in range(S))
    assert stats.generated / n == pytest.approx(expected, rel=0.03)
    assert max(len(rs) for rs in groups.values()) == S * k  # never more than S x k per prompt


def test_reuse_inserts_exactly_one_buffered_response_and_makes_the_failures_negative():
    buffer = ReplayBuffer(cap=2)
    buffer.add(Response("hard", "an earlier right answer", 1.0, 7, payload="ids"))
    sample = scheduled_policy({"hard": None, "easy": 1})
    groups, stats = adaptive_rollout(["hard", "easy"], stages=2, k=3, sample=sample, buffer=buffer)
    hard = groups["hard"]
    assert len(hard) == 6 and sum(r.reused for r in hard) == 1 and stats.buffer_hits == 1
    reused = next(r for r in hard if r.reused)
    assert reused.text == "an earlier right answer" and reused.reward == 1.0
    assert stats.generated == 6 + 3  # the reused response was not generated
    adv = group_advantages([r.reward for r in hard])
    assert all(a < 0 for a, r in zip(adv, hard) if not r.reused) and adv[hard.index(reused)] > 0
    # without the buffer the group is all wrong: no signal at all
    assert group_advantages([0.0] * 6) == [0.0] * 6


def test_the_census_splits_zero_advantage_groups_and_counts_only_generated_signal():
    buffer = ReplayBuffer(cap=2)
    buffer.add(Response("hard", "an earlier right answer", 1.0, 7))
    # "hard" takes the buffered answer, "never" has none to take, "easy" is right at once (both of its responses),
    # "mixed" is right on its first response only
    sample = scheduled_policy({"hard": None, "never": None, "easy": 1, "mixed": 1})
    groups, stats = adaptive_rollout(["hard", "never", "easy", "mixed"], stages=2, k=2, sample=sample, buffer=buffer)
    groups["easy"] = [Response("easy", "right", 1.0, 5), Response("easy", "also right", 1.0, 5)]
    rows, census = advantages_by_group(groups)
    assert census.zero_advantage == 2  # "never" (unsolved) and "easy" (all correct)
    assert census.zero_advantage_unsolved == 1
    # "hard": its 3 generated wrong answers in the batch have an advantage, the reused one is not in the batch;
    # "mixed": both; the response "hard"'s reused one replaced was generated and carries nothing
    assert census.signal_responses == 3 + 2
    assert [len(g) for g in rows] == [3, 4, 2, 2] and stats.generated == 4 + 4 + 2 + 2
    assert all(a == 0 for g in (rows[1], rows[2]) for _, a in g)
    assert all(a != 0 for g in (rows[0], rows[3]) for _, a in g)


def test_new_correct_responses_enter_the_buffer_and_the_cap_holds():
    buffer = ReplayBuffer(cap=2)
    sample = scheduled_policy({"a": 1})
    for _ in range(4):
        adaptive_rollout(["a"], stages=1, k=3, sample=sample, buffer=buffer)
    assert len(buffer.by_prompt["a"]) == 2  # 4 correct responses found, the 2 newest kept
    assert [r.text for r in buffer.by_prompt["a"]] == ["a-3-0", "a-4-0"]
    restored = ReplayBuffer(cap=1)
    restored.load_state_dict(buffer.state_dict())
    assert restored.cap == 2 and [r.text for r in restored.by_prompt["a"]] == ["a-3-0", "a-4-0"]
    assert restored.draw("a").text == buffer.draw("a").text  # the sampler's state travels too


def test_dynamic_sampling_fills_the_batch_with_non_degenerate_groups_only():
    p_correct = {"always": 1.0, "never": 0.0, **{f"mixed{i}": 0.5 for i in range(20)}}
    sample, calls = stub_policy(p_correct, seed=2)
    more = iter(["always", "never", *[f"mixed{i}" for i in range(2, 20)]])
    groups, stats = dynamic_sampling(["always", "never", "mixed0", "mixed1"], n=6, sample=sample, more_prompts=more,
                                     max_rounds=5)
    assert len(groups) == 4
    assert all(len({r.reward for r in rs}) > 1 for rs in groups.values())
    assert "always" not in groups and "never" not in groups
    assert stats.rounds == len(calls) <= 5 and stats.generated == 6 * sum(len(c[0]) for c in calls)


def test_dynamic_sampling_stops_at_the_round_cap():
    sample, calls = stub_policy({"never": 0.0})
    groups, stats = dynamic_sampling(["never"], n=4, sample=sample, more_prompts=iter(["never"] * 10), max_rounds=3)
    assert stats.rounds == 3 == len(calls)
    assert list(groups) == ["never"]  # nothing useful found: the last round's group (zero advantage), not an empty batch


def test_dynamic_sampling_makes_up_a_group_per_process_from_the_discarded_ones():
    # one useful group in two rounds, but two processes each need a group: the latest discarded one makes up the count
    sample, _ = stub_policy({"never": 0.0, "always": 1.0, "mixed": 0.5}, seed=2)
    more = iter(["always", "never"])
    groups, _ = dynamic_sampling(["mixed", "never"], n=6, sample=sample, more_prompts=more, max_rounds=2, min_groups=2)
    assert list(groups) == ["mixed", "always"]  # "always" was discarded in round 2, "never" in round 1
    assert len({r.reward for r in groups["mixed"]}) > 1 and {r.reward for r in groups["always"]} == {1.0}
    # one process: the useful group alone, as before
    sample, _ = stub_policy({"never": 0.0, "always": 1.0, "mixed": 0.5}, seed=2)
    groups, _ = dynamic_sampling(["mixed", "never"], n=6, sample=sample, more_prompts=iter(["always", "never"]),
                                 max_rounds=2)
    assert list(groups) == ["mixed"]


def test_fixed_rollout_and_group_advantages():
    sample, _ = stub_policy({"a": 0.5, "b": 0.5}, seed=3)
    groups, stats = fixed_rollout(["a", "b"], 5, sample)
    assert [len(rs) for rs in groups.values()] == [5, 5] and stats.generated == 10
    adv = group_advantages([1.0, 0.0, 0.0, 0.0])  # mean 0.25, sample std 0.5
    assert adv == pytest.approx([1.5, -0.5, -0.5, -0.5], rel=1e-3)


def test_the_rollout_reward_and_solved_share_count_what_the_policy_generated():
    # "hard" is never solved; a buffered correct response replaces one of its 6 failures, and it is not the policy's
    buffer = ReplayBuffer(2)
    buffer.add(Response("hard", "an old correct one", 1.0, 5))
    sample, _ = stub_policy({"easy": 1.0, "hard": 0.0})
    groups, stats = adaptive_rollout(["easy", "hard"], stages=3, k=2, sample=sample, buffer=buffer)
    assert sum(r.reused for r in groups["hard"]) == 1 and stats.generated == 8
    assert stats.reward_sum / stats.generated == 2 / 8 and stats.solved == {"easy"}
    # DAPO: the discarded all-right and all-wrong groups were generated too
    sample, _ = stub_policy({"always": 1.0, "never": 0.0, "mixed": 0.5}, seed=2)
    groups, stats = dynamic_sampling(["always", "never"], n=4, sample=sample, more_prompts=iter(["mixed"] * 9),
                                     max_rounds=2)
    assert "always" not in groups and stats.solved >= {"always"} and stats.reward_sum >= 4


def test_dynamic_sampling_never_regenerates_a_prompt_it_already_kept_this_step():
    # the extra-prompt stream draws with replacement from every prompt, so it can hand back one the step already kept
    # (or the same one twice in a round): its new group overwrote the kept one (keyed by prompt), the step came out a
    # group short and the overwritten group's responses still counted as DAPO's cost
    sample, calls = stub_policy({"m0": 0.5, "m1": 0.5, "never": 0.0, "m2": 0.5}, seed=2)
    groups, stats = dynamic_sampling(["m0", "never"], n=8, sample=sample, more_prompts=iter(["m0", "m1", "m1", "m2"]),
                                     max_rounds=3)
    assert list(groups) == ["m0", "m1"] and stats.rounds == 2
    assert [c[0] for c in calls] == [["m0", "never"], ["m1"]]
    assert stats.per_prompt["m0"] == 8 and stats.generated == 8 * 3
    # within one round, a prompt drawn twice is generated once (it was generated twice and kept once)
    sample, calls = stub_policy({"a": 0.0, "b": 0.0, "m1": 0.5, "m2": 0.5}, seed=2)
    groups, _ = dynamic_sampling(["a", "b"], n=8, sample=sample, more_prompts=iter(["m1", "m1", "m2"]), max_rounds=2)
    assert calls[1][0] == ["m1", "m2"] and list(groups) == ["m1", "m2"]
