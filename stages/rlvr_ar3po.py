"""Stage `rlvr_ar3po`: RLVR from the SFT policy with the task verifier as reward (METHODS.md section 4).

``rlvr.algo`` picks the rollout: ``ar3po`` (adaptive rollout in S stages of k + response reuse), ``grpo`` (fixed
n) or ``dapo`` (dynamic sampling). Training is TRL's GRPOTrainer with the rollout overridden
(``posttrain.rlvr.RLVRTrainer``): clipped updates with a KL penalty to the SFT policy, checkpoints every
``rlvr.save_steps`` with the replay buffer and sampler state (a killed run resumes), dev accuracy every
``rlvr.dev_every`` steps, rollout cost per step in MLflow. With ``rlvr.buffer_seed: reference`` AR3PO's replay
buffer starts with each question's verified reference solution, so reuse can fire on a question's first visit.

Writes models/rlvr and reports/metrics/rlvr_ar3po.json: test accuracy of the SFT and the RLVR policy (own
choice, per difficulty), the rollout totals (responses, tokens, generation vs training seconds, buffer hits,
zero-advantage share) and the dev-accuracy curve against cumulative responses.
"""
from __future__ import annotations

from pathlib import Path

from accelerate.utils import broadcast_object_list
from datasets import Dataset
from transformers import AutoTokenizer

import mlflow
from posttrain.atomic import atomic_dir, atomic_write_json
from posttrain.checkpoints import claim_checkpoint_dir, last_complete_checkpoint, result_params, save_trained
from posttrain.curves import CURVE_DIR, TrainingCurve
from posttrain.errors import stage_main
from posttrain.jsonl import read_jsonl
from posttrain.params import load_params
from posttrain.params_schema import Params
from posttrain.policy_accuracy import DevAccuracyCallback, own_choice_accuracy
from posttrain.process_group import is_main_process
from posttrain.rlvr import RLVR_CURVE, ROLLOUT_STATE, RLVRTrainer, VerifierReward, reference_responses, rlvr_config
from posttrain.sandbox import sandbox_limits
from posttrain.tracking import stage_run
from posttrain.trajectories import prompt

DATA, POLICY, OUT = Path("data/prepared"), "models/sft", "models/rlvr"
METRICS, CHECKPOINTS = Path("reports/metrics/rlvr_ar3po.json"), Path("checkpoints/rlvr_ar3po")


def train_rlvr(params: Params, train: list[dict], eval_records: list[dict], out: str, checkpoint_root: Path,
               seed: int | None = None, curve: Path | None = None, policy: str = POLICY
               ) -> tuple[RLVRTrainer, DevAccuracyCallback]:
    """RLVR from ``policy`` (the SFT policy) on ``train``; accuracy on ``eval_records`` every ``rlvr.dev_every`` steps.

    Resumes from the last checkpoint under ``checkpoint_root/<hash of params, policy, data>``; saves to ``out``.
    With ``curve``, the per-step reward, rollout cost and dev accuracy are kept in that CSV (``posttrain.curves``).
    """
    cfg, seed = params.rlvr, params.seed if seed is None else seed
    tokenizer = AutoTokenizer.from_pretrained(policy)
    limits = sandbox_limits(params.sandbox)
    dataset = Dataset.from_list([{"prompt": prompt(r["question"]), "difficulty": r["difficulty"]} for r in train])
    reward = VerifierReward({prompt(r["question"]): r for r in train}, limits, params.sandbox.workers)
    dev_cb = DevAccuracyCallback(eval_records, tokenizer, cfg.dev_every, cfg.max_new_tokens, limits,
                                 params.sandbox.workers, label=f"rlvr {cfg.algo}")
    # the sandbox's limits decide the rewards, so checkpoints trained under other limits are not resumed
    ckpt = claim_checkpoint_dir(checkpoint_root, {"rlvr": cfg.model_dump(), **result_params(params, ("sandbox",))},
                                seed, [Path(policy), DATA / "train.jsonl"])
    resume = last_complete_checkpoint(ckpt, marker=ROLLOUT_STATE)
    curve_cb = [TrainingCurve(curve, RLVR_CURVE, dev_cb)] if curve is not None else []
    trainer = RLVRTrainer(model=policy, reward_funcs=reward, args=rlvr_config(cfg, ckpt, seed), train_dataset=dataset,
                          processing_class=tokenizer, rlvr=cfg, seed=seed, callbacks=[dev_cb, *curve_cb])
    if resume:
        print(f"rlvr_ar3po: resuming from {resume}")
        if mlflow.active_run() is not None:
            mlflow.set_tag("rlvr_ar3po.resumed_from", resume)
        trainer.load_rollout_state(resume)  # the buffer, seeded or grown, comes back as it was saved
        dev_cb.restore(resume)
    elif cfg.algo == "ar3po" and cfg.buffer_seed == "reference":
        # the ranks of a multi-process launch run one schedule, so one buffer: rank 0 verifies, the others receive
        acc = trainer.accelerator
        seeds = [reference_responses(train, reward, tokenizer) if acc.is_main_process else None]
        if acc.num_processes > 1:
            broadcast_object_list(seeds)
        seeds = seeds[0]
        for r in seeds:
            trainer.buffer.add(r)
        print(f"rlvr_ar3po: replay buffer seeded with {len(seeds)} verified reference solutions "
              f"of {len(train)} questions")
        if mlflow.active_run() is not None:
            mlflow.log_metric("buffer_seeded", len(seeds))
    trainer.train(resume_from_checkpoint=resume)
    with atomic_dir(out) as tmp:
        save_trained(trainer, tokenizer, tmp)
    return trainer, dev_cb  # the checkpoints stay (see claim_checkpoint_dir)


