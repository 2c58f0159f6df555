"""The params sections of the online RL stages: the judge, ``rlhf`` (routed RLHF) and ``rlvr`` (AR3PO, GRPO, DAPO).
Every field typed and documented in one line, as in ``posttrain.params_schema``, whose ``Params`` holds them.
"""
from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from posttrain.params_fields import DEEPSPEED_DOC, DeepSpeedConfig, Section, http_url


JudgeFault = Literal["http_500", "http_429", "timeout", "malformed_json", "truncated_json", "no_verdict",
                     "connection_reset"]


def env_var_name(name: str | None) -> str | None:
    """The key's variable must be named like one: the key itself written here was logged to MLflow as this param
    (and recorded in dvc.lock), and no key was sent."""
    if name is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        # not quoted: it may be the key
        raise ValueError("expected the name of an environment variable (letters, digits and _, e.g. OPENAI_API_KEY), "
                         "not the key itself; null = no key")
    return name


class JudgeParams(Section):
    """The pairwise LLM judge (OpenAI chat-completions protocol) and the local judge service."""

    base_url: Annotated[str | None, AfterValidator(http_url)] = Field(
        description="an OpenAI-compatible endpoint (e.g. http://host:8000/v1); null = start the local judge service")
    model: str = Field(min_length=1, description="model name sent to the endpoint (and part of the cache key)")
    api_key_env: Annotated[str | None, AfterValidator(env_var_name)] = Field(
        description="environment variable holding the API key (never logged)")
    backend: Literal["verifier", "hf"] = Field(description="local service: task verifier or a local HF model")
    hf_model: str = Field(description="local service, hf backend: the model directory or hub id")
    criteria: str = Field(min_length=1, description="what the judge is told to compare")
    both_orders: bool = Field(description="ask (A, B) and (B, A); disagreement counts as a tie")
    temperature: float = Field(ge=0, description="judge sampling temperature")
    max_tokens: int | None = Field(ge=1, description="the most tokens one answer may hold, reasoning included (sent as "
                                                     "max_tokens: bounds a call's cost); null = the server's limit")
    concurrency: int = Field(ge=1, description="requests in flight at once")
    requests_per_minute: float = Field(gt=0, description="request starts per minute, at most")
    timeout_s: float = Field(gt=0, description="per-request timeout")
    max_retries: int = Field(ge=0, description="retries after a failed request, then fall back to the RM")
    backoff_s: float = Field(ge=0, description="first retry wait (exponential with jitter after)")
    max_backoff_s: float = Field(ge=0, description="longest wait between retries of our own choosing")
    max_retry_after_s: float = Field(ge=0, description="longest Retry-After honoured; a 429 asking for longer fails "
                                                       "the pair at once")
    price_in_per_1k: float = Field(ge=0, description="price per 1000 prompt tokens")
    price_out_per_1k: float = Field(ge=0, description="price per 1000 completion tokens")
    cache: str = Field(min_length=1, description="SQLite verdict cache (kept across runs: a re-run never pays twice)")
    latency_s: float = Field(ge=0, description="local service: added latency per request")
    faults: dict[JudgeFault, float] = Field(description="local service: fault -> probability per request (http_500, "
                                                        "http_429, timeout, malformed_json, truncated_json, "
                                                        "no_verdict, connection_reset)")
    mistake_rate: float = Field(ge=0, le=1, description="local verifier service: share of pairs it judges wrong, a "
                                                        "fixed draw per pair (a fallible judge; DeepSeek-R1 errs on "
                                                        "0.077 of RewardBench)")

    @field_validator("faults")
    @classmethod
    def _probabilities(cls, v: dict[str, float]) -> dict[str, float]:
        if any(not 0 <= p <= 1 for p in v.values()) or sum(v.values()) > 1:
            raise ValueError("each probability must be in [0, 1] and they must sum to at most 1")
        return v

    @model_validator(mode="after")
    def _backoff_order(self):
        if self.max_backoff_s < self.backoff_s:  # tenacity would wait max_backoff_s from the first retry on
            raise ValueError(f"max_backoff_s ({self.max_backoff_s}) is below backoff_s ({self.backoff_s}), the first wait")
        return self


class OnlinePolicyParams(Section):
    """What every online policy-gradient stage (TRL GRPOTrainer) shares."""

    prompts_per_step: int = Field(ge=1, description="prompts (groups) per optimizer step and per process")
    max_steps: int = Field(ge=1, description="optimizer steps")
    learning_rate: float = Field(gt=0, description="policy learning rate")
    kl_beta: float = Field(ge=0, description="KL penalty to the reference (SFT) policy")
    clip_epsilon: float = Field(gt=0, description="PPO-style ratio clip")
    temperature: float = Field(gt=0, description="sampling temperature of the policy")
    max_new_tokens: int = Field(ge=1, description="response length cap")
    dev_every: int = Field(ge=1, description="dev accuracy every this many steps")
    n_dev: int = Field(ge=1, description="dev questions for that accuracy")
    save_steps: int = Field(ge=1, description="checkpoint every this many steps (resume point)")
    deepspeed: DeepSpeedConfig = Field(description=DEEPSPEED_DOC)
    vllm: Literal["colocate", "server"] | None = Field(
        description="rollouts through TRL's vLLM integration (GPUs): colocate = an engine in the trainer's process, "
                    "server = `trl vllm-serve` at vllm_server_url; null = HF generate")
    vllm_server_url: str = Field(description="vllm: server mode: the `trl vllm-serve` address, weights synced to it")

    @field_validator("vllm_server_url")
    @classmethod
    def _server_address(cls, v: str, info: ValidationInfo) -> str:
        # read in server mode only, where TRL's client cannot reach an address such as localhost:8000 (read as the
        # scheme 'localhost'): it retries for vllm_server_timeout (240 s), then raises ConnectionError
        return http_url(v) if info.data.get("vllm") == "server" else v


