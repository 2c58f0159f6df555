"""Routing: the policies and their budget, verdicts as antisymmetric logits, the pairwise advantage, and the
routed reward a GRPO step calls (stub PM and judges)."""
import json
import random

import pytest
import torch

from posttrain.params import load_params
from posttrain.rng_state import rng_state
from posttrain.routing import (antisymmetrize, apply_verdicts, budget_count, decisive_chance, expected_gain,
                               pairwise_advantages, right_side, route_batch)
from posttrain.uncertainty import pair_uncertainty


def test_budget_count_rounds_the_written_budget_half_up():
    # in binary 0.35 x 90 is 31.499999999999996 and 0.29 x 50 is 14.499999999999998
    assert budget_count(90, 0.35) == 32 and budget_count(50, 0.29) == 15 and budget_count(10, 0.05) == 1
    assert budget_count(10, 0.1) == 1 and budget_count(10, 0.04) == 0 and budget_count(7, 1.0) == 7
    for n in range(1, 200):
        for percent in range(101):
            assert budget_count(n, percent / 100) == min(n, (percent * n + 50) // 100), (n, percent)


def test_budget_routing_is_exact_and_random_matches_the_count():
    u = torch.rand(15)
    for budget in (0.0, 0.05, 0.1, 0.2, 0.4, 1.0):
        k = budget_count(15, budget)
        top = route_batch(u, "uncertainty_budget", 0, budget, random.Random(0))
        assert len(top) == k and len(route_batch(u, "random", 0, budget, random.Random(3))) == k
        if k:  # the chosen pairs are the k most uncertain
            assert min(float(u[i]) for i in top) >= max((float(u[i]) for i in range(15) if i not in top), default=0)
    assert route_batch(u, "rm_only", 0, 0, random.Random(0)) == []
    assert route_batch(u, "judge_only", 0, 0, random.Random(0)) == list(range(15))
    assert all(u[i] > 0.5 for i in route_batch(u, "uncertainty", 0.5, 0, random.Random(0)))
    eligible = [i % 3 != 0 for i in range(15)]
    assert all(eligible[i] for i in route_batch(u, "uncertainty_budget", 0, 0.4, random.Random(0), eligible))
    assert len(route_batch(u, "random", 0, 1.0, random.Random(0), eligible)) == sum(eligible)
    # a budget is a share of the eligible pairs, i.e. of what judge_only pays: 40% of 10 eligible is 4, not 6
    assert len(route_batch(u, "judge_only", 0, 0, random.Random(0), eligible)) == 10
    for policy in ("uncertainty_budget", "random"):
        assert len(route_batch(u, policy, 0, 0.4, random.Random(0), eligible)) == 4
    flat = torch.rand(200)
    assert len(route_batch(flat, "uncertainty_budget", 0, 0.1, random.Random(0))) == 20
    assert len(route_batch(flat, "random", 0, 0.1, random.Random(0))) == 20


def test_verdicts_map_to_antisymmetric_logits_and_advantages_by_hand():
    r = torch.tensor([[0.0, 1.0, 0.5], [0.2, 0.0, -1.0], [0.1, 0.4, 0.0]])
    s, u = antisymmetrize(r, torch.ones(3, 3))
    assert torch.allclose(s, -s.T) and s[0, 1] == pytest.approx(0.4)
    s = apply_verdicts(s, {(0, 2): "B", (1, 2): "tie"})
    assert s[0, 2] == -2 and s[2, 0] == 2 and s[1, 2] == 0 and s[2, 1] == 0
    # by hand: s = [[0, .4, -2], [-.4, 0, 0], [2, 0, 0]] -> A = scale/2 * row sums
    assert pairwise_advantages(s, scale=2.0).tolist() == pytest.approx([-1.6, -0.4, 2.0])


class StubPM:
    """Scores (q, A, B) as len(A) - len(B); uncertainty grows with how close the lengths are."""

    lam = 10.0

    def score(self, triples, batch_size=64, reduce="mean"):
        g = torch.tensor([float(len(a) - len(b)) for _, a, b in triples])
        return g, 1.0 / (1.0 + g.abs())

    def uncertainty(self, g, var):
        return pair_uncertainty(g, var, self.lam, "variance")


class StubJudge:
    def __init__(self, fail_every=0):
        from posttrain.judge_cost import CostLedger
        self.ledger, self.asked, self.fail_every = CostLedger(0.001, 0.002), [], fail_every

    def judge(self, triples):
        self.asked += triples
        out = ["A" if a.endswith("right") else "B" for _, a, b in triples]
        return [None if self.fail_every and k % self.fail_every == 0 else v for k, v in enumerate(out)]


def test_routed_reward_honours_the_budget_and_falls_back_on_judge_failures():
    from posttrain.rlhf import RoutedPairwiseReward

    cfg = load_params("configs/params.smoke.yaml").rlhf.model_copy(update={"routing": "uncertainty_budget",
                                                                           "budget": 0.5, "route_score": "uncertainty"})
    responses = ["aa right", "a", "aaaa", "aaa right"]  # 6 pairs per prompt -> 3 judged
    judge = StubJudge()
    reward = RoutedPairwiseReward(StubPM(), judge, cfg, seed=0)
    metrics = {}
    rewards = reward(prompts=["p1"] * 4 + ["p2"] * 4, completions=responses * 2, question=["q1"] * 4 + ["q2"] * 4,
                     log_metric=lambda k, v: metrics.__setitem__(k, v))
    assert len(judge.asked) == 6 and metrics["routing/routed_fraction"] == 0.5
    assert sum(rewards[:4]) == pytest.approx(0, abs=1e-5) and rewards[:4] == pytest.approx(rewards[4:])
    # the three most uncertain pairs have the closest lengths (8, 1, 4, 9): |8-9|, |1-4|, |8-4|
    assert {(a, b) for _, a, b in judge.asked[:3]} == {("aa right", "aaa right"), ("a", "aaaa"), ("aa right", "aaaa")}
    failing = StubJudge(fail_every=1)
    reward = RoutedPairwiseReward(StubPM(), failing, cfg, seed=0)
    assert reward(prompts=["p"] * 4, completions=responses, question=["q"] * 4) == pytest.approx(
        RoutedPairwiseReward(StubPM(), StubJudge(), cfg.model_copy(update={"routing": "rm_only"}), 0)(
            prompts=["p"] * 4, completions=responses, question=["q"] * 4))
    assert reward.totals["judge_failures"] == 3


def test_routed_reward_spends_the_budget_on_the_steps_most_uncertain_pairs():
    """The budget is over the whole step's pairs: 10% of 2 x 6 pairs is 1 call (per prompt it would round to 1
    each, 17%), and it goes to the most uncertain pair of the step, here in the second prompt."""
    from posttrain.rlhf import RoutedPairwiseReward

    cfg = load_params("configs/params.smoke.yaml").rlhf.model_copy(update={"routing": "uncertainty_budget",
                                                                           "budget": 0.1, "route_score": "uncertainty"})
    far_apart = ["a", "a" * 6, "a" * 12, "a" * 18]  # lengths 5 or more apart: the PM is sure
    close = ["aa right", "a", "aaaa", "aaa right"]  # |8 - 9| = 1: the step's most uncertain pair
    judge, metrics = StubJudge(), {}
    reward = RoutedPairwiseReward(StubPM(), judge, cfg, seed=0)
    rewards = reward(prompts=["p1"] * 4 + ["p2"] * 4, completions=far_apart + close,
                     question=["q1"] * 4 + ["q2"] * 4, log_metric=lambda k, v: metrics.__setitem__(k, v))
    assert judge.asked == [("q2", "aa right", "aaa right")]
    assert metrics["routing/routed_fraction"] == pytest.approx(1 / 12) and reward.totals["routed"] == 1
    # the verdict (A better: s_03 = +2) replaced the PM's s_03 = (8 - 9) = -1 for that pair only
    rm_only = RoutedPairwiseReward(StubPM(), StubJudge(), cfg.model_copy(update={"routing": "rm_only"}), 0)(
        prompts=["p1"] * 4 + ["p2"] * 4, completions=far_apart + close, question=["q1"] * 4 + ["q2"] * 4)
    shift = cfg.advantage_scale * 3 / 3  # scale / (n - 1) * (2 - (-1))
    assert rewards[:4] == pytest.approx(rm_only[:4]) and rewards[5:7] == pytest.approx(rm_only[5:7])
    assert rewards[4] - rm_only[4] == pytest.approx(shift) and rewards[7] - rm_only[7] == pytest.approx(-shift)


class VerifierLikeJudge(StubJudge):
    """The verifier's rule: a tie unless exactly one response is right."""

    def judge(self, triples):
        self.asked += triples
        return ["tie" if a.endswith("right") == b.endswith("right") else "A" if a.endswith("right") else "B"
                for _, a, b in triples]


def test_the_run_counts_the_verdicts_that_were_ties_and_that_overruled_the_pm():
    from posttrain.rlhf import RoutedPairwiseReward

    cfg = load_params("configs/params.smoke.yaml").rlhf.model_copy(update={"routing": "judge_only"})
    # the PM prefers the longer response: lengths 8, 12, 4, 9; judged: (0,1) A over the PM's -4, (0,2) A,
    # (0,3) tie, (1,2) tie, (1,3) B over the PM's +3, (2,3) B -> 2 ties and 2 overrules of 6 verdicts
    responses = ["aa right", "a" * 12, "aaaa", "aaa right"]
    reward, metrics = RoutedPairwiseReward(StubPM(), VerifierLikeJudge(), cfg, seed=0), {}
    reward(prompts=["p"] * 4, completions=responses, question=["q"] * 4,
           log_metric=lambda k, v: metrics.__setitem__(k, v))
    assert metrics["routing/judge_tie_share"] == pytest.approx(2 / 6)
    assert metrics["routing/judge_overrule_share"] == pytest.approx(2 / 6)
    reward(prompts=["p"] * 4, completions=responses[:2] + ["aaaa right", "aaa"], question=["q"] * 4)
    # second step: (0,1) A overrules, (0,2) tie, (0,3) A, (1,2) B overrules, (1,3) tie, (2,3) A -> 4 of 12 each
    summary = reward.summary()
    assert summary["judge_tie_share"] == pytest.approx(4 / 12)
    assert summary["judge_overrule_share"] == pytest.approx(4 / 12)
    assert summary["routed_fraction"] == 1.0 and summary["judge_failures"] == 0


def test_pairs_with_the_same_final_answer_skip_the_judge_or_score_a_tie():
    from posttrain.rlhf import RoutedPairwiseReward

    class FirstWordAnswers(RoutedPairwiseReward):
        def final_answers(self, texts):
            return [int(t.split()[0]) for t in texts]

    # answers 5, 7, 5, 9: only (0, 2) agree; the PM (longer is better) scores it 7 - 10 = -3
    responses = ["5 right", "7 xxxxxxx", "5 yy right", "9 z"]
    base = load_params("configs/params.smoke.yaml").rlhf.model_copy(update={"routing": "judge_only"})
    rewards, asked, summaries = {}, {}, {}
    for same in ("judge", "skip", "tie"):
        judge = VerifierLikeJudge()
        reward = FirstWordAnswers(StubPM(), judge, base.model_copy(update={"same_answer": same}), seed=0)
        rewards[same] = reward(prompts=["p"] * 4, completions=responses, question=["q"] * 4)
        asked[same], summaries[same] = {(a, b) for _, a, b in judge.asked}, reward.summary()
    assert ("5 right", "5 yy right") in asked["judge"] and len(asked["judge"]) == 6
    assert asked["skip"] == asked["tie"] == asked["judge"] - {("5 right", "5 yy right")}
    assert summaries["tie"]["same_answer_share"] == pytest.approx(1 / 6)
    assert summaries["judge"]["same_answer_share"] == 0
    # judge: the verdict on (0, 2) is a tie as well; skip keeps the PM's -3; tie scores 0 without a call
    assert rewards["tie"] == pytest.approx(rewards["judge"])
    assert rewards["tie"][0] - rewards["skip"][0] == pytest.approx(1.0)  # scale / (n - 1) * (0 - (-3))
    assert rewards["tie"][2] - rewards["skip"][2] == pytest.approx(-1.0)


def test_expected_gain_sends_the_budget_where_a_verdict_can_split_right_from_wrong():
    """Answers 5, 5, 7, 9 (lengths 6, 7, 12, 14; the stub PM prefers the longer, surely when far apart). By u alone
    the one call (10% of 6 pairs) goes to the closest lengths, (0, 1), whose answers agree: a tie. expected_gain
    scores it 0 (never decisive) and every far-apart pair below 0 (the PM leans harder than a verdict would), and
    sends the call to (2, 3): s = -2, p = sigmoid(-2 / sqrt(1 + 10 / 3)) = 0.277, decisive with chance 1/4 + 1/4,
    gain 0.5 x (2 - 2 x 0.447) = 0.55."""
    from posttrain.rlhf import RoutedPairwiseReward

    class FirstWordAnswers(RoutedPairwiseReward):
        def final_answers(self, texts):
            return [int(t.split()[0]) for t in texts]

    responses = ["5 aaaa", "5 aaaaa", "7 aaaaaaaaaa", "9 aaaaaaaaaaa"]
    base = load_params("configs/params.smoke.yaml").rlhf.model_copy(update={"routing": "uncertainty_budget",
                                                                            "budget": 0.1})
    asked = {}
    for rank in ("uncertainty", "expected_gain"):
        judge = StubJudge()
        FirstWordAnswers(StubPM(), judge, base.model_copy(update={"route_score": rank}), seed=0)(
            prompts=["p"] * 4, completions=responses, question=["q"] * 4)
        asked[rank] = [(a, b) for _, a, b in judge.asked]
    assert asked["uncertainty"] == [("5 aaaa", "5 aaaaa")]
    assert asked["expected_gain"] == [("7 aaaaaaaaaa", "9 aaaaaaaaaaa")]
    d = decisive_chance([7, 7, 3, None, None])
    assert d[0, 1] == 0 and d[3, 4] == 0 and d[0, 2] == pytest.approx(0.6) and d[2, 3] == pytest.approx(0.2)
    assert torch.equal(d, d.T)
    s, p = torch.tensor([[0.0, -2.0], [2.0, 0.0]]), torch.tensor([[0.5, 0.277], [0.723, 0.5]])
    gain = expected_gain(s, p, torch.full((2, 2), 0.5))
    assert gain[0, 1] == pytest.approx(0.5 * (0.277 * 4 + 0.723 * 0)) and gain[1, 0] == pytest.approx(gain[0, 1])


def test_right_side_multiplies_the_pms_odds_by_the_answers_shares():
    """q_ij = P(i is the right one | exactly one is): the PM's odds p / (1 - p) times share_i / share_j. Answers
    7, 7, 3, None: for (0, 2) with p = 0.8, odds 4 x (2/4) / (1/4) = 8, q = 8/9; with p = 0.2 the shares' 2 to 1
    for i meets the PM's 1 to 4, q = 1/3; a response with no answer is never the right one, however sure the PM is
    (q = 0 for (3, 0) at p = 0.999, so its gain is what a verdict for response 0 would bring); equal shares leave
    p as it is."""
    p = torch.full((4, 4), 0.5)
    p[0, 2], p[2, 0], p[1, 2], p[2, 1], p[3, 0], p[0, 3] = 0.8, 0.2, 0.2, 0.8, 0.999, 0.001
    q = right_side(p, [7, 7, 3, None])
    assert q[0, 2] == pytest.approx(8 / 9) and q[2, 0] == pytest.approx(1 / 9)
    assert q[1, 2] == pytest.approx(1 / 3) and q[2, 1] == pytest.approx(2 / 3)
    assert q[3, 0] == 0 and q[0, 3] == 1
    assert q[0, 1] == pytest.approx(0.5) and torch.allclose(q + q.T, torch.ones(4, 4))
    assert right_side(torch.tensor([[0.5, 0.9], [0.1, 0.5]]), [None, None])[0, 1] == pytest.approx(0.9)
    s = torch.zeros(4, 4)
    s[3, 0], s[0, 3] = 3.0, -3.0  # the PM is sure the answerless response is better
    gain = expected_gain(s, q, decisive_chance([7, 7, 3, None]))
    assert gain[3, 0] == pytest.approx(0.5 * (2 + 3)) and gain[0, 3] == pytest.approx(gain[3, 0])


def test_pairs_of_identical_responses_never_reach_the_judge():
    """Identical responses tie by construction; the PM gives them s = 0, the most uncertain score of all, so without
    the rule they would take the whole budget. Budget, threshold, random and judge_only all leave them out."""
    from posttrain.rlhf import RoutedPairwiseReward

    responses = ["aa right", "aa right", "a", "aaaaaaa"]  # (0, 1) identical: u = 1, above every other pair
    base = load_params("configs/params.smoke.yaml").rlhf.model_copy(update={"route_score": "uncertainty"})
    for routing, budget in (("uncertainty_budget", 0.2), ("random", 0.5), ("judge_only", 0.0), ("uncertainty", 0.0)):
        judge = StubJudge()
        reward = RoutedPairwiseReward(StubPM(), judge, base.model_copy(update={
            "routing": routing, "budget": budget, "threshold": 0.0}), seed=0)
        reward(prompts=["p"] * 4, completions=responses, question=["q"] * 4)
        assert judge.asked and all(a != b for _, a, b in judge.asked), (routing, judge.asked)
        assert reward.totals["identical_pairs"] == 1
    # the budget (round(0.2 x 6) = 1) goes to the most uncertain distinct pair, lengths 8 and 7
    judge = StubJudge()
    RoutedPairwiseReward(StubPM(), judge, base.model_copy(update={"routing": "uncertainty_budget", "budget": 0.2}),
                         seed=0)(prompts=["p"] * 4, completions=responses, question=["q"] * 4)
    assert judge.asked == [("q", "aa right", "aaaaaaa")]


def test_responses_differing_only_in_surrounding_whitespace_are_one_text_scored_a_tie():
    """The judge's prompt strips each response, so "aa right" and "aa right\n" are one text to it; they were counted
    identical and never routed, yet kept the PM's s_01 (here -1, from the lengths), which moved their advantages
    apart by noise. Now s_01 = 0: A_0 - A_1 comes from the other pairs alone, (s_02 + s_03) - (s_12 + s_13) = -2."""
    from posttrain.rlhf import RoutedPairwiseReward

    responses = ["aa right", "aa right\n", "a", "aaaaaaa"]
    cfg = load_params("configs/params.smoke.yaml").rlhf.model_copy(update={"route_score": "uncertainty"})
    rewards = RoutedPairwiseReward(StubPM(), StubJudge(), cfg.model_copy(update={"routing": "rm_only"}), seed=0)(
        prompts=["p"] * 4, completions=responses, question=["q"] * 4)
    assert rewards[0] - rewards[1] == pytest.approx(cfg.advantage_scale / 3 * -2)
    judge = StubJudge()
    reward = RoutedPairwiseReward(StubPM(), judge, cfg.model_copy(update={"routing": "judge_only"}), seed=0)
    reward(prompts=["p"] * 4, completions=responses, question=["q"] * 4)
    # one text: (0, 2) and (1, 2) are one comparison, as are (0, 3) and (1, 3), so judge_only pays 3 calls, not 5
    assert reward.totals["identical_pairs"] == 1 and sorted(judge.asked) == [
        ("q", "a", "aaaaaaa"), ("q", "aa right", "a"), ("q", "aa right", "aaaaaaa")]


def test_copies_of_a_comparison_are_asked_once_and_each_gets_the_verdict_in_its_own_order():
    """Responses 0 and 2 are one text, so (0, 1) and (1, 2) are one comparison held in opposite orders, as are (0, 3)
    and (2, 3): 5 judgeable pairs, 3 judge calls. Each copy takes the verdict in its own order (the stub judge
    prefers the response ending in 'right'): s_01 = +2, s_12 = -2 (not +2, as the unflipped verdict would say),
    s_03 = s_23 = +2, s_13 = -2 (lengths 1 and 4: 'aaaa'), s_02 = 0 (one text)."""
    from posttrain.rlhf import RoutedPairwiseReward

    responses = ["aa right", "a", "aa right", "aaaa"]
    base = load_params("configs/params.smoke.yaml").rlhf.model_copy(update={"route_score": "uncertainty"})
    for unit in ("pair", "comparison"):
        judge = StubJudge()
        reward = RoutedPairwiseReward(StubPM(), judge, base.model_copy(update={"routing": "judge_only",
                                                                                "route_unit": unit}), seed=0)
        rewards = reward(prompts=["p"] * 4, completions=responses, question=["q"] * 4)
        assert sorted((a, b) for _, a, b in judge.asked) == [("a", "aaaa"), ("aa right", "a"), ("aa right", "aaaa")]
        assert rewards == pytest.approx([4 / 3, -2, 4 / 3, -2 / 3])  # scale / (n - 1) * row sums of s
        assert reward.totals["routed"] == 5 and reward.summary()["judged_comparisons"] == 3


def test_a_comparison_budget_counts_judge_calls_and_ranks_by_all_copies():
    """Same responses; scored by u (stub PM: closer lengths, more uncertain): (1, 3) |1 - 4| is the most uncertain
    pair, but ('aa right', 'aaaa') |8 - 4| has two copies, so one call on it buys two verdicts. A third of the 3
    comparisons is 1 call; route_unit pair spends its 1 pair (a fifth of 5) on (1, 3)."""
    from posttrain.rlhf import RoutedPairwiseReward

    responses = ["aa right", "a", "aa right", "aaaa"]
    base = load_params("configs/params.smoke.yaml").rlhf.model_copy(update={
        "route_score": "uncertainty", "routing": "uncertainty_budget"})
    asked, rewards = {}, {}
    for unit, budget in (("pair", 0.2), ("comparison", 1 / 3)):
        judge = StubJudge()
        reward = RoutedPairwiseReward(StubPM(), judge, base.model_copy(update={"route_unit": unit, "budget": budget}),
                                      seed=0)
        rewards[unit] = reward(prompts=["p"] * 4, completions=responses, question=["q"] * 4)
        asked[unit] = judge.asked
        summary = reward.summary()
        assert summary["judged_comparisons"] == 1 and summary["judged_comparison_share"] == pytest.approx(1 / 3)
    assert asked["pair"] == [("q", "a", "aaaa")]
    assert asked["comparison"] == [("q", "aa right", "aaaa")]
    rm_only = RoutedPairwiseReward(StubPM(), StubJudge(), base.model_copy(update={"routing": "rm_only"}), 0)(
        prompts=["p"] * 4, completions=responses, question=["q"] * 4)
    # both copies moved from the PM's s = 8 - 4 = +4 to the verdict's +2: A_3 rises by 2 x 2 / 3, A_0 and A_2 fall
    assert rewards["comparison"][3] - rm_only[3] == pytest.approx(4 / 3)
    assert rewards["comparison"][0] - rm_only[0] == pytest.approx(-2 / 3) == rewards["comparison"][2] - rm_only[2]
    # a threshold applies to one copy's score: comparisons route the same pairs as pairs do
    for unit in ("pair", "comparison"):
        judge = StubJudge()
        RoutedPairwiseReward(StubPM(), judge, base.model_copy(update={
            "routing": "uncertainty", "threshold": 1.6, "route_unit": unit}), seed=0)(
            prompts=["p"] * 4, completions=responses, question=["q"] * 4)
        asked[unit] = judge.asked
    assert asked["pair"] == asked["comparison"] == [("q", "aa right", "aaaa"), ("q", "a", "aaaa")]


def test_a_resumed_routed_run_gets_back_its_totals_ledger_and_rng(tmp_path):
    from types import SimpleNamespace

    from transformers import TrainerControl, TrainerState

    from posttrain.judge_cost import CostLedger
    from posttrain.rlhf import ROUTING_STATE, RoutedPairwiseReward, RoutingStateCallback

    def fresh():
        ledger = CostLedger(0.5, 2.0)
        reward = RoutedPairwiseReward(pm=None, judge=SimpleNamespace(ledger=ledger), cfg=None, seed=7)
        return reward, ledger

    reward, ledger = fresh()
    reward.totals.update({"pairs": 48, "routed": 8, "judge_failures": 1})
    ledger.add(300, 40)
    ledger.fail("timeout")
    reward.rng.random()  # the routing RNG has moved on
    (tmp_path / "checkpoint-2").mkdir()
    RoutingStateCallback(reward).on_save(SimpleNamespace(output_dir=str(tmp_path)),
                                              TrainerState(global_step=2), TrainerControl())
    assert (tmp_path / "checkpoint-2" / ROUTING_STATE).is_file()

    again, ledger_again = fresh()
    RoutingStateCallback(again).restore(tmp_path / "checkpoint-2")
    assert dict(again.totals) == {"pairs": 48, "routed": 8, "judge_failures": 1}
    assert ledger_again.state_dict() == ledger.state_dict() and ledger_again.cost == ledger.cost
    assert again.rng.random() == reward.rng.random()  # the same draws continue


def test_a_rank_other_than_0_neither_writes_the_routing_state_nor_needs_a_judge_to_resume(tmp_path):
    """Rank 0 routes every step; another rank's totals are empty. It used to write them too, racing rank 0's into
    the checkpoint, and could mark a checkpoint complete while rank 0 was still saving the model."""
    from types import SimpleNamespace

    from transformers import TrainerControl, TrainerState

    from posttrain.rlhf import ROUTING_STATE, RoutedPairwiseReward, RoutingStateCallback

    other_rank = RoutedPairwiseReward(pm=None, judge=None, cfg=None, seed=7)
    (tmp_path / "checkpoint-2").mkdir()
    RoutingStateCallback(other_rank).on_save(SimpleNamespace(output_dir=str(tmp_path)),
                                             TrainerState(global_step=2, is_world_process_zero=False),
                                             TrainerControl())
    assert not (tmp_path / "checkpoint-2" / ROUTING_STATE).exists()

    (tmp_path / "checkpoint-2" / ROUTING_STATE).write_text(json.dumps(
        {"totals": {"pairs": 48}, "ledger": {"calls": 3}, "rng": rng_state(random.Random(1))}))
    RoutingStateCallback(other_rank).restore(tmp_path / "checkpoint-2")
    assert other_rank.totals["pairs"] == 48


def test_a_verdict_bought_for_one_copy_serves_every_copy_under_route_unit_pair():
    """Responses 0 and 2 are one text, so (0, 3) and (2, 3) are one comparison. A pair budget of 40% of the 5
    judgeable pairs buys 2: (1, 3) and one copy of ('aa right', 'aaaa'). The other copy once kept the PM's +4, so
    the two identical responses got different rewards (3.0 and 3.667); now it takes the verdict too, for free: it
    is neither routed nor a judge call."""
    from posttrain.rlhf import RoutedPairwiseReward

    responses = ["aa right", "a", "aa right", "aaaa"]
    cfg = load_params("configs/params.smoke.yaml").rlhf.model_copy(update={
        "route_score": "uncertainty", "routing": "uncertainty_budget", "budget": 0.4, "route_unit": "pair"})
    judge, metrics = StubJudge(), {}
    reward = RoutedPairwiseReward(StubPM(), judge, cfg, seed=0)
    rewards = reward(prompts=["p"] * 4, completions=responses, question=["q"] * 4,
                     log_metric=lambda k, v: metrics.__setitem__(k, v))
    assert sorted(b for _, _, b in judge.asked) == ["aaaa", "aaaa"] and len(judge.asked) == 2
    assert rewards[0] == pytest.approx(rewards[2])
    # s_01 = s_21 = 8 - 1 (PM), s_02 = 0 (one text), s_03 = s_23 = +2 (the verdict, for both copies)
    rm_only = RoutedPairwiseReward(StubPM(), StubJudge(), cfg.model_copy(update={"routing": "rm_only"}), 0)(
        prompts=["p"] * 4, completions=responses, question=["q"] * 4)
    assert rewards[0] - rm_only[0] == pytest.approx(-2 / 3) == rewards[2] - rm_only[2]  # +4 -> +2 for both copies
    assert reward.totals["routed"] == 2 and reward.totals["judged_comparisons"] == 2
    assert reward.totals["judge_verdicts"] == 2 and reward.totals["shared_verdicts"] == 1
    assert metrics["routing/routed_fraction"] == pytest.approx(2 / 6)


def test_the_routing_curve_reduces_both_orders_variances_as_training_does(tmp_path, monkeypatch):
    """rlhf.uncertainty_reduce max routes the pair whose worse order is most uncertain; the benchmark's curve must
    rank pairs the same way, from both orders' variances (train_rm's benchmark_scores.jsonl), not their mean."""
    import json

    import stages.rlhf_routed as stage

    # pair 0: mean 0.5, max 0.9 (the PM is wrong on it); pair 1: mean 0.6, max 0.6 (the PM is right)
    bench = [{"question": "q0", "a": "x", "b": "y", "label": "B"}, {"question": "q1", "a": "x", "b": "y", "label": "A"}]
    scores = [{"g": 1.0, "var_ab": 0.9, "var_ba": 0.1}, {"g": 1.0, "var_ab": 0.6, "var_ba": 0.6}]
    for name, rows in (("bench.jsonl", bench), ("scores.jsonl", scores)):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(stage, "BENCH", tmp_path / "bench.jsonl")
    monkeypatch.setattr(stage, "SCORES", tmp_path / "scores.jsonl")
    judge = type("Judge", (), {"judge": lambda self, triples: ["B", "A"]})()
    pm = type("PM", (), {"uncertainty": lambda self, g, var: var})()

    at_half = {}
    for reduce in ("mean", "max"):
        rows, _ = stage.evaluate_routing(judge, pm, [0.5], n_seeds=1, reduce=reduce)
        at_half[reduce] = next(r["accuracy"] for r in rows if r["policy"] == "uncertainty_budget")
    assert at_half == {"mean": 0.5, "max": 1.0}


def test_the_routing_summary_gives_random_routings_sample_sd_over_its_seeds():
    # pstdev over 5 seeds read 11% below the seeds' spread that "random std" names
    from posttrain.routing_eval import summarize_curve

    rows = [{"policy": "rm_only", "budget": None, "accuracy": 0.7},
            {"policy": "judge_only", "budget": None, "accuracy": 0.9},
            {"policy": "uncertainty_budget", "budget": 0.1, "accuracy": 0.8}]
    rows += [{"policy": "random", "budget": 0.1, "seed": s, "accuracy": a} for s, a in enumerate([0.72, 0.74, 0.76])]
    ten = summarize_curve(rows)["budgets"]["0.1"]
    assert ten["random_std"] == pytest.approx(0.02) and ten["gap_closed_uncertainty"] == pytest.approx(0.5)