@stage_main
def main() -> None:
    params = load_params()
    cfg = params.rlvr
    with stage_run("rlvr_ar3po", params, sections=["seed", "sandbox", "rlvr"]):
        train, dev, test = (read_jsonl(DATA / f"{s}.jsonl") for s in ("train", "dev", "test"))
        trainer, dev_cb = train_rlvr(params, train[:cfg.n_prompts], dev[:cfg.n_dev], OUT, CHECKPOINTS,
                                     curve=CURVE_DIR / "rlvr_ar3po.csv")
        if not is_main_process():
            return  # the test evaluation and the run's figures are rank 0's (every rank holds the same totals)
        before = own_choice_accuracy(POLICY, test, cfg.max_new_tokens, params.sandbox)
        after = own_choice_accuracy(OUT, test, cfg.max_new_tokens, params.sandbox)
        totals = dict(trainer.totals)
        metrics = {
            "algo": cfg.algo, "sft_test": before, "rlvr_test": after, "rollout": totals,
            "responses_per_prompt": totals.get("responses", 0) / max(totals.get("prompts", 1), 1),
            "zero_advantage_share": totals.get("zero_advantage_prompts", 0) / max(totals.get("prompts", 1), 1),
            # the part of it without a correct response: what AR3PO's reuse removes (the rest are all correct)
            "zero_advantage_unsolved_share":
                totals.get("zero_advantage_unsolved_prompts", 0) / max(totals.get("prompts", 1), 1),
            "signal_share": totals.get("signal_responses", 0) / max(totals.get("responses", 1), 1),
            "generation_share": totals.get("generation_seconds", 0) / max(
                totals.get("generation_seconds", 0) + totals.get("training_seconds", 0), 1e-9),
            "dev_curve": [{"step": s, "dev_accuracy": a, **trainer.cost_at(s)} for s, a in dev_cb.history],
        }
        atomic_write_json(METRICS, metrics)
        mlflow.log_metrics({"sft_test_accuracy": before["accuracy"], "rlvr_test_accuracy": after["accuracy"],
                            "responses_per_prompt": metrics["responses_per_prompt"],
                            **{k: metrics[k] for k in ("zero_advantage_share", "zero_advantage_unsolved_share",
                                                       "signal_share")},
                            **{f"total_{k}": v for k, v in totals.items()}})
        print(f"rlvr_ar3po ({cfg.algo}): test accuracy {before['accuracy']:.3f} (sft) -> {after['accuracy']:.3f}; "
              f"{totals.get('responses', 0)} responses ({metrics['responses_per_prompt']:.2f} per prompt), "
              f"{totals.get('tokens', 0)} tokens, zero-advantage share {metrics['zero_advantage_share']:.2f} "
              f"({metrics['zero_advantage_unsolved_share']:.2f} unsolved), signal share {metrics['signal_share']:.2f}, "
              f"generation {metrics['generation_share']:.0%} of step time")


if __name__ == "__main__":
    main()
