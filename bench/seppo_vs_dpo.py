"""SePPO vs DPO: the same SFT policy, the same winners and reference samples (data/seppo/samples.jsonl), the
same number of steps (params policy_opt); test accuracy of each resulting policy, per difficulty.

    python3 bench/seppo_vs_dpo.py [--seeds 1] [--n-test N]   # after `dvc repro` (needs models/sft, data/seppo)

Prints a table and writes reports/bench/seppo_vs_dpo.json; nothing here is asserted.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import mlflow

from posttrain.params import load_params
from posttrain.policy_accuracy import own_choice_accuracy
from posttrain.seppo import train_policy
from posttrain.tracking import bench_run

POLICY, SAMPLES, TEST = "models/sft", Path("data/seppo/samples.jsonl"), Path("data/prepared/test.jsonl")
OUT = Path("reports/bench/seppo_vs_dpo.json")


def run() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=1, help="training seeds per loss")
    ap.add_argument("--n-test", type=int, default=None, help="first n test questions (default: all)")
    args = ap.parse_args()
    params = load_params()
    samples = [json.loads(line) for line in SAMPLES.read_text().splitlines()]
    records = [json.loads(line) for line in TEST.read_text().splitlines()][:args.n_test]
    flips = sum(s["anchor_wins"] for s in samples) / len(samples)
    print(f"{len(samples)} anchor/reference pairs (AAF flips {flips:.2f} of them at the start), "
          f"{params.policy_opt.max_steps} steps, {len(records)} test questions")
    tokens = params.evaluate.max_new_tokens
    results = {"sft": own_choice_accuracy(POLICY, records, tokens, params.sandbox)}
    timing = {}
    for loss in ("seppo", "dpo"):
        for seed in range(args.seeds):
            with tempfile.TemporaryDirectory() as out:
                start = time.perf_counter()
                train_policy(POLICY, samples, params.policy_opt.model_copy(update={"loss": loss}), out,
                             params.seed + seed)
                timing[f"{loss}/{seed}"] = time.perf_counter() - start
                results[f"{loss}/{seed}"] = own_choice_accuracy(out, records, tokens, params.sandbox)
    diffs = sorted(results["sft"]["by_difficulty"], key=int)
    print(f"\n{'policy':14}" + "".join(f"{'d' + d:>7}" for d in diffs) + f"{'all':>7}{'train s':>9}")
    for name, s in results.items():
        print(f"{name:14}" + "".join(f"{s['by_difficulty'].get(d, 0):7.3f}" for d in diffs)
              + f"{s['accuracy']:7.3f}" + (f"{timing[name]:9.0f}" if name in timing else ""))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"results": results, "train_seconds": timing}, indent=1))
    mlflow.log_metrics({f"{name.replace('/', '.')}.accuracy": s["accuracy"] for name, s in results.items()})
    mlflow.log_artifact(str(OUT))
    print(f"\nwritten {OUT}")


def main() -> None:
    with bench_run("bench/seppo_vs_dpo", load_params()):
        run()


if __name__ == "__main__":
    main()
