"""Judge client throughput against the local judge service: pairs/s cold (every pair an HTTP call, both
orders) and warm (the same pairs again, all from the SQLite cache), at a few concurrency levels.

    python3 bench/judge.py [--pairs 400] [--latency 0.0]     # needs data/prepared (after `dvc repro prepare`)

Prints a table; nothing here is asserted.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from posttrain.judge_client import JudgeCache, JudgeClient
from posttrain.judge_server import JudgeService, build_app, verifier_backend
from posttrain.params import load_params
from posttrain.task.arithmetic import Problem
from posttrain.task.solutions import render_response
from posttrain.trajectories import BY_NAME


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=400)
    ap.add_argument("--latency", type=float, default=0.0, help="added service latency per request (s)")
    args = ap.parse_args()
    params = load_params()
    records = [json.loads(line) for line in Path("data/prepared/test.jsonl").read_text().splitlines()]
    pairs = []
    for i in range(args.pairs):
        rec = records[i % len(records)]
        right = " cot\n" + render_response(Problem.from_fields(rec), BY_NAME["cot"])
        pairs.append((rec["question"], right, f" cot\nAnswer: {rec['answer'] + 1 + i // len(records)}"))
    print(f"{args.pairs} pairs, both orders asked, service latency {args.latency} s")
    print(f"{'concurrency':>12}{'cold pairs/s':>14}{'warm pairs/s':>14}{'calls':>8}{'cache hits':>12}")
    with JudgeService(build_app(verifier_backend(records), params.judge.model, latency_s=args.latency)) as svc:
        for concurrency in (1, 4, 16):
            cfg = params.judge.model_copy(update={"concurrency": concurrency, "both_orders": True})
            with tempfile.TemporaryDirectory() as tmp:
                client = JudgeClient(cfg, svc.base_url, JudgeCache(Path(tmp) / "cache.sqlite"))
                start = time.perf_counter()
                cold = client.judge(pairs)
                cold_s = time.perf_counter() - start
                start = time.perf_counter()
                warm = client.judge(pairs)
                warm_s = time.perf_counter() - start
            assert cold == warm, "the cache changed a verdict"
            print(f"{concurrency:>12}{len(pairs) / cold_s:>14.1f}{len(pairs) / warm_s:>14.1f}"
                  f"{client.ledger.calls:>8}{client.ledger.cache_hits:>12}")
            client.close()


if __name__ == "__main__":
    main()
