"""Which solution (cot or pot) each policy chooses for each kind of question, and how often it is right with it.

RL on a reward the policy can shape through its trajectory choice shows up here first: on stop 57's committed run
`rlhf_routed`'s policy moved repeat questions (a net-zero repeated block, which a `cot` response cancels in one line
and a `pot` program must get right by looping) from cot to pot, where it is right far less often.

    python3 bench/trajectory_choice.py [models/sft models/rlhf ...] [--extra-test 960] [--threads 2]

Greedy own-choice responses on the test split (plus ``--extra-test`` fresh held-out questions), scored as the
`evaluate` stage scores them. Prints, per policy, the count and accuracy of every kind x solution, and the wrong
responses by why they are wrong (a wrong answer, no answer line, a program that failed); writes
reports/bench/trajectory_choice.json. Nothing is asserted.
"""
from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path

import torch

from held_out import held_out_questions
from posttrain.evaluation import OWN_CHOICE, score_responses
from posttrain.generation import HFGenerator
from posttrain.jsonl import read_jsonl
from posttrain.modeling import load_pretrained
from posttrain.params import load_params
from posttrain.sandbox import sandbox_limits
from posttrain.trajectories import Trajectory, prompt as open_prompt
from stages.rlhf_routed import DATA

OUT = Path("reports/bench/trajectory_choice.json")


def solution_of(trajectory: str | None) -> str:
    """``cot`` or ``pot`` from a trajectory name, ``none`` where the response named no trajectory it could parse."""
    return Trajectory.from_name(trajectory).solution if trajectory else "none"


def choice_table(rows: list[dict]) -> dict:
    """Per ``kind|solution`` (``all`` for either; rows without a kind count under ``all`` only): questions and
    accuracy; and the wrong rows by reason."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    wrong: Counter = Counter()
    for r in rows:
        kind, sol = r.get("kind", "all"), solution_of(r["trajectory"])
        for key in dict.fromkeys((f"{kind}|{sol}", f"{kind}|all", f"all|{sol}", "all|all")):
            counts[key][0] += 1
            counts[key][1] += r["correct"]
        if not r["correct"]:
            wrong[f"{kind}|{sol}|{'wrong answer' if r['predicted'] is not None else r['reason']}"] += 1
    return {"choices": {k: {"questions": n, "accuracy": round(c / n, 4)} for k, (n, c) in sorted(counts.items())},
            "wrong": dict(sorted(wrong.items()))}


def run() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("policies", nargs="*", default=["models/sft", "models/rlhf"])
    ap.add_argument("--extra-test", type=int, default=960, help="fresh held-out questions added to the test split")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: one per core)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    params = load_params("params.yaml")
    splits = {s: read_jsonl(DATA / f"{s}.jsonl") for s in ("train", "dev", "test")}
    test = splits["test"] + held_out_questions(params, args.extra_test, [r for s in splits.values() for r in s])
    tables = {}
    for policy in args.policies:
        tokenizer, model = load_pretrained(policy)
        completions = HFGenerator(model, tokenizer, 64, params.rlhf.max_new_tokens).generate(
            [open_prompt(r["question"]) for r in test], desc=policy)
        rows = score_responses(test, [OWN_CHOICE] * len(test), [c.text for c in completions],
                               sandbox_limits(params.sandbox), params.sandbox.workers)
        tables[policy] = choice_table(rows)
        print(f"\n{policy} ({len(test)} questions)")
        for key, c in tables[policy]["choices"].items():
            print(f"  {key:18}{c['questions']:6d} questions  accuracy {c['accuracy']:.3f}")
        for key, n in tables[policy]["wrong"].items():
            print(f"  wrong: {key:36}{n:5d}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"test_questions": len(test), "policies": tables}, indent=1))


if __name__ == "__main__":
    run()
