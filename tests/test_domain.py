"""The arithmetic domain, the reference responses for all 12 trajectories, and their scoring."""
import random

import pytest

from posttrain.evaluation import score_responses
from posttrain.sandbox import SandboxLimits
from posttrain.task.arithmetic import Problem, Step, generate_problems, sample_problem
from posttrain.task.solutions import render_response
from posttrain.trajectories import BY_NAME, TRAJECTORIES, Trajectory, prompt, split_choice


def test_generation_is_seeded_distinct_and_balanced():
    a = generate_problems(120, seed=7, difficulties=range(1, 7), max_operand=20, max_value=200)
    b = generate_problems(120, seed=7, difficulties=range(1, 7), max_operand=20, max_value=200)
    assert [p.question for p in a] == [p.question for p in b]
    assert len({p.question for p in a}) == 120
    assert {p.difficulty for p in a} == set(range(1, 7))
    assert {p.form for p in a} == {"words", "expression"}
    c = generate_problems(120, seed=8, difficulties=range(1, 7), max_operand=20, max_value=200)
    assert [p.question for p in a] != [p.question for p in c]


@pytest.mark.parametrize("seed", range(20))
def test_values_stay_in_range_and_divisions_are_exact(seed):
    p = sample_problem(random.Random(seed), difficulty=6, form="words", max_operand=20, max_value=200)
    values = p.values()
    assert len(p.steps) == 6 and all(0 <= v <= 200 for v in values)
    for s, before in zip(p.steps, values):
        if s.op == "div":
            assert before % s.operand == 0
    assert p.answer == values[-1]


def test_expression_evaluates_to_the_answer():
    for p in generate_problems(60, seed=3, difficulties=range(1, 7), max_operand=20, max_value=200):
        assert eval(p.expression().replace("/", "//")) == p.answer  # noqa: S307 (our own generated text)


def test_too_small_a_space_is_an_error():
    with pytest.raises(ValueError, match="distinct questions"):
        generate_problems(500, seed=0, difficulties=range(1, 2), max_operand=2, max_value=10)


def test_twelve_distinct_trajectories_with_parseable_names():
    assert len(TRAJECTORIES) == 12 and len(BY_NAME) == 12
    for t in TRAJECTORIES:
        assert Trajectory.from_name(t.name) == t
    assert Trajectory.from_name("cot").n_actions == 1
    assert Trajectory.from_name("decompose+pot+verify").n_actions == 3
    for bad in ["", "cot+pot", "verify+cot", "rewrite", "cot+banana"]:
        with pytest.raises(ValueError):
            Trajectory.from_name(bad)


def test_open_prompt_round_trip():
    t = BY_NAME["rewrite+cot+verify"]
    assert prompt("Q?") + f" {t.name}\n" == prompt("Q?", t)
    chosen, rest = split_choice(" rewrite+cot+verify\nStep 1: ...")
    assert chosen == t and rest == "Step 1: ..."
    assert split_choice("garbage\nAnswer: 3")[0] is None


def test_every_reference_response_is_scored_correct():
    """Reference responses of all 12 trajectories, pot programs run in the sandbox, are all correct."""
    problems = generate_problems(24, seed=5, difficulties=range(1, 7), max_operand=20, max_value=200,
                                 kind_weights={"chain": 1, "bignum": 1, "distractor": 1, "repeat": 1})
    assert {p.kind for p in problems} == {"chain", "bignum", "distractor", "repeat"}
    records = [{"id": str(i), "answer": p.answer, "difficulty": p.difficulty} for i, p in enumerate(problems)]
    recs, fmts, texts = [], [], []
    for rec, p in zip(records, problems):
        for t in TRAJECTORIES:
            if p.kind == "repeat" and t.solution == "pot" and t.analysis != "rewrite":
                continue  # the loop: see test_repeat_kind
            recs.append(rec)
            fmts.append(t.name)
            texts.append(render_response(p, t))
        recs.append(rec)
        fmts.append("own_choice")
        own = "rewrite+pot" if p.kind == "repeat" else "decompose+pot"
        texts.append(f" {own}\n" + render_response(p, BY_NAME[own]))
    rows = score_responses(recs, fmts, texts)
    wrong = [(r["format"], r["reason"]) for r in rows if not r["correct"]]
    assert not wrong


