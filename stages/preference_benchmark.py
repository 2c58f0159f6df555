"""Stage `preference_benchmark`: held-out response pairs with verifier ground truth, from the test split only.

Every checkpoint of the SFT run (the warm-up model, the sft snapshots and the final SFT model) answers every
test question ``samples_per_checkpoint`` times at ``temperature``; the verifier judges each response. With
``reference_solutions``, the verified solution (cot) joins each question's responses. Pairs
of responses to the same question are then drawn balanced by difficulty (``benchmark_pairs``): decisive
pairs (one right, one wrong) and hard tie pairs (both wrong with different answers, both right with
different lengths). A benchmark question that is also a training question stops the stage.

Writes data/preference_benchmark/pairs.jsonl and reports/metrics/preference_benchmark.json (counts).
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import mlflow

from posttrain.atomic import atomic_dir, atomic_write_json
from posttrain.errors import stage_main
from posttrain.evaluation import OWN_CHOICE, score_responses
from posttrain.generation import HFGenerator
from posttrain.jsonl import read_jsonl
from posttrain.modeling import load_pretrained
from posttrain.params import load_params
from posttrain.preference_data import anchor_completion, benchmark_pairs, check_no_leakage
from posttrain.seppo import reference_checkpoints
from posttrain.sandbox import sandbox_limits
from posttrain.task.records import DataError
from posttrain.tracking import stage_run
from posttrain.trajectories import prompt

TRAIN, TEST = Path("data/prepared/train.jsonl"), Path("data/prepared/test.jsonl")
WARMUP, SNAPSHOTS, POLICY = "models/warmup", Path("models/sft_checkpoints"), "models/sft"
OUT, METRICS = Path("data/preference_benchmark"), Path("reports/metrics/preference_benchmark.json")


@stage_main
def main() -> None:
    params = load_params()
    cfg = params.preference_benchmark
    with stage_run("preference_benchmark", params, sections=["seed", "preference_benchmark"]):
        records = read_jsonl(TEST)
        responses: dict[str, list[dict]] = defaultdict(list)
        for j, source in enumerate([*reference_checkpoints(WARMUP, SNAPSHOTS), POLICY]):
            tokenizer, model = load_pretrained(source)
            gen = HFGenerator(model, tokenizer, cfg.batch_size, cfg.max_new_tokens)
            jobs = [rec for rec in records for _ in range(cfg.samples_per_checkpoint)]
            completions = gen.generate([prompt(rec["question"]) for rec in jobs], cfg.temperature,
                                       seed=params.seed + 1000 + j, desc=f"benchmark {Path(source).name}")
            rows = score_responses(jobs, [OWN_CHOICE] * len(jobs), [c.text for c in completions],
                                   sandbox_limits(params.sandbox), params.sandbox.workers)
            for rec, c, row in zip(jobs, completions, rows):
                responses[rec["id"]].append({"response": c.text, "n_tokens": c.n_tokens, "correct": row["correct"],
                                             "predicted": row["predicted"], "trajectory": row["trajectory"],
                                             "source": Path(source).name})
        if cfg.reference_solutions:
            for rec in records:
                text = anchor_completion(rec, " cot")
                responses[rec["id"]].append({"response": text, "n_tokens": len(tokenizer(text)["input_ids"]),
                                             "correct": True, "predicted": rec["answer"], "trajectory": "cot",
                                             "source": "reference_solution"})
        pairs = benchmark_pairs(records, responses, cfg.pairs_per_difficulty, cfg.hard_pairs_per_difficulty,
                                params.seed)
        if not any(p["label"] != "tie" for p in pairs):
            raise DataError(f"{TEST}: no question has both a right and a wrong response among the checkpoints; "
                            "raise preference_benchmark.samples_per_checkpoint or temperature")
        check_no_leakage(pairs, read_jsonl(TRAIN), str(OUT / "pairs.jsonl"))
        with atomic_dir(OUT) as tmp:
            (tmp / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs), encoding="utf-8")
        counts = Counter((p["kind"], p["difficulty"]) for p in pairs)
        metrics = {"n_pairs": len(pairs),
                   "pairs": {kind: {str(d): counts[(kind, d)] for d in sorted({p["difficulty"] for p in pairs})}
                             for kind in ("decisive", "both_wrong", "both_right")},
                   "label_A_share": sum(p["label"] == "A" for p in pairs)
                   / max(1, sum(p["label"] != "tie" for p in pairs))}
        atomic_write_json(METRICS, metrics)
        mlflow.log_metric("n_pairs", len(pairs))
        mlflow.log_dict(metrics, "preference_benchmark.json")
        print(f"preference_benchmark: {len(pairs)} pairs: {json.dumps(metrics['pairs'])}")


if __name__ == "__main__":
    main()
