"""Fresh held-out test questions for benches whose curves one test question (0.004 of 240) would rule."""
from __future__ import annotations

from posttrain.task.arithmetic import generate_problems


TEST_SEED_OFFSET = 7_919  # the extra test questions every bench has drawn since stop 70
TRAIN_SEED_OFFSET = 104_729  # extra training questions: another stream, so they never are the extra test's


def held_out_questions(params, n: int, taken: list[dict], seed_offset: int = TEST_SEED_OFFSET,
                       prefix: str = "heldout") -> list[dict]:
    """About ``n`` more questions of the task (``task`` params), none of them in ``taken`` (train, dev, test and any
    extras drawn before): n // difficulties of each difficulty (so a multiple of the difficulty count gives exactly
    n), drawn with a seed prepare never uses, so they are new draws of the same task."""
    task, levels = params.task, range(1, params.task.max_difficulty + 1)
    problems = generate_problems(2 * n + len(taken), params.seed + seed_offset, levels, task.max_operand, task.max_value,
                                 kind_weights=task.kind_weights)
    seen = {r["question"] for r in taken}
    by_level: dict[int, list] = {d: [] for d in levels}
    for problem in problems:
        if problem.question not in seen and len(by_level[problem.difficulty]) < n // len(levels):
            by_level[problem.difficulty].append(problem)
    fresh = [problem for d in levels for problem in by_level[d]]
    return [{"id": f"{prefix}-{i:06d}", "question": p.question, "answer": p.answer, "difficulty": p.difficulty,
             **p.to_fields()} for i, p in enumerate(fresh)]
