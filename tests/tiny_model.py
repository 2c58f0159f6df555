"""A tiny scratch Llama + tokenizer on disk, built on a few arithmetic problems, for tests that train or score."""
from pathlib import Path
from types import SimpleNamespace

import torch

from posttrain.modeling import build_llama, train_tokenizer
from posttrain.task.arithmetic import generate_problems
from posttrain.task.solutions import render_response
from posttrain.trajectories import TRAJECTORIES, prompt


# PM head settings for tests on the tiny model: small enough to fit in a second, each estimator's knobs set
HEAD_CFG = SimpleNamespace(random_features=128, feature_scale=1.0, ridge=1e-3, dropout=0.1, mc_samples=4,
                           ensemble_size=3, estimator="sngp", max_response_tokens=64, uncertainty_lambda=10.0,
                           uncertainty_score="predictive")


def tiny_scratch_model(path: Path, n_problems: int, seed: int) -> SimpleNamespace:
    """(path, tok, model, problems, records): 1 layer, width 32, a 300-token BPE on every trajectory of the
    problems; ``records`` are the problems as dataset rows (id, question, answer, difficulty, domain fields)."""
    problems = generate_problems(n_problems, seed=seed, difficulties=range(1, 3), max_operand=12, max_value=60)
    corpus = [prompt(p.question, t) + render_response(p, t) for p in problems for t in TRAJECTORIES]
    tok = train_tokenizer(corpus, vocab_size=300)
    torch.manual_seed(0)
    model = build_llama(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_position=384)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    records = [{"id": str(i), "question": p.question, "answer": p.answer, "difficulty": p.difficulty, **p.to_fields()}
               for i, p in enumerate(problems)]
    return SimpleNamespace(path=str(path), tok=tok, model=model, problems=problems, records=records)
