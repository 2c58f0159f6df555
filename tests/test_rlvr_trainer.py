"""RLVRTrainer (TRL GRPOTrainer with the rollout overridden) on a tiny scratch model: the batch holds only the
generated responses (a reused one shapes the advantages, never the gradient), every algo trains, and the
replay buffer and totals survive a checkpoint."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import TrainerCallback

from posttrain.params import load_params
from posttrain.policy_accuracy import DevAccuracyCallback
from posttrain.checkpoints import last_complete_checkpoint
from posttrain.rlvr import (ROLLOUT_STATE, RLVRTrainer, VerifierReward, reference_responses, rlvr_config,
                            vllm_importance_ratio)
from posttrain.rollout import ReplayBuffer, Response, adaptive_rollout
from posttrain.sandbox import SandboxLimits
from posttrain.trajectories import prompt
from tiny_model import tiny_scratch_model

SMOKE = Path(__file__).resolve().parents[1] / "configs" / "params.smoke.yaml"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_scratch_model(tmp_path_factory.mktemp("tiny_policy"), n_problems=12, seed=4)


def make_trainer(tiny, out, algo: str, callbacks=None, **overrides) -> RLVRTrainer:
    cfg = load_params(SMOKE).rlvr.model_copy(update={"algo": algo, "max_new_tokens": 16, "prompts_per_step": 2,
                                                     "max_steps": 2, "save_steps": 1, **overrides})
    dataset = Dataset.from_list([{"prompt": prompt(r["question"]), "difficulty": r["difficulty"]} for r in tiny.records])
    reward = VerifierReward({prompt(r["question"]): r for r in tiny.records}, SandboxLimits(cpu_seconds=1, wall_seconds=3))
    args = rlvr_config(cfg, out, seed=0)
    args.report_to = []
    return RLVRTrainer(model=tiny.path, reward_funcs=reward, args=args, train_dataset=dataset,
                       processing_class=tiny.tok, callbacks=callbacks, rlvr=cfg, seed=0)


def test_reused_response_shapes_advantages_but_is_not_in_the_batch(tiny, tmp_path):
    trainer = make_trainer(tiny, tmp_path, "ar3po", stages=2, k=2)
    hard, easy = prompt(tiny.records[0]["question"]), prompt(tiny.records[1]["question"])
    ids = tiny.tok(hard, add_special_tokens=False)["input_ids"]
    trainer.buffer.add(Response(hard, "old right answer", 1.0, 3, payload=(ids, [5, 6, 7])))

    def sample(prompts, k):  # "hard" is never solved now, "easy" always
        return [[Response(p, "x", float(p == easy), 2, (tiny.tok(p, add_special_tokens=False)["input_ids"], [8, 9]))
                 for _ in range(k)] for p in prompts]
    trainer._sample = sample
    batch = trainer._generate_and_score_completions([{"prompt": hard, "difficulty": 1}, {"prompt": easy, "difficulty": 2}])
    # hard: 2 stages x 2 generated, one replaced by the reused response -> 3 in the batch; easy: 2 (left at stage 1)
    assert batch["completion_ids"].shape[0] == 3 + 2
    assert not any(row[:3].tolist() == [5, 6, 7] for row in batch["completion_ids"])  # the reused one is absent
    adv = batch["advantages"].tolist()
    assert adv[:3] == pytest.approx([-0.5] * 3, rel=1e-3)  # group [1, 0, 0, 0]: (0 - 0.25) / 0.5
    assert adv[3:] == [0.0, 0.0]  # "easy": all right, no signal
    assert "ref_per_token_logps" in batch and batch["ref_per_token_logps"].shape == batch["completion_ids"].shape
    assert trainer.totals["buffer_hits"] == 1 and trainer.totals["responses"] == 4 + 2


def test_dropped_zero_advantage_groups_leave_the_batch_and_its_token_count(tiny, tmp_path):
    trainer = make_trainer(tiny, tmp_path, "grpo", n_responses=2, zero_advantage_groups="drop")
    mixed, easy = prompt(tiny.records[0]["question"]), prompt(tiny.records[1]["question"])

    def sample(prompts, k):  # "mixed" gets one right and one wrong (3 tokens each), "easy" two right (2 tokens)
        ids = {p: tiny.tok(p, add_special_tokens=False)["input_ids"] for p in prompts}
        return [[Response(p, "x", float(p == easy or i == 0), 3 - (p == easy), (ids[p], [8, 9, 10][:3 - (p == easy)]))
                 for i in range(k)] for p in prompts]
    trainer._sample = sample
    batch = trainer._generate_and_score_completions([{"prompt": mixed, "difficulty": 1}, {"prompt": easy, "difficulty": 2}])
    assert batch["completion_ids"].shape[0] == 2 and int(batch["num_items_in_batch"]) == 2 * 3  # "mixed" only
    assert batch["advantages"].tolist() == pytest.approx([0.7071, -0.7071], rel=1e-3)
    assert trainer.totals["responses"] == 4 and trainer.totals["zero_advantage_prompts"] == 1  # the census counts all
    kept = make_trainer(tiny, tmp_path / "keep", "grpo", n_responses=2)
    kept._sample = sample
    assert int(kept._generate_and_score_completions([{"prompt": mixed}, {"prompt": easy}])["num_items_in_batch"]) == 10


def test_two_processes_roll_out_one_schedule_and_train_on_their_share(tmp_path):
    """Under a multi-process launch the step's rollout spans both ranks' prompts: the same generation calls, of the
    same size, on every rank (TRL's gathers need them), the same totals, and each rank trains on its share."""
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(Path(__file__).parent / "rlvr_two_rank_run.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    # stage 1: one prompt each; stage 2: "hard" alone is unsolved, so rank 0 generates it and rank 1 a dropped copy
    assert r0["calls"] == [[True], [False]] and r1["calls"] == [[False], [False]]
    assert r0["totals"] == r1["totals"] and r0["totals"]["responses"] == 2 + 4 and r0["totals"]["prompts"] == 2
    # each rank trains on its share: "easy" (all right, advantage 0) on rank 0, "hard"'s 4 failures on rank 1, the
    # loss normalised by the whole step's tokens (6 responses x 2 tokens) on both; rank 0's 2 rows are padded to 4
    # fully masked ones (TRL gathers per-sequence figures, which needs as many rows on every rank)
    assert (r0["rows"], r1["rows"]) == (4, 4) and (r0["masked_rows"], r1["masked_rows"]) == (2, 0)
    assert r0["advantages"] == [0.0] * 4
    assert r0["num_items_in_batch"] == r1["num_items_in_batch"] == 12


def test_vllm_importance_ratio_by_hand():
    trainer = torch.tensor([[-1.0, -2.0, -3.0]])
    sampling = torch.tensor([[-2.0, float("nan"), -1.0]])  # vLLM gave no log-prob for the second token
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the third is padding
    e = torch.e
    assert vllm_importance_ratio(trainer, sampling, mask, "token_truncate", None, 2.0)[0].tolist() == pytest.approx(
        [2.0, 1.0, 1.0])  # e clipped to 2; NaN -> no correction; padding -> 1
    assert vllm_importance_ratio(trainer, sampling, mask, "token_mask", None, 3.0)[0].tolist() == pytest.approx(
        [e, 1.0, 1.0])
    assert vllm_importance_ratio(trainer, sampling, mask, "token_mask", None, 2.0)[0].tolist() == pytest.approx(
        [0.0, 1.0, 1.0])  # outside [-inf, 2]: masked out
    assert vllm_importance_ratio(trainer, sampling, mask, "sequence_truncate", 0.5, None)[0].tolist() == pytest.approx(
        [e])  # one ratio per sequence: exp of the summed differences


@pytest.mark.parametrize("sampler_gap, expected", [(0.0, 1.0), (50.0, 3.0)])
def test_vllm_rollouts_carry_the_importance_ratio_trls_loss_needs(tiny, tmp_path, sampler_gap, expected):
    """With rlvr.vllm, TRL's loss weighs each token by the trainer's probability over vLLM's; the overridden rollout
    must hand it over (without it TRL's loss failed on KeyError 'importance_sampling_ratio')."""
    trainer = make_trainer(tiny, tmp_path, "grpo", n_responses=2)
    trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True  # as TRL sets them with use_vllm
    trainer.vllm_importance_sampling_mode, trainer.vllm_importance_sampling_clip_max = "token_truncate", 3.0
    p = prompt(tiny.records[0]["question"])
    p_ids, c_ids = tiny.tok(p, add_special_tokens=False)["input_ids"], [8, 9, 10]
    with torch.no_grad():  # the trainer's own log-probs of the sampled tokens; vLLM's are lower by sampler_gap
        logits = trainer.model(torch.tensor([p_ids + c_ids])).logits[0, len(p_ids) - 1:-1]
        own = torch.log_softmax(logits, -1)[torch.arange(3), torch.tensor(c_ids)].tolist()

    def sample(prompts, k):
        return [[Response(q, "x", float(i == 0), 3, (p_ids, c_ids, [x - sampler_gap for x in own]))
                 for i in range(k)] for q in prompts]
    trainer._sample = sample
    batch = trainer._generate_and_score_completions([{"prompt": p, "difficulty": 1}])
    assert batch["importance_sampling_ratio"].shape == batch["completion_ids"].shape
    assert batch["importance_sampling_ratio"].flatten().tolist() == pytest.approx([expected] * 6, rel=1e-3)
    assert torch.isfinite(trainer.compute_loss(trainer.model, batch))  # TRL's loss takes the batch as its own


def test_reference_responses_seed_the_buffer_with_verified_solutions_only(tiny):
    reward = VerifierReward({prompt(r["question"]): r for r in tiny.records},
                            SandboxLimits(cpu_seconds=1, wall_seconds=3))
    wrong = {**tiny.records[0], "answer": tiny.records[0]["answer"] + 1}  # its reference solution now fails the check
    reward.records[prompt(wrong["question"])] = wrong
    seeds = reference_responses(tiny.records, reward, tiny.tok)
    assert {r.prompt for r in seeds} == {prompt(r["question"]) for r in tiny.records[1:]}
    assert all(r.reward == 1.0 and r.text.startswith(" cot\n") and r.n_tokens > 0 for r in seeds)
    # seeded, an all-wrong group takes one of them on the question's first visit
    buffer = ReplayBuffer(cap=2)
    for r in seeds:
        buffer.add(r)
    never_right = lambda prompts, k: [[Response(p, "x", 0.0, 2) for _ in range(k)] for p in prompts]
    groups, stats = adaptive_rollout([seeds[0].prompt], stages=2, k=2, sample=never_right, buffer=buffer)
    assert stats.buffer_hits == 1 and [r.reward for r in groups[seeds[0].prompt]] == [0.0, 0.0, 0.0, 1.0]


class LoggedTotals(TrainerCallback):
    """Per logged step: the training seconds MLflow got, and the trainer's running total at that point."""

    def __init__(self):
        self.trainer, self.seen = None, []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if "rollout/total_training_seconds" in logs:
            self.seen.append((logs["rollout/total_training_seconds"], self.trainer.totals["training_seconds"]))


@pytest.mark.parametrize("algo", ["grpo", "dapo", "ar3po"])
def test_every_algo_trains_and_checkpoints_its_rollout_state(tiny, tmp_path, algo):
    logged = LoggedTotals()
    trainer = make_trainer(tiny, tmp_path, algo, callbacks=[logged], n_responses=4, stages=2, k=2, max_rounds=2)
    logged.trainer = trainer
    # an untrained model never answers right: a stub reward (odd length) gives the groups something to learn
    trainer.verifier = lambda prompts, completions: [float(len(c) % 2) for c in completions]
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2 and trainer.totals["responses"] > 0
    # each step logs the total as it stands (it was once the mean of the previous step's and this one's)
    assert len(logged.seen) == 2 and all(got == pytest.approx(total) for got, total in logged.seen)
    state = tmp_path / "checkpoint-2" / ROLLOUT_STATE
    assert state.exists()
    resumed = make_trainer(tiny, tmp_path / "again", algo)
    # a fresh trainer's buffer and prompt sampler would equal a run's that never used them (grpo's, dapo's buffer):
    # moved on first, they must be overwritten by the checkpoint's
    resumed.buffer.add(Response(prompt(tiny.records[0]["question"]), "not in the checkpoint", 1.0, 1))
    resumed.buffer.rng.random()
    resumed.prompt_rng.random()
    resumed.load_rollout_state(tmp_path / "checkpoint-2")
    assert resumed.totals == trainer.totals and resumed.curve == trainer.curve
    assert resumed.buffer.state_dict() == json.loads(json.dumps(trainer.buffer.state_dict()))
    assert resumed.buffer.rng.getstate() == trainer.buffer.rng.getstate()
    assert resumed.prompt_rng.getstate() == trainer.prompt_rng.getstate()
    assert trainer.curve[-1]["responses"] == trainer.totals["responses"]
    assert trainer.totals["zero_advantage_prompts"] < trainer.totals["prompts"]
    assert trainer.totals["zero_advantage_unsolved_prompts"] <= trainer.totals["zero_advantage_prompts"]
    assert 0 < trainer.totals["signal_responses"] <= trainer.totals["responses"]
    assert {"zero_advantage_unsolved_share", "signal_share"} <= set(trainer.curve[-1])
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())


def test_ar3po_with_one_response_a_stage_rolls_out_each_prompt_once_a_stage(tiny, tmp_path):
    # TRL needs num_generations >= 2, so k = 1 runs under a sampler that repeats each prompt: the rollout must still
    # see prompts_per_step distinct prompts and give each at most one response a stage
    trainer = make_trainer(tiny, tmp_path, "ar3po", k=1, stages=3, buffer_seed="none")
    calls = []
    sample = trainer._sample_across_processes

    def counted(prompts, k):
        calls.append((list(prompts), k))
        return sample(prompts, k)
    trainer._sample_across_processes = counted
    trainer.verifier = lambda prompts, completions: [float(len(c) % 2) for c in completions]
    trainer.train()
    assert trainer.state.global_step == 2 and trainer.totals["prompts"] == 2 * 2  # prompts_per_step 2, 2 steps
    assert calls and all(k == 1 and len(prompts) == len(set(prompts)) for prompts, k in calls)
    assert trainer.totals["responses"] == sum(len(prompts) for prompts, _ in calls) <= 2 * 2 * 3


def test_num_iterations_trains_mu_steps_on_each_rollout_against_its_sampling_policy(tiny, tmp_path):
    """rlvr.num_iterations 2: a rollout every other optimizer step; its batch carries the sampling policy's log-probs,
    so TRL's second step clips its ratio against them (without them that ratio is 1 and nothing is clipped); the cost
    after a step is its last rollout's."""
    trainer = make_trainer(tiny, tmp_path, "grpo", n_responses=2, num_iterations=2, max_steps=4)
    trainer.verifier = lambda prompts, completions: [float(len(c) % 2) for c in completions]
    rollouts, generate = [], trainer._generate_and_score_completions

    def recorded(inputs):
        batch = generate(inputs)
        rollouts.append((trainer.state.global_step, batch))
        return batch
    trainer._generate_and_score_completions = recorded
    trainer.train()
    assert trainer.state.global_step == 4 and [step for step, _ in rollouts] == [0, 2]
    for _, batch in rollouts:  # taken from the policy that sampled it, before any step on it
        assert batch["old_per_token_logps"].shape == batch["completion_ids"].shape
    assert [c["step"] for c in trainer.curve] == [1, 3]
    assert trainer.cost_at(2) == {**trainer.curve[0], "step": 2} and trainer.cost_at(0) == {}
    assert trainer.cost_at(4)["responses"] == trainer.totals["responses"] == 2 * 2 * 2  # 2 rollouts x 2 prompts x 2


@pytest.mark.parametrize("schedule", ["linear", "constant"])
def test_lr_schedule_decays_to_zero_or_holds_the_learning_rate(tiny, tmp_path, schedule):
    """rlvr.lr_schedule: linear (TRL's default) steps the rate down toward 0 by max_steps; constant keeps it."""
    trainer = make_trainer(tiny, tmp_path, "grpo", n_responses=2, max_steps=3, lr_schedule=schedule)
    trainer.train()
    rates = [log["learning_rate"] for log in trainer.state.log_history if "learning_rate" in log]
    peak = trainer.args.learning_rate
    assert len(rates) == 3
    if schedule == "constant":
        assert rates == [peak] * 3
    else:
        assert rates == pytest.approx([peak, peak * 2 / 3, peak / 3])


def test_the_rollout_state_marker_is_written_after_the_other_callbacks_files(tiny, tmp_path):
    marker_already_there = []

    class Probe(TrainerCallback):  # stands for the dev-history callback the stage passes in
        def on_save(self, args, state, control, **kwargs):
            checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            marker_already_there.append((checkpoint / ROLLOUT_STATE).exists())

    trainer = make_trainer(tiny, tmp_path, "grpo", callbacks=[Probe()], n_responses=2, max_steps=1)
    trainer.verifier = lambda prompts, completions: [float(len(c) % 2) for c in completions]
    trainer.train()
    assert marker_already_there == [False] and (tmp_path / "checkpoint-1" / ROLLOUT_STATE).exists()


def test_resume_skips_a_checkpoint_killed_before_its_rollout_state(tmp_path):
    for step, complete in ((1, True), (2, True), (3, False)):
        (tmp_path / f"checkpoint-{step}").mkdir()
        if complete:
            (tmp_path / f"checkpoint-{step}" / ROLLOUT_STATE).write_text("{}")
    assert last_complete_checkpoint(tmp_path, marker=ROLLOUT_STATE) == str(tmp_path / "checkpoint-2")
    assert last_complete_checkpoint(tmp_path / "missing", marker=ROLLOUT_STATE) is None


@pytest.mark.parametrize("stage", ["rlhf", "rlvr"])
def test_a_vllm_server_urls_credentials_never_reach_the_params_mlflow_logs(stage, tmp_path):
    # transformers' MLflow callback logs the training arguments' to_dict(), which hides only *_token fields
    from posttrain.rlhf import grpo_config
    from posttrain.rlvr import rlvr_config

    url = "http://user:SECRET@vllm.internal:8000?key=SECRET2"
    cfg = getattr(load_params(SMOKE), stage).model_copy(update={"vllm": "server", "vllm_server_url": url})
    config = (grpo_config if stage == "rlhf" else rlvr_config)(cfg, tmp_path, 0)
    logged = json.dumps(config.to_dict(), default=str)
    assert "SECRET" not in logged and "vllm.internal:8000" in logged
    assert config.vllm_server_base_url == url  # TRL's client still connects with them


def test_evaluating_dev_during_training_does_not_change_what_the_policy_learns(tiny, tmp_path):
    def train(out, callbacks):
        trainer = make_trainer(tiny, out, "grpo", callbacks=callbacks, n_responses=4)
        trainer.verifier = lambda prompts, completions: [float(len(c) % 2) for c in completions]
        trainer.train()
        return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}

    dev = DevAccuracyCallback(tiny.records[:4], tiny.tok, every=1, max_new_tokens=8, workers=1, label="test",
                              sandbox_limits=SandboxLimits(cpu_seconds=1, wall_seconds=3))
    plain, evaluated = train(tmp_path / "plain", []), train(tmp_path / "evaluated", [dev])
    assert [step for step, _ in dev.history] == [1, 2]
    # the evaluation after step 1 generates with its own seed; step 2 must sample as it would have without it
    assert all(torch.equal(plain[n], evaluated[n]) for n in plain)
