"""Pre-rollout filtering of solved prompts (rlvr.skip_solved): which groups mark a prompt solved, how often a solved
prompt gives way, what stands in for it, and that the filter's state survives a checkpoint."""
import json
import random

import pytest

from posttrain.rollout import Response
from posttrain.solved_prompts import SolvedPrompts


def group(prompt: str, *rewards: float, reused: int = -1) -> list[Response]:
    return [Response(prompt, f"r{i}", r, 3, reused=i == reused) for i, r in enumerate(rewards)]


def test_only_a_group_of_generated_correct_responses_marks_its_prompt_solved():
    solved = SolvedPrompts(0.5)
    solved.record({"all": group("all", 1, 1), "mixed": group("mixed", 1, 0), "none": group("none", 0, 0),
                   # a reused correct response stands in for a wrong one: the policy itself solved nothing
                   "reused": group("reused", 0, 1, reused=1)})
    assert solved.solved == {"all"}
    solved.record({"all": group("all", 1, 0, 0, 1)})  # the next visit has a wrong response: unsolved again
    assert solved.solved == set()


def test_off_returns_the_prompts_untouched_and_draws_nothing():
    solved = SolvedPrompts(0.0)
    solved.record({"a": group("a", 1, 1)})
    stream = iter(["x", "y"])
    assert solved.select(["a", "b"], stream) == (["a", "b"], 0)
    assert next(stream) == "x"


def test_a_skipped_prompt_gives_way_to_a_fresh_unsolved_one_not_already_in_the_step():
    solved = SolvedPrompts(0.999, seed=1)
    solved.record({p: group(p, 1, 1) for p in ("s1", "s2", "s3")})
    # the stream offers a prompt already in the step, solved ones, a duplicate, then fresh unsolved ones
    kept, skipped = solved.select(["s1", "u1", "s2"], iter(["u1", "s3", "f1", "f1", "s1", "f2", "f3"]))
    assert skipped == 2 and kept == ["u1", "f1", "f2"]


def test_a_solved_prompt_is_skipped_with_probability_p():
    solved = SolvedPrompts(0.3, seed=0)
    solved.record({"s": group("s", 1, 1)})
    fresh = (f"f{i}" for i in range(10**6))
    skips = sum(solved.select(["s"], fresh)[1] for _ in range(4000))
    assert skips / 4000 == pytest.approx(0.3, abs=0.03)


def test_a_stream_of_solved_prompts_leaves_the_step_short_but_never_below_the_minimum():
    solved = SolvedPrompts(0.999, seed=0)
    solved.record({p: group(p, 1, 1) for p in "abcd"})
    kept, skipped = solved.select(list("abc"), iter(["d"] * 1000), min_prompts=2, max_draws_each=5)
    assert skipped == 3 and kept == ["a", "b"]  # no fresh prompt passed: the step's own make up the minimum


def test_skip_probability_must_leave_solved_prompts_a_way_back():
    with pytest.raises(ValueError, match="skip probability 1"):
        SolvedPrompts(1.0)


def test_the_state_round_trips_and_the_restored_filter_decides_alike():
    solved = SolvedPrompts(0.5, seed=3)
    solved.record({p: group(p, 1, 1) for p in "abcdef"})
    solved.select(list("abc"), iter("ghijkl"))
    restored = SolvedPrompts(0.5, seed=99)
    restored.load_state_dict(json.loads(json.dumps(solved.state_dict())))
    assert restored.solved == solved.solved
    rng = random.Random(7)
    stream = [rng.choice("abcdefghij") for _ in range(50)]
    assert restored.select(list("def"), iter(stream)) == solved.select(list("def"), iter(stream))
