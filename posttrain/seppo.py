"""SePPO (METHODS.md section 2): preference optimisation from winners alone, losers sampled from earlier checkpoints.

Each pair holds the prompt x, the winner (anchor) y_w and a reference sample y_ref drawn from a reference
checkpoint picked uniformly among the earlier ones. With the implicit rewards

    h_w = log pi_theta(y_w|x) - log pi_ref(y_w|x),   h_r = log pi_theta(y_ref|x) - log pi_ref(y_ref|x)

the anchor-based adaptive flipper (AAF) treats y_ref as a winner when h_w < 0 (the reference fits the anchor
better than the policy does, so its own sample is probably good), and the loss is
``-log sigmoid(beta * (h_w - sign * h_r))`` with sign = -1 then, +1 otherwise. With sign fixed to +1 it is DPO.

The trainers reuse TRL's DPOTrainer whole (tokenisation, collation, logging, checkpoints); the reference
log-probs come with each row (``ref_chosen_logps``/``ref_rejected_logps``) because every row has its own
reference checkpoint, which a single ``ref_model`` cannot express.

Example:
    >>> h_w, h_r = torch.tensor([0.5, -0.2]), torch.tensor([-1.0, 0.3])
    >>> aaf_sign(h_w).tolist()
    [1.0, -1.0]
    >>> [round(x, 3) for x in seppo_loss(h_w, h_r, beta=1.0).tolist()]
    [0.201, 0.644]
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F
from datasets import Dataset
from tqdm.auto import tqdm
from transformers import AutoTokenizer
from trl import DPOConfig, DPOTrainer
from trl.data_utils import common_prefix_length
from trl.trainer.dpo_trainer import DataCollatorForPreference

from posttrain.modeling import device_args, load_pretrained


def reference_checkpoints(initial: str, snapshots: Path) -> list[str]:
    """SePPO's reference models, oldest first: the model SFT started from (step 0), then its snapshots."""
    return [initial, *sorted(str(p) for p in Path(snapshots).glob("step-*") if p.is_dir())]


def aaf_sign(h_w: torch.Tensor) -> torch.Tensor:
    """+1: the reference sample is a loser; -1 (when h_w < 0): it is treated as a winner."""
    return torch.where(h_w < 0, -1.0, 1.0).to(h_w.dtype)


def seppo_loss(h_w: torch.Tensor, h_r: torch.Tensor, beta: float) -> torch.Tensor:
    """Per-pair SePPO loss; the flip decision is not differentiated through."""
    sign = aaf_sign(h_w.detach())
    return -F.logsigmoid(beta * (h_w - sign * h_r))


def preference_example(tokenizer, prompt: str, chosen: str, rejected: str) -> dict:
    """A row as DPOTrainer tokenises it (its ``tokenize_fn``, plain text): EOS appended, and both completions start
    where the prompt's tokens part from either prompt+completion (a merge across the boundary moves the start)."""
    eos = tokenizer.eos_token
    p = tokenizer(prompt)["input_ids"]
    w, r = (tokenizer(prompt + c + ("" if c.endswith(eos) else eos))["input_ids"] for c in (chosen, rejected))
    k = min(common_prefix_length(p, w), common_prefix_length(p, r))
    return {"prompt_ids": p[:k], "chosen_ids": w[k:], "rejected_ids": r[k:]}


@torch.inference_mode()
def preference_logps(model, tokenizer, prompts: list[str], chosen: list[str], rejected: list[str],
                     max_length: int | None = None, truncation_mode: str = "keep_start", batch_size: int = 32,
                     desc: str = "log-probs") -> tuple[list[float], list[float]]:
    """log pi(chosen | prompt) and log pi(rejected | prompt) of each pair, summed over exactly the tokens DPOTrainer
    scores under ``DPOConfig(max_length=..., truncation_mode=...)``: TRL's own collator cuts each sequence, so a
    reference log-prob covers the same tokens as the policy's (a whole-sequence one made h_w and h_r meaningless
    for pairs the trainer cuts). ``batch_size`` counts sequences (two per pair)."""
    model.eval()
    # pad id 0: padding is masked out and, on the right, never seen by earlier tokens
    collate = DataCollatorForPreference(pad_token_id=0, max_length=max_length, truncation_mode=truncation_mode)
    rows = list(zip(prompts, chosen, rejected, strict=True))
    step = max(1, batch_size // 2)
    out_w: list[float] = []
    out_r: list[float] = []
    for start in tqdm(range(0, len(rows), step), desc=desc, unit="batch"):
        batch = {k: v.to(model.device) for k, v in collate([preference_example(tokenizer, *row)
                                                            for row in rows[start:start + step]]).items()}
        ids = batch["input_ids"]
        logits = model(input_ids=ids, attention_mask=batch["attention_mask"]).logits[:, :-1].float()
        token_logps = logits.gather(2, ids[:, 1:, None]).squeeze(2) - logits.logsumexp(-1)
        w, r = (token_logps * batch["completion_mask"][:, 1:]).sum(1).cpu().chunk(2)
        out_w += w.tolist()
        out_r += r.tolist()
    return out_w, out_r


class PerRowReferenceDPOTrainer(DPOTrainer):
    """DPOTrainer whose reference log-probs are columns of the dataset (one reference model per row).

    Needs ``DPOConfig(precompute_ref_log_probs=True)`` and ``ref_chosen_logps``/``ref_rejected_logps`` columns
    covering the tokens the collator keeps: ``preference_logps`` with the config's max_length and truncation_mode.
    """

    def _precompute_ref_logps(self, dataset: Dataset, name: str, batch_size: int) -> Dataset:
        missing = {"ref_chosen_logps", "ref_rejected_logps"} - set(dataset.column_names)
        if missing:
            raise ValueError(f"{name} dataset: missing columns {sorted(missing)} (the per-row reference log-probs)")
        return dataset


class SePPOTrainer(PerRowReferenceDPOTrainer):
    """TRL's DPOTrainer with the SePPO loss (AAF flip of the reference sample).

    Example:
        >>> args = DPOConfig("out", precompute_ref_log_probs=True, beta=0.1)           # doctest: +SKIP
        >>> SePPOTrainer(model, args=args, train_dataset=pairs, processing_class=tok).train()  # doctest: +SKIP
    """

    def _compute_loss(self, model, inputs, return_outputs):
        mode = "train" if self.model.training else "eval"
        # 1. policy log-probs of the completion tokens, [chosen..., rejected...] as the DPO collator lays them out
        completion_mask = inputs["completion_mask"]
        labels = inputs["input_ids"].masked_fill(completion_mask == 0, -100)
        outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], labels=labels,
                        use_cache=False, fused_lm_head=True)
        seq_len = completion_mask.size(1) - 1
        chosen_logps, rejected_logps = outputs.log_probs[:, -seq_len:].sum(dim=1).chunk(2, dim=0)
        # 2. implicit rewards against each row's own reference checkpoint
        h_w = chosen_logps - inputs["ref_chosen_logps"]
        h_r = rejected_logps - inputs["ref_rejected_logps"]
        # 3. anchor-based flip, then the logistic loss
        loss = seppo_loss(h_w, h_r, self.beta).mean()
        metrics = self._metrics[mode]
        metrics["aaf/flip_rate"].append(self.accelerator.gather((h_w.detach() < 0).float()).mean().item())
        metrics["rewards/chosen"].append(self.accelerator.gather(self.beta * h_w.detach()).mean().item())
        metrics["rewards/rejected"].append(self.accelerator.gather(self.beta * h_r.detach()).mean().item())
        metrics["logps/chosen"].append(self.accelerator.gather(chosen_logps.detach()).mean().item())
        metrics["logps/rejected"].append(self.accelerator.gather(rejected_logps.detach()).mean().item())
        return (loss, outputs) if return_outputs else loss


