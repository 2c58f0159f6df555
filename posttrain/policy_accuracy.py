"""How good a policy is at the task: greedy own-choice accuracy on dev (a Trainer callback, every N steps) and
on test. Shared by the RL stages (``rlhf_routed``, ``rlvr_ar3po``) and their benchmarks.

Example:
    >>> own_choice_accuracy("models/sft", test_records, 160, params.sandbox)["accuracy"]   # doctest: +SKIP
    0.621
"""
from __future__ import annotations

import json
from pathlib import Path

import mlflow
from accelerate import PartialState
from accelerate.utils import gather_object
from transformers import TrainerCallback

from posttrain.accuracy_summary import summarize
from posttrain.atomic import atomic_write_json
from posttrain.evaluation import OWN_CHOICE, score_responses
from posttrain.generation import HFGenerator
from posttrain.modeling import load_pretrained
from posttrain.sandbox import sandbox_limits
from posttrain.trajectories import prompt as open_prompt

DEV_HISTORY = "dev_history.json"


class DevAccuracyCallback(TrainerCallback):
    """Greedy own-choice accuracy of the policy on dev questions every ``every`` steps, into MLflow; the history
    is saved with each checkpoint (``restore`` reads it back on a resume). Under a multi-process launch each
    process answers its share of the questions and the counts are summed."""

    def __init__(self, records: list[dict], tokenizer, every: int, max_new_tokens: int, sandbox_limits, workers: int,
                 label: str = "rlhf_routed"):
        self.records, self.tokenizer, self.every, self.label = records, tokenizer, every, label
        self.max_new_tokens, self.limits, self.workers = max_new_tokens, sandbox_limits, workers
        self.history: list[tuple[int, float]] = []

    def accuracy(self, model) -> float:
        procs = PartialState()
        records = self.records[procs.process_index::procs.num_processes]
        was_training = model.training
        gen = HFGenerator(model, self.tokenizer, batch_size=64, max_new_tokens=self.max_new_tokens)
        # greedy generation leaves torch's RNG alone, so how often dev is evaluated does not change what the policy
        # samples next (before stop 76 every evaluation restarted the training's random stream at seed 0)
        texts = [c.text for c in gen.generate([open_prompt(r["question"]) for r in records], progress=False)] \
            if records else []  # more processes than dev questions
        model.train(was_training)
        rows = score_responses(records, [OWN_CHOICE] * len(texts), texts, self.limits, self.workers)
        counts = [(sum(r["correct"] for r in rows), len(rows))]
        if procs.num_processes > 1:
            counts = gather_object(counts)
        return sum(c for c, _ in counts) / sum(n for _, n in counts)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every == 0 or state.global_step == state.max_steps:
            acc = self.accuracy(model)
            self.history.append((state.global_step, acc))
            if mlflow.active_run() is not None:
                mlflow.log_metric("dev_accuracy", acc, step=state.global_step)
            print(f"{self.label}: step {state.global_step} dev accuracy {acc:.3f}")

    def on_save(self, args, state, control, **kwargs):
        atomic_write_json(Path(args.output_dir) / f"checkpoint-{state.global_step}" / DEV_HISTORY, self.history)

    def restore(self, checkpoint: str | Path) -> None:
        path = Path(checkpoint) / DEV_HISTORY
        if path.is_file():  # absent in a checkpoint a kill cut between the Trainer's files and this one
            self.history = [tuple(h) for h in json.loads(path.read_text())]


def own_choice_accuracy(model_dir: str, records: list[dict], max_new_tokens: int, sandbox) -> dict:
    """Greedy test accuracy of a policy that chooses its own trajectory (``summarize`` of the scored rows)."""
    tokenizer, model = load_pretrained(model_dir)
    completions = HFGenerator(model, tokenizer, 64, max_new_tokens).generate(
        [open_prompt(r["question"]) for r in records], desc=f"test {Path(model_dir).name}")
    rows = score_responses(records, [OWN_CHOICE] * len(records), [c.text for c in completions],
                           sandbox_limits(sandbox), sandbox.workers)
    return summarize(rows, [c.n_tokens for c in completions])
