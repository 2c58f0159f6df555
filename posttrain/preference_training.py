"""Training the reward models, resumably: the pairwise PM (transformers' Trainer) and the pointwise
Bradley-Terry RM baseline (TRL's RewardTrainer).

Checkpoints go to ``checkpoint_root/<key>`` (key = config + input bytes, as for SFT); a re-run after a kill
resumes from the last one. Both log per-step loss to the active MLflow run and, given a ``curve`` path, to that
CSV (``posttrain.curves``).

Example:
    >>> pm = train_preference_model("models/sft", pairs, params.train_rm, Path("checkpoints/rm"),  # doctest: +SKIP
    ...                             key_files=[Path("data/seppo/pairs.jsonl")], seed=0)
"""
from __future__ import annotations

import random
from pathlib import Path

import mlflow
import torch
from datasets import Dataset
from tqdm.auto import tqdm
from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments, set_seed
from trl import RewardConfig, RewardTrainer

from posttrain.checkpoints import StopsAtMaxSteps, claim_checkpoint_dir, last_complete_checkpoint, save_trained
from posttrain.curves import TrainingCurve
from posttrain.modeling import device_args
from posttrain.params_schema import RewardModelParams
from posttrain.preference_model import PreferenceModel, left_padded_positions, tail
from posttrain.tracking import part_run


class ResumableTrainer(StopsAtMaxSteps, Trainer):
    """transformers' Trainer (the PM's loss is its own); resumed at its last step, it trains no further."""


class ResumableRewardTrainer(StopsAtMaxSteps, RewardTrainer):
    """TRL's RewardTrainer; resumed at its last step, it trains no further."""


def tie_sample(pairs: list[dict], ties: list[dict], tie_share: float, seed: int) -> list[dict]:
    """As many of ``ties`` as make ``tie_share`` of the training rows beside ``pairs`` (all if there are fewer;
    none at 0, the paper's Bradley-Terry)."""
    n = min(len(ties), round(tie_share / (1 - tie_share) * len(pairs))) if tie_share > 0 else 0
    return random.Random(seed).sample(list(ties), n)


def both_orders(pairs: list[dict], seed: int, ties: list[dict] = ()) -> list[tuple[tuple[str, str, str], float]]:
    """((question, A, B), label), shuffled: every pair as (chosen, rejected) -> 1 and (rejected, chosen) -> 0, and
    every tie (a dict with question/a/b) as (a, b) and (b, a) -> 1/2."""
    rows = [((p["question"], p["chosen"], p["rejected"]), 1.0) for p in pairs]
    rows += [((p["question"], p["rejected"], p["chosen"]), 0.0) for p in pairs]
    rows += [((t["question"], t["a"], t["b"]), 0.5) for t in ties]
    rows += [((t["question"], t["b"], t["a"]), 0.5) for t in ties]
    random.Random(seed).shuffle(rows)
    return rows


def _training_args(cfg: RewardModelParams, out: Path, seed: int, max_steps: int, **extra) -> dict:
    return dict(output_dir=str(out), max_steps=max_steps, per_device_train_batch_size=cfg.batch_size,
                gradient_accumulation_steps=cfg.grad_accum, learning_rate=cfg.learning_rate,
                lr_scheduler_type="cosine", warmup_steps=cfg.warmup_ratio, weight_decay=cfg.weight_decay,
                logging_steps=cfg.logging_steps, save_steps=cfg.save_steps, save_total_limit=2, seed=seed,
                data_seed=seed, **device_args(cfg.deepspeed), report_to=["mlflow"],
                dataloader_num_workers=0, **extra)


