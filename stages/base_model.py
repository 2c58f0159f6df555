"""Stage `base_model`: the untrained policy every later stage starts from, in models/base.

``model.base: scratch`` trains a BPE tokenizer on the training questions and their reference responses
for all 12 trajectories, and initialises a small Llama from the sizes in params.yaml (seeded).
Otherwise the hub id or local directory is loaded and saved here, so downstream stages read one place.
"""
from __future__ import annotations

import random

from transformers import set_seed

import mlflow
from posttrain.atomic import atomic_dir
from posttrain.errors import stage_main
from posttrain.jsonl import read_jsonl
from posttrain.modeling import build_llama, count_parameters, load_pretrained, train_tokenizer
from posttrain.params import load_params
from posttrain.params_schema import ModelParams
from posttrain.task.arithmetic import Problem
from posttrain.task.solutions import render_response
from posttrain.tracking import stage_run
from posttrain.trajectories import TRAJECTORIES, prompt

OUT = "models/base"
TRAIN = "data/prepared/train.jsonl"


def tokenizer_corpus(records: list[dict], seed: int) -> list[str]:
    """Prompts and reference responses in every trajectory (the text the model will read and write)."""
    texts = []
    rng = random.Random(seed)
    for rec in records:
        if "steps" in rec:
            problem = Problem.from_fields(rec)
            for t in TRAJECTORIES:
                texts.append(prompt(rec["question"], t) + render_response(problem, t))
        else:
            texts.append(prompt(rec["question"], rng.choice(TRAJECTORIES)))
    return texts


def build_base(cfg: ModelParams, records: list[dict], seed: int):
    """(tokenizer, model) for ``model.base``; scratch models are initialised from ``seed``."""
    if cfg.base != "scratch":
        return load_pretrained(cfg.base)
    tokenizer = train_tokenizer(tokenizer_corpus(records, seed), cfg.vocab_size, cfg.split_digits)
    set_seed(seed)
    model = build_llama(tokenizer, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.intermediate_size,
                        cfg.max_position)
    return tokenizer, model


@stage_main
def main() -> None:
    params = load_params()
    with stage_run("base_model", params, sections=["seed", "model"]):
        records = read_jsonl(TRAIN)
        tokenizer, model = build_base(params.model, records, params.seed)
        n_params = count_parameters(model)
        with atomic_dir(OUT) as tmp:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        mlflow.log_metrics({"n_parameters": n_params, "vocab_size": len(tokenizer)})
        print(f"base_model: {n_params / 1e6:.2f}M parameters, vocabulary {len(tokenizer)} -> {OUT}/")


if __name__ == "__main__":
    main()
