"""Stage `sft`: the DOTS planners, trained (TRL SFTTrainer) on the optimal trajectories found by the search.

- ``internal`` -> models/sft: the warm-up solver fine-tuned on open prompts, so that it names the
  optimal trajectory itself and then follows it: question -> (trajectory, reasoning, answer). This is the
  policy every later stage starts from.
- ``external`` -> models/planner: a copy of the warm-up model fine-tuned to name the optimal trajectory
  only (question -> trajectory); at inference the warm-up solver then follows the named trajectory.
  (The paper's planner also writes a short explanation first; ours names the trajectory directly.)

- models/sft_checkpoints/step-<n>: the internal planner's checkpoints every ``sft.save_steps`` steps (before
  the last), kept as SePPO's reference models (the warm-up model is step 0).
- ``vanilla`` -> models/sft_vanilla: the baseline, the warm-up model fine-tuned the same way on the same
  questions but on plain step-by-step solutions with no trajectory (prompt: the question alone).

All three are trained (the external planner is cheap: its targets are a few tokens); ``sft.planner`` picks the
one the evaluation reports as DOTS. Only questions the search kept (not all-solved or all-failed) are training data.
"""
from __future__ import annotations

import random
import shutil
from pathlib import Path

import mlflow

from posttrain.atomic import atomic_dir, atomic_write_text
from posttrain.curves import CURVE_DIR, curve_csv
from posttrain.errors import stage_main
from posttrain.jsonl import read_jsonl
from posttrain.params import load_params
from posttrain.sft import SFT_CURVE, train_sft
from posttrain.task.arithmetic import Problem
from posttrain.task.records import DataError
from posttrain.task.solutions import render_response
from posttrain.tracking import part_run, stage_run
from posttrain.trajectories import BY_NAME, plain_prompt, prompt

SOLVER, TRAIN, SEARCH = "models/warmup", Path("data/prepared/train.jsonl"), Path("data/dots/search.jsonl")
OUT = {"internal": "models/sft", "external": "models/planner", "vanilla": "models/sft_vanilla"}
SNAPSHOTS = "models/sft_checkpoints"  # the internal planner every sft.save_steps steps: SePPO's reference models
CHECKPOINTS = Path("checkpoints/sft")


def planner_examples(search: list[dict], records: dict[str, dict], seed: int) -> dict[str, list[dict]]:
    """Training pairs for each planner from the kept search results (shuffled with ``seed``)."""
    internal, external, vanilla = [], [], []
    for row in search:
        if not row["optimal"]:
            continue
        rec = records[row["id"]]
        trajectory = BY_NAME[row["optimal"]]
        body = render_response(Problem.from_fields(rec), trajectory)
        internal.append({"prompt": prompt(rec["question"]), "completion": f" {trajectory.name}\n{body}"})
        external.append({"prompt": prompt(rec["question"]), "completion": f" {trajectory.name}"})
        vanilla.append({"prompt": plain_prompt(rec["question"]),
                        "completion": render_response(Problem.from_fields(rec), BY_NAME["cot"])})
    for examples in (internal, external, vanilla):
        random.Random(seed).shuffle(examples)
    return {"internal": internal, "external": external, "vanilla": vanilla}


@stage_main
def main() -> None:
    params = load_params()
    cfg = params.sft
    with stage_run("sft", params, sections=["seed", "sft"]):
        records = {r["id"]: r for r in read_jsonl(TRAIN)}
        search = read_jsonl(SEARCH)
        examples = planner_examples(search, records, params.seed)
        n = len(examples["internal"])
        mlflow.log_metric("n_planner_examples", n)
        if n < cfg.min_examples:
            raise DataError(f"{SEARCH}: the search kept {n} questions, fewer than sft.min_examples "
                            f"({cfg.min_examples}); raise dots_search.n_questions or train the warm-up model longer")
        if n == 0:
            print("sft: the search kept no question; the planners are copies of the warm-up solver")
            mlflow.set_tag("sft.untrained", "no kept search questions")
            for out in OUT.values():
                with atomic_dir(out) as tmp:
                    shutil.copytree(SOLVER, tmp, dirs_exist_ok=True)
            for planner in OUT:  # declared outputs: no step was trained, so a header only
                atomic_write_text(CURVE_DIR / f"sft_{planner}.csv", curve_csv([], SFT_CURVE))
            with atomic_dir(SNAPSHOTS):
                pass
            return
        for planner in OUT:
            steps = cfg.external_max_steps if planner == "external" else cfg.max_steps
            # one nested run per planner: three Trainers' args and loss curves cannot share the stage's run
            with part_run(planner):
                summary = train_sft(SOLVER, examples[planner], cfg.model_copy(update={"max_steps": steps}),
                                    OUT[planner], CHECKPOINTS / planner, key_files=[TRAIN, SEARCH], seed=params.seed,
                                    name=f"sft {planner}", snapshots=SNAPSHOTS if planner == "internal" else None,
                                    curve=CURVE_DIR / f"sft_{planner}.csv")
            # the stage's run keeps each planner's summary, side by side
            mlflow.log_metrics({f"{planner}.{k}": v for k, v in summary.items() if k != "resumed_from"})


if __name__ == "__main__":
    main()
