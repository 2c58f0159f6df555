"""Sharded evaluation: wall time with 1 vs 2 Ray workers on this machine, against one in-process worker, and
the scheduling overhead per shard.

    python3 bench/evaluate_workers.py [--n-test 60] [--shard-size 10] [--model models/warmup]

Same shards, same model, three runs: in-process with one torch thread (the work without Ray), Ray with 1
worker (1 CPU) and Ray with 2 workers. Overhead per shard = (Ray 1 worker - in-process) / shards: Ray's start,
Prefect's task runs, model loading per shard. Checks that every run gave the same rows; prints a table and
writes reports/bench/evaluate_workers.json. Nothing is asserted about speed.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from posttrain.params import load_params
from posttrain.sharded_evaluation import plan_shards, run_shards

OUT = Path("reports/bench/evaluate_workers.json")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-test", type=int, default=60)
    ap.add_argument("--shard-size", type=int, default=10)
    ap.add_argument("--model", default="models/warmup")
    ap.add_argument("--formats", nargs="+", default=["pot", "cot", "own_choice"])
    args = ap.parse_args()
    params = load_params()
    records = [json.loads(line) for line in Path("data/prepared/test.jsonl").read_text().splitlines()][:args.n_test]
    shards = plan_shards({"bench": ("model", tuple(args.formats))}, len(records), args.shard_size,
                         {"bench": args.model})
    runs, rows = {}, {}
    for label, workers in (("in-process, 1 thread", 0), ("ray, 1 worker", 1), ("ray, 2 workers", 2)):
        cfg = params.evaluate.model_copy(update={"workers": workers, "shard_size": args.shard_size})
        if workers == 0:
            os.environ["OMP_NUM_THREADS"] = "1"  # the same one thread per shard that a Ray worker has
        start = time.perf_counter()
        rows[label] = run_shards(shards, records, params.model_copy(update={"evaluate": cfg}))
        runs[label] = time.perf_counter() - start
        os.environ.pop("OMP_NUM_THREADS", None)
        print(f"{label}: {runs[label]:.1f} s for {len(shards)} shards")
    same = all(r == rows["in-process, 1 thread"] for r in rows.values())
    base, one, two = runs["in-process, 1 thread"], runs["ray, 1 worker"], runs["ray, 2 workers"]
    result = {"shards": len(shards), "answers": sum(map(len, rows["ray, 2 workers"])), "seconds": runs,
              "speedup_2_vs_1_worker": one / two, "overhead_per_shard_s": (one - base) / len(shards),
              "identical_rows": same}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1))
    print(f"\n{len(shards)} shards, {result['answers']} answers; 2 workers vs 1: {result['speedup_2_vs_1_worker']:.2f}x; "
          f"scheduling overhead {result['overhead_per_shard_s']:.2f} s per shard; identical rows: {same}")


if __name__ == "__main__":
    main()
