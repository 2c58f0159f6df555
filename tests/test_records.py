"""JSONL ingest: a bad row stops with file:line: field: problem; split overlaps are reported."""
import json

import pytest

from posttrain.params import load_params
from posttrain.params_schema import JsonlFiles
from posttrain.task.records import DataError, find_split_overlaps, read_records
from stages.prepare import check_domain_fields, prepare, resolve_overlaps, synthetic_splits

GOOD = {"id": "a", "question": "Compute 1 + 1.", "answer": 2, "difficulty": 1}


def write(tmp_path, rows, name="data.jsonl"):
    path = tmp_path / name
    path.write_text("".join(r if isinstance(r, str) else json.dumps(r) + "\n" for r in rows))
    return path


def test_reads_good_rows_and_keeps_domain_fields(tmp_path):
    path = write(tmp_path, [GOOD, "\n", {**GOOD, "id": "b", "question": "Compute 1 + 2.", "form": "words", "answer": 3.0}])
    rows = read_records(path)
    assert [r["id"] for r in rows] == ["a", "b"] and rows[1]["form"] == "words" and rows[1]["answer"] == 3


@pytest.mark.parametrize("row, message", [
    ('{"id": "x", "question": ', ":2: (row): not valid JSON"),
    ("[1, 2]\n", ":2: (row): expected a JSON object"),
    ({**GOOD, "id": "b", "answer": "seven"}, ":2: answer: "),
    ({**GOOD, "id": "b", "answer": 2.5}, ":2: answer: "),
    ({**GOOD, "id": "b", "answer": True}, ":2: answer: "),
    ({**GOOD, "id": "b", "difficulty": 0}, ":2: difficulty: "),
    ({"id": "b", "answer": 1, "difficulty": 1}, ":2: question: missing"),
    ({**GOOD, "id": "b", "question": "   "}, ":2: question: "),
    ({**GOOD, "id": ""}, ":2: id: "),
    (GOOD, ":2: id: duplicate id 'a' (first on line 1)"),
    ({**GOOD, "id": " "}, ":2: id: "),
    ({**GOOD, "id": "b", "difficulty": True}, ":2: difficulty: "),  # was read as 1
    # the same question under another id, here in other case and spacing: it weighed twice
    ({**GOOD, "id": "b", "question": "compute  1 + 1."}, ":2: question: row 'b' asks the question of line 1 (row 'a')"),
    # valid JSON that Python will not read raised a bare ValueError naming no line
    ('{"id": "b", "question": "q", "answer": 1' + "0" * 4400 + ', "difficulty": 1}\n', ":2: (row): Exceeds"),
])
def test_bad_row_names_file_line_and_field(tmp_path, row, message):
    path = write(tmp_path, [GOOD, row])
    with pytest.raises(DataError) as e:
        read_records(path)
    assert str(e.value).startswith(f"{path}{message}"), str(e.value)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        read_records(tmp_path / "none.jsonl")
    with pytest.raises(DataError, match="no records"):
        read_records(write(tmp_path, ["\n"]))


def test_overlaps_reported_or_dropped():
    splits = {"train": [GOOD, {**GOOD, "id": "c", "question": "Q2"}],
              "dev": [{**GOOD, "id": "d"}], "test": [{**GOOD, "id": "c", "question": "Q3"}]}
    problems = find_split_overlaps(splits)
    assert "question 'Compute 1 + 1.' is in both train and dev" in problems
    assert "id 'c' is in both train and test" in problems
    with pytest.raises(DataError, match="splits overlap"):
        resolve_overlaps(splits, "error")
    # dropping them left dev and test empty: the RL stages then failed at their first dev evaluation
    with pytest.raises(DataError, match="dropping the overlaps leaves dev and test empty"):
        resolve_overlaps(splits, "drop")
    splits["dev"].append({**GOOD, "id": "e", "question": "Q4"})
    splits["test"].append({**GOOD, "id": "f", "question": "Q5"})
    cleaned = resolve_overlaps(splits, "drop")
    assert len(cleaned["train"]) == 2 and [r["id"] for r in cleaned["dev"] + cleaned["test"]] == ["e", "f"]


def test_a_question_differing_only_in_case_or_spacing_is_an_overlap():
    splits = {"train": [{**GOOD, "id": "a", "question": "Compute 7 + 5."}],
              "dev": [{**GOOD, "id": "d", "question": "compute  7 + 5. "}, {**GOOD, "id": "e", "question": "Q"}],
              "test": []}
    assert find_split_overlaps(splits) == ["question 'Compute 7 + 5.' is in both train and dev"]
    assert [r["id"] for r in resolve_overlaps(splits, "drop")["dev"]] == ["e"]


