"""Stage `warmup`: SFT warm-up (TRL SFTTrainer) so the model can execute any of the 12 trajectories.

Every training question appears once per trajectory: the prompt names the trajectory and the
completion is the programmatic reference response. A share of the prompts (``open_choice_fraction``)
leaves the trajectory open, and the completion then starts by naming one, drawn uniformly, so the
warm-up model also answers open prompts (its "own choice" in evaluation).

Resumable: checkpoints go to checkpoints/warmup/<key>, where the key hashes the params and input data,
so a re-run after a kill continues from the last checkpoint, and a change of inputs starts afresh.
"""
from __future__ import annotations

import random
from pathlib import Path

from posttrain.curves import CURVE_DIR
from posttrain.errors import stage_main
from posttrain.jsonl import read_jsonl
from posttrain.params import load_params
from posttrain.sft import train_sft
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


@stage_main
def main() -> None:
    params = load_params()
    with stage_run("warmup", params, sections=["seed", "warmup"]):
        records = read_jsonl(TRAIN)
        examples = warmup_examples(records, params.warmup.open_choice_fraction, params.seed)
        train_sft(BASE, examples, params.warmup, OUT, CHECKPOINTS, key_files=[Path(TRAIN)], seed=params.seed,
                  name="warmup", curve=CURVE_DIR / "warmup.csv")


if __name__ == "__main__":
    main()
