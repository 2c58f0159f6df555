"""The benches' fresh questions: extra training questions (bench/rlvr.py --extra-train) are never test questions,
and the extra test questions stay the draw every earlier bench measured on."""
import sys
from pathlib import Path

from posttrain.params import load_params

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from held_out import TRAIN_SEED_OFFSET, held_out_questions  # noqa: E402


def test_extra_training_questions_are_fresh_balanced_and_not_test_questions():
    params = load_params(REPO / "params.yaml")
    taken = [{"question": "Start with 1. Add 1. What is the result?"}]
    test = held_out_questions(params, 120, taken)
    train = held_out_questions(params, 240, taken + test, TRAIN_SEED_OFFSET, "train-extra")
    levels = params.task.max_difficulty
    assert len(train) == 240 and len({r["question"] for r in train}) == 240
    assert not {r["question"] for r in train} & {r["question"] for r in test + taken}
    assert {d: sum(r["difficulty"] == d for r in train) for d in range(1, levels + 1)} == \
        {d: 240 // levels for d in range(1, levels + 1)}
    assert all(r["id"].startswith("train-extra-") for r in train)
    # without the test questions in ``taken`` the two streams are still different draws, not one stream twice
    assert len({r["question"] for r in held_out_questions(params, 120, taken, TRAIN_SEED_OFFSET)}
               & {r["question"] for r in test}) < 12
    assert held_out_questions(params, 120, taken) == test  # the extra test draw is deterministic