def pairs_dataset(samples: list[dict], tokenizer, max_length: int | None, truncation_mode: str = "keep_start",
                  batch_size: int = 32) -> Dataset:
    """A DPO/SePPO dataset from seppo_sample rows: anchor = chosen, reference sample = rejected.

    seppo_sample's reference log-probs cover whole sequences (it cannot know the trainer's max_length); the pairs
    ``max_length`` cuts get theirs again from their own reference checkpoint, over the tokens the trainer keeps.
    A sample whose anchor fails the verifier (``anchor_correct`` False) is left out: SePPO learns from winners alone,
    and seppo_sample's own pairs leave such anchors out too."""
    samples = [s for s in samples if s.get("anchor_correct", True)]
    rows = [{"prompt": s["prompt"], "chosen": s["anchor"], "rejected": s["response"],
             "ref_chosen_logps": s["ref_anchor_logp"], "ref_rejected_logps": s["ref_response_logp"]} for s in samples]
    cut = defaultdict(list)  # reference checkpoint -> the rows it scores again
    for i, (s, row) in enumerate(zip(samples, rows)):
        ex = preference_example(tokenizer, row["prompt"], row["chosen"], row["rejected"])
        longest = len(ex["prompt_ids"]) + max(len(ex["chosen_ids"]), len(ex["rejected_ids"]))
        if max_length is not None and longest > max_length:
            cut[s["reference"]].append(i)
    for reference, idx in cut.items():
        _, model = load_pretrained(reference)
        columns = ([rows[i][k] for i in idx] for k in ("prompt", "chosen", "rejected"))
        logps = preference_logps(model, tokenizer, *columns, max_length, truncation_mode, batch_size,
                                 desc=f"ref log-probs ({Path(reference).name})")
        for i, lw, lr in zip(idx, *logps):
            rows[i].update(ref_chosen_logps=lw, ref_rejected_logps=lr)
    return Dataset.from_list(rows)


def train_policy(init_model: str, samples: list[dict], cfg, out: str, seed: int):
    """Optimise the policy at ``init_model`` on SePPO samples with ``cfg.loss`` (seppo | dpo); save to ``out``.

    ``cfg`` is a ``PolicyOptParams``. Returns the trainer (its ``state.log_history`` holds the curves).
    """
    args = DPOConfig(output_dir=out, precompute_ref_log_probs=True, beta=cfg.beta, max_steps=cfg.max_steps,
                     per_device_train_batch_size=cfg.batch_size, gradient_accumulation_steps=cfg.grad_accum,
                     learning_rate=cfg.learning_rate, lr_scheduler_type="cosine", warmup_steps=cfg.warmup_ratio,
                     weight_decay=cfg.weight_decay, max_length=cfg.max_length, logging_steps=cfg.logging_steps,
                     save_strategy="no", seed=seed, data_seed=seed, report_to=[], **device_args(cfg.deepspeed))
    trainer_cls = SePPOTrainer if cfg.loss == "seppo" else PerRowReferenceDPOTrainer
    tokenizer = AutoTokenizer.from_pretrained(init_model)
    pairs = pairs_dataset(samples, tokenizer, args.max_length, args.truncation_mode, args.per_device_train_batch_size)
    trainer = trainer_cls(model=init_model, args=args, train_dataset=pairs, processing_class=tokenizer)
    trainer.train()
    trainer.save_model(out)
    tokenizer.save_pretrained(out)
    return trainer