@pytest.mark.parametrize("profile", ["configs/params.smoke.yaml", "params.yaml"])
def test_synthetic_splits_share_nothing(profile):
    from posttrain.task.arithmetic import Problem
    from stages.prepare import problem_key

    p = load_params(profile)
    splits = synthetic_splits(p.task, p.prepare, p.seed)
    assert not find_split_overlaps(splits)
    # nor a problem in other words (10 of the default test split's 240 were train problems reworded)
    keys = {name: {problem_key(Problem.from_fields(r), keep_bare_repeats=p.prepare.stratify_kinds) for r in rs}
            for name, rs in splits.items()}
    assert not keys["train"] & keys["dev"] and not keys["train"] & keys["test"] and not keys["dev"] & keys["test"]
    assert [len(splits[s]) for s in ("train", "dev", "test")] == [p.prepare.n_train, p.prepare.n_dev, p.prepare.n_test]
    for name, records in splits.items():  # and the checks a user's rows go through pass the task's own
        check_domain_fields(records, name)


@pytest.mark.parametrize("profile", ["configs/params.smoke.yaml", "params.yaml"])
def test_no_dev_or_test_question_is_a_train_problem_padded_with_a_net_zero_block(profile):
    # "Start with 23. Multiply the result by 2. Add 4, then subtract 4, and repeat this 10 times. Divide by 2." in test
    # restates as train's "Compute (23 * 2) / 2.": 17 of the default test split's 240 were such train problems
    # (a bare repeat question, a start and net-zero blocks only, states its own answer: with stratify_kinds it is
    # its own problem)
    from posttrain.task.arithmetic import Problem
    from stages.prepare import problem_key

    p = load_params(profile)
    splits = synthetic_splits(p.task, p.prepare, p.seed)

    def key(r):
        return problem_key(Problem.from_fields(r), keep_bare_repeats=p.prepare.stratify_kinds)

    def padded(r):
        steps = Problem.from_fields(r).steps
        return any(s.repeat for s in steps) and any(not s.repeat for s in steps)

    every = {name: {key(r) for r in rs} for name, rs in splits.items()}
    for name, rs in splits.items():
        others = set().union(*(every[o] for o in splits if o != name))
        assert not {key(r) for r in rs if padded(r)} & others, name


def test_stratified_splits_give_test_the_repeat_share_its_slice_of_the_pool_drew():
    """By difficulty and form alone the default test split held 23 repeat questions (9.6%) against train's 19.3%:
    a short repeat question's clean form is usually a train problem, so its place went to another kind. With
    ``prepare.stratify_kinds`` dev and test keep each kind of their pool slice, one-step repeat questions included;
    train is the same, and no split shares a problem in other words."""
    from collections import Counter

    from posttrain.task.arithmetic import Problem, generate_problems
    from stages.prepare import problem_key

    p = load_params("params.yaml")
    plain = synthetic_splits(p.task, p.prepare.model_copy(update={"stratify_kinds": False}), p.seed)
    prep = p.prepare.model_copy(update={"stratify_kinds": True})
    splits = synthetic_splits(p.task, prep, p.seed)
    assert splits["train"] == plain["train"] and not find_split_overlaps(splits)
    n = prep.n_train + prep.n_dev + prep.n_test
    pool = generate_problems(n, p.seed, range(1, p.task.max_difficulty + 1), p.task.max_operand, p.task.max_value,
                             kind_weights=p.task.kind_weights)
    sliced = {"dev": pool[prep.n_train:prep.n_train + prep.n_dev], "test": pool[prep.n_train + prep.n_dev:]}
    for name in ("dev", "test"):
        assert Counter((r["difficulty"], r["form"], r["kind"]) for r in splits[name]) == \
            Counter((q.difficulty, q.form, q.kind) for q in sliced[name])
    by_difficulty = Counter(r["difficulty"] for r in splits["test"] if r["kind"] == "repeat")
    assert sum(by_difficulty.values()) > 23 and by_difficulty[1] > 0
    keys = {name: {problem_key(Problem.from_fields(r), keep_bare_repeats=True) for r in rs}
            for name, rs in splits.items()}
    assert not keys["train"] & keys["dev"] and not keys["train"] & keys["test"] and not keys["dev"] & keys["test"]
    for name, records in splits.items():
        check_domain_fields(records, name)


DOMAIN = {"form": "expression", "start": 1, "steps": [["add", 1]]}  # what the default pipeline renders from


def test_jsonl_source_goes_through_the_same_path(tmp_path):
    files = {s: write(tmp_path, [{**GOOD, **DOMAIN, "id": f"{s}1", "question": f"{s}: compute 1 + 1."}], f"{s}.jsonl")
             for s in ("train", "dev", "test")}
    p = load_params("configs/params.smoke.yaml")
    jsonl = JsonlFiles(**{k: str(v) for k, v in files.items()})
    p = p.model_copy(update={"task": p.task.model_copy(update={"source": "jsonl", "jsonl": jsonl})})
    splits = prepare(p)
    assert splits["dev"][0]["id"] == "dev1"
    write(tmp_path, [{**GOOD, **DOMAIN, "id": "t9", "question": "train: compute 1 + 1."}], "test.jsonl")
    with pytest.raises(DataError, match="question 'train: compute 1 \\+ 1.' is in both train and test"):
        prepare(p)


