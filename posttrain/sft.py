"""Supervised fine-tuning with TRL's SFTTrainer: resumable, logged to the active MLflow run.

Used by the `warmup` stage (all 12 trajectories) and the `sft` stage (the DOTS planners). Checkpoints go
to ``checkpoint_root/<key>``, where the key hashes the training config and the input bytes, so a re-run
after a kill continues from the last checkpoint and a change of inputs starts afresh.

Example:
    >>> result = train_sft("models/base", examples, params.warmup, "models/warmup",   # doctest: +SKIP
    ...                    Path("checkpoints/warmup"), key_files=[Path("data/prepared/train.jsonl")], seed=0)
    >>> result["train_tokens_per_s"]                                                    # doctest: +SKIP
    3065.0
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from datasets import Dataset
from transformers import set_seed
from trl import SFTConfig, SFTTrainer

import mlflow
from posttrain.atomic import atomic_dir
from posttrain.checkpoints import StopsAtMaxSteps, claim_checkpoint_dir, last_complete_checkpoint, save_trained
from posttrain.curves import TrainingCurve
from posttrain.modeling import device_args, load_pretrained
from posttrain.params_schema import WarmupParams

SFT_CURVE = ["loss", "mean_token_accuracy", "learning_rate"]  # what SFTTrainer logs that a curve file keeps


class ResumableSFTTrainer(StopsAtMaxSteps, SFTTrainer):
    """TRL's SFTTrainer; resumed at its last step, it trains no further."""


def session_tokens(log_history: list[dict], resumed_at_step: int) -> int:
    """Training tokens of this session, as TRL logs them (``num_tokens``): its count is cumulative within a session
    and starts again at 0 on a resume (SFTTrainer does not restore it), so only the entries after the resumed
    step are this session's."""
    return int(max((log.get("num_tokens", 0) for log in log_history if log.get("step", 0) > resumed_at_step),
                   default=0))


def last_logged_loss(log_history: list[dict], default: float) -> float:
    """The last training loss the Trainer logged (over the whole run, before and after a resume), else ``default``."""
    return next((log["loss"] for log in reversed(log_history) if "loss" in log), default)


def sft_config(cfg: WarmupParams, output_dir: Path, seed: int, keep_all: bool = False) -> SFTConfig:
    return SFTConfig(
        output_dir=str(output_dir), max_steps=cfg.max_steps, per_device_train_batch_size=cfg.batch_size,
        gradient_accumulation_steps=cfg.grad_accum, learning_rate=cfg.learning_rate,
        lr_scheduler_type="cosine", warmup_steps=cfg.warmup_ratio, weight_decay=cfg.weight_decay,
        max_length=cfg.max_length, logging_steps=cfg.logging_steps, save_steps=cfg.save_steps,
        save_total_limit=None if keep_all else 2, seed=seed, data_seed=seed, **device_args(cfg.deepspeed),
        report_to=["mlflow"],
        dataloader_num_workers=0, train_sampling_strategy="group_by_length", dataset_num_proc=2,
    )


def save_snapshots(ckpt: Path, dest: Path, last_step: int) -> None:
    """Copy the weights, config and tokenizer of every ``checkpoint-<n>`` with n < last_step to dest/step-<n>."""
    with atomic_dir(dest) as tmp:
        for src in sorted(ckpt.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1])):
            step = int(src.name.split("-")[1])
            if step < last_step:
                (tmp / f"step-{step:05d}").mkdir()
                for f in src.iterdir():
                    if f.is_file() and not f.name.startswith(("optimizer", "scheduler", "rng_state", "trainer_state",
                                                               "training_args")):
                        shutil.copy2(f, tmp / f"step-{step:05d}" / f.name)


def train_sft(init_model: str, examples: list[dict], cfg: WarmupParams, out: str, checkpoint_root: Path,
              key_files: list[Path], seed: int, name: str = "sft", snapshots: str | None = None,
              curve: Path | None = None) -> dict:
    """Fine-tune ``init_model`` on prompt/completion ``examples``; save to ``out`` atomically.

    With ``snapshots``, every checkpoint before the last step is also kept (weights and tokenizer only) as
    ``<snapshots>/step-<n>``: SePPO draws its reference models from them. With ``curve``, the loss curve is kept in
    that CSV as it trains (see ``posttrain.curves``).

    The checkpoints, the final one included, stay under ``checkpoint_root`` (see ``claim_checkpoint_dir``): a stage
    killed while it trains its next model, or before DVC has recorded its outputs, resumes this one at its end
    instead of training it again.

    Returns ``{"train_tokens", "train_tokens_per_s", "final_loss", "resumed_from"}`` (also logged to MLflow).
    """
    ckpt = claim_checkpoint_dir(checkpoint_root, cfg, seed, [Path(init_model), *key_files])
    resume = last_complete_checkpoint(ckpt)
    if resume:
        print(f"{name}: resuming from {resume}")
        mlflow.set_tag(f"{name}.resumed_from", resume)
    # train_runtime covers this session only, and so do the tokens counted (read the step before training rotates
    # the checkpoint away)
    resumed_at = json.loads((Path(resume) / "trainer_state.json").read_text())["global_step"] if resume else 0
    # the args before the model: under a ZeRO-3 config they switch on zero.Init, so from_pretrained partitions the
    # weights as it loads them instead of each rank holding the whole model in memory first
    args = sft_config(cfg, ckpt, seed, keep_all=snapshots is not None)
    tokenizer, model = load_pretrained(init_model)
    set_seed(seed)
    callbacks = [TrainingCurve(curve, SFT_CURVE)] if curve is not None else []
    trainer = ResumableSFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(examples), processing_class=tokenizer,
                         callbacks=callbacks)
    result = trainer.train(resume_from_checkpoint=resume)
    n_tokens = session_tokens(trainer.state.log_history, resumed_at)
    summary = {"train_tokens": n_tokens, "train_tokens_per_s": n_tokens / max(result.metrics["train_runtime"], 1e-9),
               "final_loss": last_logged_loss(trainer.state.log_history, result.metrics["train_loss"]),
               "n_examples": len(examples)}
    mlflow.log_metrics(summary)
    with atomic_dir(out) as tmp:
        save_trained(trainer, tokenizer, tmp)
    if snapshots is not None:
        save_snapshots(ckpt, Path(snapshots), cfg.max_steps)
    print(f"{name}: {n_tokens} tokens at {summary['train_tokens_per_s']:.0f} tokens/s, final loss "
          f"{summary['final_loss']:.3f} -> {out}/")
    return {**summary, "resumed_from": resume}
