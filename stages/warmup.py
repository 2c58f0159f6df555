"""Stage `warmup`: SFT warm-up (TRL SFTTrainer) so the model can execute any of the 12 trajectories.

Every training question appears once per trajectory: the prompt names the trajectory and the
completion is the programmatic reference response. A share of the prompts (``open_choice_fraction``)
leaves the trajectory open, and the completion then starts by naming one, drawn uniformly, so the
warm-up model also answers open prompts (its "own choice" in evaluation).

Resumable: checkpoints go to checkpoints/warmup/<key>, where the key hashes the params and input data,
so a re-run after a kill continues from the last checkpoint, and a change of inputs starts afresh.
"""
from __future__ import annotations

import hashlib
import json
import random
import shutil
from pathlib import Path

import mlflow
import torch
from datasets import Dataset
from transformers import set_seed
from transformers.trainer_utils import get_last_checkpoint
from trl import SFTConfig, SFTTrainer

from posttrain.atomic import atomic_dir
from posttrain.errors import stage_main
from posttrain.modeling import load_pretrained
from posttrain.params import Params, WarmupParams, load_params
from posttrain.task.arithmetic import Problem
from posttrain.task.records import DataError
from posttrain.task.solutions import render_response
from posttrain.tracking import stage_run
from posttrain.trajectories import TRAJECTORIES, prompt

BASE, TRAIN, OUT = "models/base", "data/prepared/train.jsonl", "models/warmup"
CHECKPOINTS = Path("checkpoints/warmup")


def warmup_examples(records: list[dict], open_choice_fraction: float, seed: int) -> list[dict]:
    """Prompt/completion pairs: each question in each of the 12 trajectories, shuffled."""
    rng = random.Random(seed)
    examples = []
    for rec in records:
        if "steps" not in rec:
            raise DataError(f"{TRAIN}: record {rec['id']!r} has no 'steps': warm-up renders reference "
                            "responses from the arithmetic domain's fields")
        problem = Problem.from_fields(rec)
        for t in TRAJECTORIES:
            body = render_response(problem, t)
            if rng.random() < open_choice_fraction:
                examples.append({"prompt": prompt(rec["question"]), "completion": f" {t.name}\n{body}"})
            else:
                examples.append({"prompt": prompt(rec["question"], t), "completion": body})
    rng.shuffle(examples)
    return examples


def checkpoint_dir(params: Params) -> Path:
    """A directory unique to these params and inputs, so only a matching run is resumed."""
    h = hashlib.sha256(json.dumps([params.seed, params.warmup.model_dump()], sort_keys=True).encode())
    for path in [Path(TRAIN), *sorted(Path(BASE).glob("*"))]:
        if path.is_file():
            h.update(path.read_bytes())
    return CHECKPOINTS / h.hexdigest()[:16]


def tokens_seen(log_history: list[dict]) -> int:
    """Training tokens so far, as TRL logs them (``num_tokens``, cumulative)."""
    return int(max((log.get("num_tokens", 0) for log in log_history), default=0))


def sft_config(cfg: WarmupParams, output_dir: Path, seed: int) -> SFTConfig:
    return SFTConfig(
        output_dir=str(output_dir), max_steps=cfg.max_steps, per_device_train_batch_size=cfg.batch_size,
        gradient_accumulation_steps=cfg.grad_accum, learning_rate=cfg.learning_rate,
        lr_scheduler_type="cosine", warmup_steps=cfg.warmup_ratio, weight_decay=cfg.weight_decay,
        max_length=cfg.max_length, logging_steps=cfg.logging_steps, save_steps=cfg.save_steps,
        save_total_limit=2, seed=seed, data_seed=seed, use_cpu=not torch.cuda.is_available(), report_to=["mlflow"],
        dataloader_num_workers=0, train_sampling_strategy="group_by_length", dataset_num_proc=2,
    )


@stage_main
def main() -> None:
    params = load_params()
    with stage_run("warmup", params, sections=["seed", "warmup"]):
        with open(TRAIN, encoding="utf-8") as f:
            records = [json.loads(line) for line in f]
        examples = warmup_examples(records, params.warmup.open_choice_fraction, params.seed)
        tokenizer, model = load_pretrained(BASE)
        set_seed(params.seed)
        out_dir = checkpoint_dir(params)
        resume = get_last_checkpoint(str(out_dir)) if out_dir.is_dir() else None
        if resume:
            print(f"warmup: resuming from {resume}")
            mlflow.set_tag("resumed_from", resume)
        trainer = SFTTrainer(
            model=model, args=sft_config(params.warmup, out_dir, params.seed),
            train_dataset=Dataset.from_list(examples), processing_class=tokenizer,
        )
        result = trainer.train(resume_from_checkpoint=resume)
        n_tokens = tokens_seen(trainer.state.log_history)
        if resume:  # train_runtime covers this session only
            n_tokens -= tokens_seen(json.loads((Path(resume) / "trainer_state.json").read_text())["log_history"])
        tokens_per_s = n_tokens / max(result.metrics["train_runtime"], 1e-9)
        mlflow.log_metrics({"train_tokens": n_tokens, "train_tokens_per_s": tokens_per_s,
                            "final_loss": result.metrics["train_loss"], "n_examples": len(examples)})
        with atomic_dir(OUT) as tmp:
            trainer.save_model(str(tmp))
            tokenizer.save_pretrained(tmp)
        shutil.rmtree(out_dir, ignore_errors=True)
        print(f"warmup: {n_tokens} tokens at {tokens_per_s:.0f} tokens/s, final loss "
              f"{result.metrics['train_loss']:.3f} -> {OUT}/")


if __name__ == "__main__":
    main()