@pytest.mark.parametrize("row, problem", [
    (GOOD, r"dev.jsonl: row 'd1': form, start, steps: missing"),
    ({**GOOD, "form": "expression", "start": 1, "steps": [["add"]]}, r"dev.jsonl: row 'd1': steps\[0\]: got \['add'\]"),
    ({**GOOD, "form": "expression", "start": 1, "steps": [["pow", 2]]}, r"dev.jsonl: row 'd1': steps\[0\]: got \['pow'"),
    # a decimal or a boolean where a whole number goes was cut (7.5 -> 7, true -> 1) and passed with a matching answer
    ({**GOOD, "answer": 8, "form": "expression", "start": 7.5, "steps": [["add", 1]]},
     r"dev.jsonl: row 'd1': start: got 7.5, expected a whole number"),
    ({**GOOD, "answer": 2, "form": "expression", "start": 1, "steps": [["add", True]]},
     r"dev.jsonl: row 'd1': steps\[0\]\[1\]: got True, expected a whole number"),
    ({**GOOD, "answer": 2, "form": "expression", "start": 1, "steps": [["add", 1]], "kind": ["chain"]},
     r"dev.jsonl: row 'd1': kind: got \['chain'\], expected one of chain"),
    ({**GOOD, "answer": 2, "form": "words", "start": 1, "steps": [["add", 1]], "distractors": [["0", "x"]]},
     r"dev.jsonl: row 'd1': distractors\[0\]\[0\]: got '0', expected a whole number"),
    ({**GOOD, "form": "latex", "start": 1, "steps": [["add", 1]]}, r"dev.jsonl: row 'd1': form: got 'latex'"),
    ({**GOOD, "answer": 99, "form": "expression", "start": 1, "steps": [["add", 1]]},
     r"dev.jsonl: row 'd1': answer: 99, but start and steps compute 2"),
    # a floored division: the worked solution would write 7 / 2 = 3 and fail its own check
    ({**GOOD, "answer": 3, "form": "expression", "start": 7, "steps": [["div", 2]]},
     r"dev.jsonl: row 'd1': steps\[0\]: 7 / 2 is not a whole number"),
    # no wording for a repeated 'sub' block, or for a phrasing index past the templates: a bare error in base_model
    ({**GOOD, "answer": 5, "form": "words", "start": 5, "steps": [["sub", 2, 1000]]},
     r"dev.jsonl: row 'd1': steps/phrasing: the question cannot be phrased \(KeyError"),
    ({**GOOD, "answer": 2, "form": "words", "start": 1, "steps": [["add", 1]], "phrasing": [9]},
     r"dev.jsonl: row 'd1': steps/phrasing: the question cannot be phrased \(IndexError"),
    ({**GOOD, "answer": 2, "form": "words", "start": 1, "steps": [["add", 1]], "phrasing": ["0"]},
     r"dev.jsonl: row 'd1': phrasing\[0\]: got '0', expected a whole number"),
    # a negative index took a template from the end; a repeat count below 1 was phrased "repeat this -5 times"
    ({**GOOD, "answer": 2, "form": "words", "start": 1, "steps": [["add", 1]], "phrasing": [-1]},
     r"dev.jsonl: row 'd1': phrasing\[0\]: got -1, expected a template index of 0 or more"),
    ({**GOOD, "answer": 5, "form": "words", "start": 5, "steps": [["add", 2, -5]]},
     r"dev.jsonl: row 'd1': steps\[0\]\[2\]: got -5, expected a repeat count of at least 1"),
    # a question that is not the problem its fields (and so every worked solution) pose
    ({**GOOD, "question": "Compute 2 + 2.", "answer": 15, "form": "expression", "start": 7, "steps": [["add", 8]]},
     r"dev.jsonl: row 'd1': question: 'Compute 2 \+ 2.' does not mention 7, 8 of its start and steps"),
])
def test_a_user_row_the_pipeline_cannot_render_is_named_by_file_and_row(tmp_path, row, problem):
    files = {s: write(tmp_path, [{**GOOD, **DOMAIN, "id": f"{s}1", "question": f"{s}: compute 1 + 1."}], f"{s}.jsonl")
             for s in ("train", "test")}
    files["dev"] = write(tmp_path, [{"question": "dev question", **row, "id": "d1"}], "dev.jsonl")
    p = load_params("configs/params.smoke.yaml")
    jsonl = JsonlFiles(**{k: str(v) for k, v in files.items()})
    with pytest.raises(DataError, match=problem):
        prepare(p.model_copy(update={"task": p.task.model_copy(update={"source": "jsonl", "jsonl": jsonl})}))


def test_user_files_outside_the_declared_directory_are_refused(tmp_path, monkeypatch):
    from stages.prepare import check_declared

    monkeypatch.chdir(tmp_path)
    (tmp_path / "user_data").mkdir()
    inside = {s: f"user_data/{s}.jsonl" for s in ("train", "dev", "test")}
    check_declared(JsonlFiles(**inside))
    with pytest.raises(DataError, match=r"task.jsonl.dev: .*elsewhere.jsonl is outside user_data/"):
        check_declared(JsonlFiles(**{**inside, "dev": str(tmp_path / "elsewhere.jsonl")}))