class RlhfParams(OnlinePolicyParams):
    """Uncertainty-routed online RLHF (the `rlhf_routed` stage), on TRL's GRPOTrainer."""

    routing: Literal["uncertainty", "uncertainty_budget", "random", "rm_only", "judge_only"] = Field(
        description="which pairs the judge decides")
    threshold: float = Field(ge=0, description="uncertainty: route pairs whose route_score is above this: u_ij "
                                               "(train_rm.uncertainty_score), or with expected_gain the gain a verdict "
                                               "is expected to bring (0 to 4; a verdict on an even pair brings 2)")
    budget: float = Field(ge=0, le=1, description="uncertainty_budget / random: share of each step's "
                                                   "non-identical pairs judged (a share of judge_only's cost)")
    uncertainty_reduce: Literal["mean", "max"] = Field(description="u_ij from the two orders: mean or max")
    same_answer: Literal["judge", "skip", "tie"] = Field(
        description="pairs whose final answers agree: routed like any other (judge), never routed so the PM decides "
                    "(skip), or scored a tie without a call (tie: the judge's first criterion cannot split them)")
    route_score: Literal["uncertainty", "expected_gain"] = Field(
        description="what uncertainty routing ranks (or thresholds) pairs by: the PM's uncertainty u_ij (METHODS.md), "
                    "or how far a verdict is expected to raise s_ij toward the right response (expected_gain: which "
                    "side is right from the PM's calibrated probability and the shares of the two final answers among "
                    "the prompt's responses, times the chance the pair is decisive, from those shares too)")
    route_unit: Literal["pair", "comparison"] = Field(
        description="what a budget counts and the policy picks: pairs (METHODS.md), or distinct comparisons (a group "
                    "holding one response twice has several pairs that are one judge call; a budget is then a share "
                    "of the calls judge_only pays, and a comparison ranks by the sum of its copies' scores)")
    advantage_scale: float = Field(gt=0, description="A_i = scale / (n - 1) * sum_j s_ij")
    n_responses: int = Field(ge=2, description="responses sampled per prompt (GRPO's num_generations)")
    pm_batch_size: int = Field(ge=1, description="pairs per PM scoring batch")
    eval_budgets: list[Annotated[float, Field(ge=0, le=1)]] = Field(
        min_length=1, description="routing evaluation: judge budgets on the benchmark (shares of its pairs)")
    eval_seeds: int = Field(ge=1, description="routing evaluation: seeds of random routing")


class RlvrParams(OnlinePolicyParams):
    """RLVR with the task verifier as reward (the `rlvr_ar3po` stage): AR3PO, or GRPO / DAPO as baselines."""

    algo: Literal["ar3po", "grpo", "dapo"] = Field(description="rollout: adaptive + reuse, fixed n, or dynamic sampling")
    n_responses: int = Field(ge=2, description="grpo / dapo: responses per prompt")
    stages: int = Field(ge=1, description="ar3po: S, rollout stages for prompts still without a correct response")
    k: int = Field(ge=1, description="ar3po: responses per active prompt per stage (k = 1: one at a time)")
    buffer_cap: int = Field(ge=1, description="ar3po: correct responses kept per prompt in the replay buffer")
    buffer_seed: Literal["none", "reference"] = Field(
        description="ar3po: the replay buffer before step 1: empty, or each training question's reference solution "
                    "(verified); reuse then fires on every all-wrong group, not only on questions seen before")
    zero_advantage_groups: Literal["keep", "drop"] = Field(
        description="ar3po / grpo: groups whose rewards are all equal stay in the batch (KL-penalty tokens only, "
                    "as TRL's GRPO) or leave it, so the loss is normalised over the groups with a policy gradient "
                    "(dapo's batch holds only those)")
    max_rounds: int = Field(ge=1, description="dapo: generation rounds per step at most (the batch may stay short)")
    num_iterations: int = Field(ge=1, description="optimizer steps on each rollout (TRL's num_iterations, GRPO's mu): "
                                                  "a rollout every mu steps, the later steps clipped against the "
                                                  "policy that sampled it; max_steps counts optimizer steps")
    lr_schedule: Literal["linear", "constant"] = Field(
        description="the learning rate over max_steps: linear decay to 0 (TRL's default, so a longer run is another "
                    "schedule, not a continuation) or constant at learning_rate")
    n_prompts: int | None = Field(ge=1, description="train on the first n training questions for several epochs "
                                                   "(null = all); reuse needs prompts that come back")

    @model_validator(mode="after")
    def _checkpoints_between_rollouts(self):
        # TRL keeps a rollout's batch in memory for its num_iterations steps; resumed from a checkpoint inside that
        # span it would roll out anew, and the resumed run would train on other responses than the one it resumes
        if self.save_steps % self.num_iterations:
            raise ValueError(f"save_steps ({self.save_steps}) must be a multiple of num_iterations "
                             f"({self.num_iterations}), so every checkpoint falls between two rollouts")
        return self