def train_preference_model(init_model: str, pairs: list[dict], cfg: RewardModelParams, checkpoint_root: Path,
                           key_files: list[Path], seed: int, ties: list[dict] = (),
                           curve: Path | None = None) -> PreferenceModel:
    """Train the PM on ``pairs`` (dicts with question/chosen/rejected) in both orders, and on ``cfg.tie_share`` of
    tie rows from ``ties`` (question/a/b, target 1/2); fit the sngp posterior on every row it trained on."""
    ckpt = claim_checkpoint_dir(checkpoint_root, cfg, seed, [Path(init_model), *key_files])
    resume = last_complete_checkpoint(ckpt)
    if resume:
        print(f"train_rm: resuming the preference model from {resume}")
    # the args before the backbone: under a ZeRO-3 config they switch on zero.Init for from_pretrained (see train_sft)
    args = TrainingArguments(**_training_args(cfg, ckpt, seed, cfg.max_steps, remove_unused_columns=False))
    set_seed(seed)
    pm = PreferenceModel.from_backbone(init_model, cfg)
    ties = tie_sample(pairs, ties, cfg.tie_share, seed)
    rows = both_orders(pairs, seed, ties)
    if mlflow.active_run() is not None:
        mlflow.log_metrics({"pm_decisive_pairs": len(pairs), "pm_tie_pairs": len(ties)})
    dataset = Dataset.from_list([{"triple": list(triple), "labels": y} for triple, y in rows])

    def collate(batch: list[dict]) -> dict:
        return {**pm.encode([tuple(b["triple"]) for b in batch]), "labels": torch.tensor([b["labels"] for b in batch])}

    callbacks = [TrainingCurve(curve, ["loss", "grad_norm", "learning_rate"])] if curve is not None else []
    ResumableTrainer(model=pm, args=args, train_dataset=dataset, data_collator=collate,
            callbacks=callbacks).train(resume_from_checkpoint=resume)
    pm.fit_posterior([(p["question"], p["chosen"], p["rejected"]) for p in pairs]
                     + [(t["question"], t["a"], t["b"]) for t in ties], cfg.eval_batch_size)
    return pm.eval()  # the checkpoints stay (see claim_checkpoint_dir)


def train_pointwise_rm(init_model: str, pairs: list[dict], cfg: RewardModelParams, out: Path, checkpoint_root: Path,
                       key_files: list[Path], seed: int, curve: Path | None = None):
    """TRL RewardTrainer (Bradley-Terry on r(chosen) - r(rejected)); returns (model, tokenizer), saved to ``out``."""
    ckpt = claim_checkpoint_dir(checkpoint_root, cfg, seed, [Path(init_model), *key_files])
    resume = last_complete_checkpoint(ckpt)
    # the args before the model: under a ZeRO-3 config they switch on zero.Init for from_pretrained (see train_sft)
    args = RewardConfig(**_training_args(cfg, ckpt, seed, cfg.pointwise_max_steps, max_length=cfg.max_length))
    set_seed(seed)  # the score head is initialised at random
    tokenizer = AutoTokenizer.from_pretrained(init_model)
    model = AutoModelForSequenceClassification.from_pretrained(init_model, num_labels=1,
                                                               pad_token_id=tokenizer.pad_token_id)
    n = cfg.max_response_tokens
    dataset = Dataset.from_list([{"prompt": f"Question: {p['question']}\nResponse:",
                                  "chosen": " " + tail(tokenizer, p["chosen"], n),
                                  "rejected": " " + tail(tokenizer, p["rejected"], n)} for p in pairs])
    callbacks = [TrainingCurve(curve, ["loss", "accuracy", "margin"])] if curve is not None else []
    trainer = ResumableRewardTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                            callbacks=callbacks)
    with part_run("pointwise_rm"):  # its Trainer args and loss curve would clash with the PM's in the stage's run
        trainer.train(resume_from_checkpoint=resume)
    save_trained(trainer, tokenizer, out)
    return model.eval(), tokenizer  # the checkpoints stay (see claim_checkpoint_dir)


@torch.no_grad()
def pointwise_scores(model, tokenizer, question_response: list[tuple[str, str]], max_response_tokens: int,
                     batch_size: int = 64) -> list[float]:
    """The pointwise RM's reward for each (question, response)."""
    # the text RewardTrainer trained on: prompt + " " + response + EOS (its reward is read at the last token)
    texts = [f"Question: {q}\nResponse: {tail(tokenizer, r, max_response_tokens)}{tokenizer.eos_token}"
             for q, r in question_response]
    out = []
    for i in tqdm(range(0, len(texts), batch_size), desc="pointwise RM", unit="batch"):
        enc = tokenizer(texts[i:i + batch_size], return_tensors="pt", padding=True)
        out.extend(model(**enc, position_ids=left_padded_positions(enc["attention_mask"])).logits[:, 0].tolist())
    return out
