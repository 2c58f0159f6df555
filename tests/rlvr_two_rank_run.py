"""Run by tests/test_rlvr_trainer.py under `torchrun --standalone --nproc_per_node 2` (a fresh process group, and no
process left behind in the test's own): each rank brings its own prompt ("easy" on rank 0, "hard" on rank 1) into one
AR3PO step whose generation is a stub, and writes what it saw to <workdir>/rank<r>.json.

    python3 -m torch.distributed.run --standalone --nproc_per_node 2 tests/rlvr_two_rank_run.py <workdir>
"""
import json
import os
import sys
from pathlib import Path

from test_rlvr_trainer import make_trainer  # this script's folder is on sys.path
from tiny_model import tiny_scratch_model

from posttrain.rollout import Response
from posttrain.trajectories import prompt

work, rank = Path(sys.argv[1]), int(os.environ["RANK"])
tiny = tiny_scratch_model(work / f"tiny{rank}", n_problems=12, seed=4)  # the same problems on both ranks
trainer = make_trainer(tiny, work / f"rank{rank}", "ar3po", stages=2, k=2)
hard, easy = prompt(tiny.records[0]["question"]), prompt(tiny.records[1]["question"])
calls = []


def sample(prompts, k):  # "hard" is never solved, "easy" always; completions of 2 tokens
    calls.append(prompts)
    return [[Response(p, "x", float(p == easy), 2, (tiny.tok(p, add_special_tokens=False)["input_ids"], [8, 9]))
             for _ in range(k)] for p in prompts]


trainer._sample = sample
batch = trainer._generate_and_score_completions([{"prompt": easy if rank == 0 else hard, "difficulty": 1}] * 2)
(work / f"rank{rank}.json").write_text(json.dumps({
    "calls": [[p == easy for p in c] for c in calls], "rows": batch["completion_ids"].shape[0],
    "masked_rows": int((batch["completion_mask"].sum(1) == 0).sum()),
    "advantages": batch["advantages"].tolist(), "num_items_in_batch": int(batch["num_items_in_batch"]),
    "totals": {k: v for k, v in trainer.totals.items() if k != "generation_seconds"}}))  # wall time is each rank's
