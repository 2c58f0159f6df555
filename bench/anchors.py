"""How many of SePPO's anchors (the task's worked solution in each trajectory) the verifier rejects, on the first
training questions of the default task: the pairs ``seppo_sample`` now leaves out.

    python3 bench/anchors.py [--questions 300]      # no model or pipeline output needed; ~3 min on 2 cores

Prints the failures by trajectory, question kind and reason, and writes reports/bench/anchors.json.
"""
from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

from posttrain.evaluation import OWN_CHOICE, score_responses
from posttrain.params import load_params
from posttrain.preference_data import anchor_completion
from posttrain.sandbox import sandbox_limits
from posttrain.trajectories import TRAJECTORIES
from stages.prepare import synthetic_splits

OUT = Path("reports/bench/anchors.json")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=300, help="the first n training questions")
    args = ap.parse_args()
    params = load_params()
    train = synthetic_splits(params.task, params.prepare, params.seed)["train"][:args.questions]
    jobs = [(r, t.name) for r in train for t in TRAJECTORIES]
    start = time.perf_counter()
    verdicts = score_responses([r for r, _ in jobs], [OWN_CHOICE] * len(jobs),
                               [anchor_completion(r, f" {name}\n") for r, name in jobs],
                               sandbox_limits(params.sandbox), params.sandbox.workers)
    failed = [(r, name, v) for (r, name), v in zip(jobs, verdicts) if not v["correct"]]
    result = {"questions": len(train), "anchors": len(jobs), "failed": len(failed),
              "questions_with_a_failing_anchor": len({r["id"] for r, _, _ in failed}),
              "by_trajectory": dict(Counter(name for _, name, _ in failed)),
              "by_kind": dict(Counter(r.get("kind", "chain") for r, _, _ in failed)),
              "by_reason": dict(Counter(v["reason"] for _, _, v in failed)),
              "seconds": round(time.perf_counter() - start, 1)}
    print(json.dumps(result, indent=1))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
