"""Trajectory execution: verify's self-check triggers re-solves; planner training pairs."""
from posttrain.executor import TrajectoryExecutor, check_failed
from posttrain.generation import Completion
from posttrain.task.arithmetic import Problem, Step
from posttrain.task.solutions import render_response
from posttrain.trajectories import BY_NAME, prompt
from stages.sft import planner_examples

P = Problem(start=7, steps=(Step("add", 5), Step("mul", 3)), form="words")
REC = {"id": "q", "question": P.question, "answer": P.answer, "difficulty": 2, **P.to_fields()}
GOOD = render_response(P, BY_NAME["cot+verify"])
BAD = GOOD.replace("back to 7", "back to 9").replace("= 7;", "= 9;")


class ScriptedGenerator:
    """Returns the scripted completions for each prompt in turn (one per call)."""

    def __init__(self, script: dict[str, list[str]]):
        self.script = {k: list(v) for k, v in script.items()}
        self.calls = 0

    def generate(self, prompts, temperature=0.0, seed=0, desc="", progress=True):
        self.calls += 1
        return [Completion(self.script[p].pop(0), 10) for p in prompts]


def row(trajectory, response, reason="ok"):
    return {"trajectory": trajectory, "response": response, "reason": reason}


def test_check_failed():
    assert not check_failed(row("cot+verify", GOOD), 7)
    assert check_failed(row("cot+verify", BAD), 7)
    assert check_failed(row("cot+verify", "Step 1: 7 + 5 = 12\nAnswer: 12"), 7)  # check missing
    assert not check_failed(row("cot", "Answer: 1"), 7)  # no verify action, nothing to check
    assert check_failed(row("pot+verify", "", "error: AssertionError"), 7)
    assert not check_failed(row("pot+verify", "", "ok"), 7)


def test_failed_check_is_solved_again_up_to_the_bound():
    p = prompt(REC["question"], BY_NAME["cot+verify"])
    gen = ScriptedGenerator({p: [BAD.replace("Answer: 36", "Answer: 30"), GOOD]})
    (r,) = TrajectoryExecutor(gen, verify_retries=1).run([REC], [BY_NAME["cot+verify"]], temperature=0.4)
    assert r["correct"] and r["attempts"] == 2 and r["n_tokens"] == 20
    gen = ScriptedGenerator({p: [BAD, BAD, GOOD]})
    (r,) = TrajectoryExecutor(gen, verify_retries=1).run([REC], [BY_NAME["cot+verify"]], temperature=0.4)
    assert r["attempts"] == 2 and gen.calls == 2  # the bound holds: the third sample is never drawn
    p_cot = prompt(REC["question"], BY_NAME["cot"])
    gen = ScriptedGenerator({p_cot: ["Answer: 3"]})
    (r,) = TrajectoryExecutor(gen, verify_retries=3).run([REC], [BY_NAME["cot"]], temperature=0.4)
    assert not r["correct"] and r["attempts"] == 1  # no verify action: no retry


def test_planner_examples_use_only_kept_questions():
    search = [{"id": "q", "optimal": "rewrite+pot", "dropped": None}, {"id": "x", "optimal": None, "dropped": "all failed"}]
    ex = planner_examples(search, {"q": REC, "x": REC}, seed=0)
    assert len(ex["internal"]) == len(ex["external"]) == len(ex["vanilla"]) == 1
    assert ex["vanilla"][0]["prompt"] == f"Question: {REC['question']}\n" and "Trajectory" not in ex["vanilla"][0]["completion"]
    assert ex["external"][0] == {"prompt": prompt(REC["question"]), "completion": " rewrite+pot"}
    assert ex["internal"][0]["completion"] == " rewrite+pot\n" + render_response(P, BY_NAME["rewrite+pot"])


def test_every_reference_text_check_passes_its_own_self_check():
    """A rewrite drops a question's net-zero repeated block, so a one-step repeat question's check is
    'Verify: ; back to 15: correct', with no '= N' to read: all 103 such training questions' right answers were
    solved again as failed checks."""
    from posttrain.task.arithmetic import generate_problems
    from posttrain.trajectories import TRAJECTORIES

    problems = generate_problems(400, seed=0, difficulties=range(1, 5), max_operand=12, max_value=60,
                                 kind_weights={"chain": 0.25, "bignum": 0.25, "distractor": 0.25, "repeat": 0.25})
    checked = [t for t in TRAJECTORIES if t.verification == "verify" and t.solution == "cot"]
    failed = [(p.question, t.name) for p in problems for t in checked
              if check_failed(row(t.name, render_response(p, t)), p.start)]
    assert not failed, failed[:3]
    assert check_failed(row("rewrite+cot+verify", "Verify: ; back to 16: correct"), 15)
