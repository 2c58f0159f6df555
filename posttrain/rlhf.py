"""Uncertainty-routed online RLHF on TRL's GRPOTrainer (METHODS.md section 3).

GRPO already samples n responses per prompt, takes a clipped policy-gradient step and adds a KL penalty to
the reference policy. What it lacks is the pairwise reward; ``RoutedPairwiseReward`` is that reward
function. Per prompt group it:

1. scores every pair (i, j) with the PM, antisymmetrised: s_ij = (r_ij - r_ji) / 2, u_ij from both orders;
2. routes pairs to the judge by the configured policy (uncertainty threshold or budget, random, rm_only,
   judge_only) and overwrites their s_ij by the verdict (+2 / -2 / 0); a failed judge call keeps the PM's;
3. returns A_i = scale / (n - 1) * sum_j s_ij as the reward of response i.

Because sum_i A_i = 0 within a group, GRPO's group-mean baseline leaves A_i unchanged; with
``scale_rewards="none"`` the advantage GRPO trains on is exactly A_i.

Example:
    >>> reward = RoutedPairwiseReward(pm, judge, params.rlhf, seed=0)               # doctest: +SKIP
    >>> GRPOTrainer(model="models/sft", reward_funcs=reward, args=grpo_config(...))   # doctest: +SKIP
"""
from __future__ import annotations

import random
from collections import defaultdict

import mlflow
import torch
from transformers import TrainerCallback

from posttrain.evaluation import OWN_CHOICE, score_responses
from posttrain.generation import HFGenerator
from posttrain.routing import antisymmetrize, apply_verdicts, pairwise_advantages, route, upper_pairs
from posttrain.trajectories import prompt as open_prompt
from posttrain.uncertainty import calibrated_logit


class RoutedPairwiseReward:
    """A GRPO reward function: pairwise PM preferences, judge verdicts on the routed pairs, RLOO-style sums."""

    __name__ = "routed_pairwise"

    def __init__(self, pm, judge, cfg, seed: int):
        self.pm, self.judge, self.cfg = pm, judge, cfg
        self.rng = random.Random(seed)
        self.totals = defaultdict(float)

    def group(self, question: str, responses: list[str]) -> tuple[torch.Tensor, dict]:
        """Advantages for one prompt's responses, and what routing did."""
        n = len(responses)
        pairs = upper_pairs(n)
        g, var = self.pm.score([(question, responses[i], responses[j]) for i, j in pairs], self.cfg.pm_batch_size)
        _, u_pair = calibrated_logit(g, var, self.pm.lam)
        r, u = torch.zeros(n, n), torch.ones(n, n)
        for (i, j), gij, uij in zip(pairs, g, u_pair):
            r[i, j], r[j, i], u[i, j], u[j, i] = gij, -gij, uij, uij  # g is already antisymmetric
        s, u = antisymmetrize(r, u, self.cfg.uncertainty_reduce)
        routed = route(u, self.cfg.routing, self.cfg.threshold, self.cfg.budget, self.rng)
        verdicts = self.judge.judge([(question, responses[i], responses[j]) for i, j in routed]) if routed else []
        judged = {p: v for p, v in zip(routed, verdicts) if v is not None}
        return pairwise_advantages(apply_verdicts(s, judged), self.cfg.advantage_scale), {
            "pairs": len(pairs), "routed": len(routed), "judge_failures": len(routed) - len(judged)}

    def __call__(self, prompts, completions, question, log_metric=None, **_) -> list[float]:
        groups: dict[str, list[int]] = defaultdict(list)
        for k, p in enumerate(prompts):
            groups[p].append(k)
        rewards = [0.0] * len(completions)
        step = defaultdict(float)
        for idx in groups.values():
            adv, info = self.group(question[idx[0]], [completions[k] for k in idx])
            for k, a in zip(idx, adv.tolist()):
                rewards[k] = a
            for key, v in info.items():
                step[key] += v
        for key, v in step.items():
            self.totals[key] += v
        if log_metric is not None:
            ledger = self.judge.ledger.as_metrics("judge/")
            log_metric("routing/routed_fraction", step["routed"] / max(step["pairs"], 1))
            log_metric("routing/judge_failures", step["judge_failures"])
            for key in ("judge/calls", "judge/cost", "judge/cache_hits", "judge/failures"):
                log_metric(f"{key}_total", ledger[key])
        return rewards


class DevAccuracyCallback(TrainerCallback):
    """Greedy own-choice accuracy of the policy on dev questions every ``every`` steps, into MLflow."""

    def __init__(self, records: list[dict], tokenizer, every: int, max_new_tokens: int, sandbox_limits, workers: int):
        self.records, self.tokenizer, self.every = records, tokenizer, every
        self.max_new_tokens, self.limits, self.workers = max_new_tokens, sandbox_limits, workers
        self.history: list[tuple[int, float]] = []

    def accuracy(self, model) -> float:
        was_training = model.training
        gen = HFGenerator(model, self.tokenizer, batch_size=64, max_new_tokens=self.max_new_tokens)
        texts = [c.text for c in gen.generate([open_prompt(r["question"]) for r in self.records], progress=False)]
        model.train(was_training)
        rows = score_responses(self.records, [OWN_CHOICE] * len(texts), texts, self.limits, self.workers)
        return sum(r["correct"] for r in rows) / len(rows)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every == 0 or state.global_step == state.max_steps:
            acc = self.accuracy(model)
            self.history.append((state.global_step, acc))
            if mlflow.active_run() is not None:
                mlflow.log_metric("dev_accuracy", acc, step=state.global_step)
            print(f"rlhf_routed: step {state.global_step} dev accuracy {acc:.3f}")
