"""Own-choice accuracy of saved policies: greedy, on the test split and on fresh held-out questions of the same
task, overall and per difficulty. For comparing policies trained apart, e.g. in copies of the workspace with other
params (the warm-up's length, the model's size), without a pipeline run of their own.

    python3 bench/own_choice.py models/warmup models/sft                     # in a workspace after `dvc repro`
    python3 bench/own_choice.py models/sft /tmp/ws/models/sft --held-out 1200 --out reports/bench/own_choice.json

Every model answers the same questions: the test split (240 by default, one question = 0.004) and --held-out N
fresh ones (bench/held_out.py; 0.0008 each at 1,200), with ``evaluate.max_new_tokens`` and the sandbox from
params.yaml. Prints a table and writes the JSON; nothing here is asserted.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import mlflow

from held_out import held_out_questions
from posttrain.jsonl import read_jsonl
from posttrain.params import load_params
from posttrain.policy_accuracy import own_choice_accuracy
from posttrain.tracking import bench_run

SPLITS = "data/prepared"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="saved policy directories")
    ap.add_argument("--held-out", type=int, default=1200, help="fresh held-out questions (a multiple of the "
                    "difficulty count gives exactly N)")
    ap.add_argument("--out", type=Path, default=Path("reports/bench/own_choice.json"))
    args = ap.parse_args()
    for model in args.models:
        if not (Path(model) / "config.json").is_file():
            raise SystemExit(f"{model}: not a saved model directory (no config.json)")

    params = load_params()
    splits = {s: read_jsonl(f"{SPLITS}/{s}.jsonl") for s in ("train", "dev", "test")}
    question_sets = {"test": splits["test"],
                     "held_out": held_out_questions(params, args.held_out, [r for s in splits.values() for r in s])}
    max_new_tokens = params.evaluate.max_new_tokens
    results: dict[str, dict] = {}
    with bench_run("own_choice", params):
        for model in args.models:
            results[model] = {}
            for name, records in question_sets.items():
                summary = own_choice_accuracy(model, records, max_new_tokens, params.sandbox)
                results[model][name] = {"questions": len(records), "accuracy": summary["accuracy"],
                                        "by_difficulty": summary["by_difficulty"]}
            print(f"{model}: test {results[model]['test']['accuracy']:.4f}, "
                  f"held-out {results[model]['held_out']['accuracy']:.4f}", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))
        mlflow.log_artifact(str(args.out))

    print(f"\n{'model':<48} {'test':>7} {'held-out':>9}  held-out by difficulty")
    for model, r in results.items():
        by_d = "  ".join(f"d{d} {a:.3f}" for d, a in r["held_out"]["by_difficulty"].items())
        print(f"{model:<48} {r['test']['accuracy']:>7.4f} {r['held_out']['accuracy']:>9.4f}  {by_d}")
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