def test_wrong_response_is_scored_wrong():
    p = Problem(start=7, steps=(Step("add", 5), Step("mul", 3)), form="words")
    wrong_program = render_response(p, BY_NAME["pot"]).replace("x * 3", "x * 4")
    rows = score_responses([{"id": "a", "answer": p.answer, "difficulty": 2}] * 3, ["cot", "pot", "pot+verify"],
                           ["Answer: 35", wrong_program, render_response(p, BY_NAME["pot+verify"]).replace("== 7", "== 8")])
    assert [r["correct"] for r in rows] == [False, False, False]
    assert rows[2]["reason"].startswith("error: AssertionError")


def test_final_answers_need_no_reference_and_run_programs():
    from posttrain.rlhf import final_answers

    p = Problem(start=7, steps=(Step("add", 5), Step("mul", 3)), form="words")
    texts = [" cot\n" + render_response(p, BY_NAME["cot"]), " pot\n" + render_response(p, BY_NAME["pot"]),
             " pot\n" + render_response(p, BY_NAME["pot"]).replace("x * 3", "x * 4"), " cot\nno answer here"]
    assert final_answers(texts) == [36, 36, 48, None]


def test_question_kinds():
    problems = generate_problems(300, seed=2, difficulties=range(1, 7), max_operand=12, max_value=60,
                                 kind_weights={"chain": 0.5, "bignum": 0.25, "distractor": 0.25})
    by_kind = {k: [p for p in problems if p.kind == k] for k in ("chain", "bignum", "distractor")}
    assert 100 < len(by_kind["chain"]) < 200 and len(by_kind["bignum"]) > 40 and len(by_kind["distractor"]) > 40
    assert all(max(p.values()) <= 60 for p in by_kind["chain"])
    assert all(any(s.operand >= 11 for s in p.steps) and "div" not in {s.op for s in p.steps} for p in by_kind["bignum"])
    for p in by_kind["distractor"]:
        assert p.form == "words" and p.distractors
        assert all(text in p.question for _, text in p.distractors)
        # rewrite restates the question as the clean expression: the distractors are gone
        rewrite = render_response(p, BY_NAME["rewrite+cot"]).splitlines()[0]
        assert rewrite == f"Rewrite: Compute {p.expression()}." and not any(t in rewrite for _, t in p.distractors)
        assert Problem.from_fields({**p.to_fields()}) == p


def test_repeat_kind():
    """A net-zero block repeated n times: text and a rewrite solve it at once, a brute-force loop only when n is small."""
    problems = generate_problems(200, seed=3, difficulties=range(1, 7), max_operand=12, max_value=60,
                                 kind_weights={"repeat": 1})
    assert all(p.form == "words" and sum(1 for s in p.steps if s.repeat) == 1 for p in problems)
    assert all(p.answer == p.without_repeats().answer and len(p.steps) == p.difficulty for p in problems)
    assert all(Problem.from_fields(p.to_fields()) == p for p in problems)
    small = next(p for p in problems if max(s.repeat for s in p.steps) <= 1000 and p.difficulty == 3)
    huge = next(p for p in problems if max(s.repeat for s in p.steps) >= 10**8 and p.difficulty == 3)
    for p in (small, huge):
        block = next(s for s in p.steps if s.repeat)
        assert f"{block.repeat} times" in p.question
        rewrite = render_response(p, BY_NAME["rewrite+pot"])
        assert rewrite.splitlines()[0] == f"Rewrite: Compute {p.expression()}." and "for _ in" not in rewrite
        assert "for _ in range" in render_response(p, BY_NAME["pot"])
    recs = [{"id": p.question, "answer": p.answer, "difficulty": 3} for p in (small, huge) for _ in range(4)]
    fmts = ["pot", "cot+verify", "rewrite+pot", "decompose+cot"] * 2
    texts = [render_response(p, BY_NAME[f]) for p in (small, huge) for f in fmts[:4]]
    rows = score_responses(recs, fmts, texts, SandboxLimits(cpu_seconds=1, wall_seconds=3.0))
    assert [r["correct"] for r in rows] == [True] * 4 + [False, True, True, True]
    assert rows[4]["predicted"] is None and rows[4]["reason"]  # the huge loop: no answer, with a reason
