"""A resumed RL run sees the prompts an uninterrupted one does, step for step. TRL's RepeatSampler drew each epoch's
order from a generator seeded once, and transformers resumes at the checkpoint's epoch without replaying the ones
before, so a run resumed after its first epoch replayed epoch 0's order. Both GRPO trainers (RLVR's and routed
RLHF's) now shuffle pass e as a function of (seed, e) only (``posttrain.prompt_order``)."""
import shutil
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import TrainerCallback
from trl.trainer.utils import RepeatSampler

from posttrain import rlhf, rlvr
from posttrain.prompt_order import EpochSampler
from posttrain.params import load_params
from posttrain.sandbox import SandboxLimits
from posttrain.trajectories import prompt
from tiny_model import tiny_scratch_model

SMOKE = Path(__file__).resolve().parents[1] / "configs" / "params.smoke.yaml"
STEPS = 6  # 4 prompts, 2 a step: 3 epochs of 2 steps


def test_pass_e_is_an_uninterrupted_repeat_samplers_pass_e_whoever_numbers_it():
    args = dict(data_source=range(7), mini_repeat_count=2, batch_size=3, repeat_count=2, seed=5)
    reference = RepeatSampler(**args)
    uninterrupted = [list(reference) for _ in range(4)]  # TRL's orders: the same run's orders as before the fix
    assert len({tuple(o) for o in uninterrupted}) == 4
    new = EpochSampler(**args)
    assert [list(new) for _ in range(4)] == uninterrupted  # unnumbered passes advance, as RepeatSampler's did
    for epoch in (3, 1, 0, 2):  # numbered, a pass is the epoch's whatever came before (a resumed run)
        fresh = EpochSampler(**args)
        fresh.set_epoch(epoch)
        assert list(fresh) == uninterrupted[epoch]
        new.set_epoch(epoch)
        assert list(new) == uninterrupted[epoch]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_scratch_model(tmp_path_factory.mktemp("tiny_policy"), n_problems=4, seed=4)


def odd_length(completions, **_):
    """A stub reward: an untrained model never answers right."""
    return [float(len(c) % 2) for c in completions]


def make_trainer(kind: str, tiny, out: Path, callbacks=()):
    dataset = Dataset.from_list([{"prompt": prompt(r["question"]), "difficulty": r["difficulty"]} for r in tiny.records])
    params = load_params(SMOKE)
    common = {"prompts_per_step": 2, "max_steps": STEPS, "save_steps": 1, "max_new_tokens": 8}
    if kind == "rlvr":
        cfg = params.rlvr.model_copy(update={**common, "algo": "grpo", "n_responses": 2})
        args = rlvr.rlvr_config(cfg, out, seed=0)
        args.report_to = []
        reward = rlvr.VerifierReward({prompt(r["question"]): r for r in tiny.records}, SandboxLimits())
        trainer = rlvr.RLVRTrainer(model=tiny.path, reward_funcs=reward, args=args, train_dataset=dataset,
                                   processing_class=tiny.tok, callbacks=list(callbacks), rlvr=cfg, seed=0)
        trainer.verifier = lambda prompts, completions: odd_length(completions)
    else:
        cfg = params.rlhf.model_copy(update={**common, "n_responses": 2})
        args = rlhf.grpo_config(cfg, out, seed=0)
        args.report_to = []
        trainer = rlhf.RoutedGRPOTrainer(model=tiny.path, reward_funcs=odd_length, args=args, train_dataset=dataset,
                                         processing_class=tiny.tok, callbacks=list(callbacks))
    seen = []  # each step's prompts: the trainers generate once a step, for the step's batch
    generate = trainer._generate_and_score_completions

    def record(inputs):
        seen.append(sorted({x["prompt"] for x in inputs}))
        return generate(inputs)
    trainer._generate_and_score_completions = record
    return trainer, seen


class StopAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = state.global_step == self.step


@pytest.mark.parametrize("kind", ["rlvr", "rlhf"])
def test_a_run_resumed_after_its_first_epoch_sees_the_uninterrupted_runs_prompts(kind, tiny, tmp_path):
    torch.set_num_threads(1)
    full, seen_full = make_trainer(kind, tiny, tmp_path / "full")
    full.train()
    assert len(seen_full) == STEPS and len({p for step in seen_full for p in step}) == 4
    assert seen_full[2:4] != seen_full[:2]  # epoch 1's order is not epoch 0's: the check below can fail
    killed, seen_killed = make_trainer(kind, tiny, tmp_path / "killed", callbacks=[StopAt(3)])
    killed.train()
    assert seen_killed == seen_full[:3]
    # checkpoint-2 ends epoch 0 (resume starts epoch 1 afresh); checkpoint-3 is mid-epoch 1 (resume skips a batch)
    for step in (2, 3):
        out = tmp_path / f"resumed-{step}"
        shutil.copytree(tmp_path / "killed" / f"checkpoint-{step}", out / f"checkpoint-{step}")
        resumed, seen = make_trainer(kind, tiny, out)
        if kind == "rlvr":
            resumed.load_rollout_state(out / f"checkpoint-{step}")
        resumed.train(resume_from_checkpoint=str(out / f"checkpoint-{step}"))
        assert seen == seen_full[step:], f"resumed from step {step}"
