"""Stage `prepare`: make the synthetic task (or ingest the user's JSONL) into train/dev/test splits.

Outputs data/prepared/{train,dev,test}.jsonl and data/prepared/summary.json (counts per split and
difficulty). No question or id is shared between splits.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import get_args

import mlflow
from posttrain.atomic import atomic_dir
from posttrain.errors import stage_main
from posttrain.params import load_params
from posttrain.params_schema import Params, PrepareParams, TaskParams
from posttrain.task.arithmetic import KINDS, Form, Op, Problem, generate_problems
from posttrain.task.records import DataError, find_split_overlaps, normalized_question, read_records
from posttrain.tracking import stage_run

OUT = "data/prepared"
SPLITS = ("train", "dev", "test")


def synthetic_splits(task: TaskParams, prep: PrepareParams, seed: int) -> dict[str, list[dict]]:
    """Distinct arithmetic questions, balanced by difficulty and form, cut into the three splits; no dev or test
    question is a train (or earlier split's) problem in other words: small operands leave few one-step problems,
    and "Compute 21 / 3." in test beside "Start with 21. Divide it by 3. What is the result?" in train was 9 of the
    40 one-step test questions."""
    sizes = {"train": prep.n_train, "dev": prep.n_dev, "test": prep.n_test}
    n = sum(sizes.values())
    extra = max(60, n // 10)
    while True:  # a pool a little larger than the splits, grown until dev and test find enough problems
        try:  # the pool's first n problems do not depend on its size
            pool = generate_problems(n + extra, seed, range(1, task.max_difficulty + 1), task.max_operand,
                                     task.max_value, kind_weights=task.kind_weights)
        except DataError:  # the task holds fewer distinct questions than that
            pool = None
        splits = split_pool(pool, sizes, prep.stratify_kinds) if pool else None
        if splits is not None:
            return splits
        if pool is None or extra >= 4 * n:
            raise DataError(f"the task has too few distinct problems for train {sizes['train']}, dev {sizes['dev']} "
                            f"and test {sizes['test']} with no problem in two splits: raise task.max_operand or "
                            "task.max_value, or lower the split sizes")
        extra *= 2


def split_pool(pool: list[Problem], sizes: dict[str, int], by_kind: bool = False) -> dict[str, list[dict]] | None:
    """The splits from ``pool`` (None if it runs short): each takes, per (difficulty, form), and per kind too with
    ``by_kind``, as many problems as ``pool``'s order gives it (train the first ``sizes['train']``), skipping after
    train the problems an earlier split holds (``problem_key``)."""
    def bucket_of(p: Problem) -> tuple:
        return (p.difficulty, p.form, p.kind) if by_kind else (p.difficulty, p.form)

    order = {id(p): i for i, p in enumerate(pool)}
    buckets: dict[tuple, list[Problem]] = {}
    for p in pool:
        buckets.setdefault(bucket_of(p), []).append(p)
    taken: set[tuple] = set()
    splits, start = {}, 0
    for name in SPLITS:
        wanted = Counter(bucket_of(p) for p in pool[start:start + sizes[name]])
        start += sizes[name]
        chunk = []
        for bucket, count in wanted.items():
            fresh = [p for p in buckets[bucket]
                     if name == "train" or problem_key(p, keep_bare_repeats=by_kind) not in taken][:count]
            if len(fresh) < count:
                return None
            used = {id(p) for p in fresh}
            buckets[bucket] = [p for p in buckets[bucket] if id(p) not in used]
            chunk += fresh
        taken |= {problem_key(p, keep_bare_repeats=by_kind) for p in chunk}
        chunk.sort(key=lambda p: order[id(p)])
        splits[name] = [
            {"id": f"{name}-{i:06d}", "question": p.question, "answer": p.answer, "difficulty": p.difficulty,
             **p.to_fields()}
            for i, p in enumerate(chunk)
        ]
    return splits


def problem_key(p: Problem, keep_bare_repeats: bool = False) -> tuple:
    """What the question asks, whatever its wording: the start value and the steps. A net-zero repeated block is
    wording too: its question restated (``rewrite``) is the problem without it, with the same answer.

    With ``keep_bare_repeats`` a question that is nothing but a start and net-zero blocks ("Start with 7. Add 4,
    then subtract 4, and repeat this 10 times.") keeps its blocks: it states its own answer, so no other split's
    question can leak it, and train holds every start value's bare form, so dev and test could take no one-step
    repeat question."""
    clean = tuple((s.op, s.operand) for s in p.steps if not s.repeat)
    if keep_bare_repeats and not clean:
        return p.start, tuple((s.op, s.operand, s.repeat) for s in p.steps)
    return p.start, clean


def resolve_overlaps(splits: dict[str, list[dict]], on_overlap: str) -> dict[str, list[dict]]:
    """Stop on ids/questions shared across splits, or drop them from the later split."""
    problems = find_split_overlaps(splits)
    if not problems:
        return splits
    if on_overlap == "error":
        raise DataError("splits overlap (set prepare.on_overlap: drop to drop them):\n  " + "\n  ".join(problems))
    seen_ids: set[str] = set()
    seen_questions: set[str] = set()
    cleaned = {}
    for name in SPLITS:
        kept = [r for r in splits[name]
                if r["id"] not in seen_ids and normalized_question(r["question"]) not in seen_questions]
        print(f"prepare: dropped {len(splits[name]) - len(kept)} overlapping records from {name}")
        seen_ids |= {r["id"] for r in kept}
        seen_questions |= {normalized_question(r["question"]) for r in kept}
        cleaned[name] = kept
    emptied = [name for name in SPLITS if splits[name] and not cleaned[name]]
    if emptied:  # an empty dev split failed the RL stages at their first dev evaluation, an empty test split evaluate
        raise DataError(f"splits overlap: dropping the overlaps leaves {' and '.join(emptied)} empty; give "
                        f"{' and '.join(emptied)} questions of their own")
    return cleaned


DOMAIN_FIELDS = ("form", "start", "steps")
USER_DATA = Path("user_data")  # prepare's dep in dvc.yaml: a change to a file under it re-runs prepare


def check_declared(files) -> None:
    """The user's files must lie under USER_DATA: DVC knows nothing of a path in params.yaml, only of the deps, so
    a file elsewhere could change and `dvc repro` would keep the old splits."""
    for name in SPLITS:
        path = Path(getattr(files, name))
        if USER_DATA.resolve() not in path.resolve().parents:
            raise DataError(f"task.jsonl.{name}: {path} is outside {USER_DATA}/, the directory dvc.yaml declares as "
                            f"prepare's dependency, so DVC would not re-run prepare when it changes; move it there")


def check_field_types(r: dict, where: str) -> None:
    """Each arithmetic field's shape: ``Problem.from_fields`` would cut 7.5 to 7 and read true as 1 (the row passing
    when its answer matched the cut values), and a kind that is no string broke dots_search without a row to name."""
    def whole(value, field: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise DataError(f"{where}: {field}: got {value!r}, expected a whole number")

    whole(r["start"], "start")
    if not isinstance(r["steps"], list) or not r["steps"]:
        raise DataError(f"{where}: steps: got {r['steps']!r}, expected a non-empty list of [op, operand] pairs")
    for i, step in enumerate(r["steps"]):
        if not isinstance(step, list) or len(step) not in (2, 3) or step[0] not in get_args(Op):
            raise DataError(f"{where}: steps[{i}]: got {step!r}, expected [op, operand] or [op, operand, repeats] "
                            f"with op one of {', '.join(get_args(Op))}")
        for k, value in enumerate(step[1:], 1):
            whole(value, f"steps[{i}][{k}]")
        if len(step) == 3 and step[2] < 1:
            raise DataError(f"{where}: steps[{i}][2]: got {step[2]}, expected a repeat count of at least 1")
    if r.get("kind", "chain") not in KINDS:
        raise DataError(f"{where}: kind: got {r['kind']!r}, expected one of {', '.join(KINDS)}")
    for i, value in enumerate(r.get("phrasing") or []):
        whole(value, f"phrasing[{i}]")
        if value < 0:  # a negative index would pick a template from the end
            raise DataError(f"{where}: phrasing[{i}]: got {value}, expected a template index of 0 or more")
    for i, distractor in enumerate(r.get("distractors") or []):
        if not isinstance(distractor, list) or len(distractor) != 2 or not isinstance(distractor[1], str):
            raise DataError(f"{where}: distractors[{i}]: got {distractor!r}, expected [step index, sentence]")
        whole(distractor[0], f"distractors[{i}][0]")


def problem_numbers(problem: Problem) -> list[int]:
    """The numbers a question of ``problem`` must state: its start, each operand and each repeat count."""
    return [problem.start] + [s.operand for s in problem.steps] + [s.repeat for s in problem.steps if s.repeat]


def check_domain_fields(records: list[dict], path: str) -> None:
    """The default pipeline renders every trajectory's worked solution (warm-up, DOTS, SFT) from the arithmetic
    domain's fields, so a user's row needs them, and they must compute its answer; raise DataError naming the file
    and row here rather than a KeyError in a later stage about data/prepared."""
    for r in records:
        where = f"{path}: row {r['id']!r}"
        missing = [f for f in DOMAIN_FIELDS if f not in r]
        if missing:
            raise DataError(f"{where}: {', '.join(missing)}: missing; the default pipeline renders each trajectory's "
                            "solution from the arithmetic fields form, start and steps (e.g. \"form\": \"expression\", "
                            "\"start\": 7, \"steps\": [[\"add\", 5], [\"mul\", 3]])")
        if r["form"] not in get_args(Form):
            raise DataError(f"{where}: form: got {r['form']!r}, expected one of {', '.join(get_args(Form))}")
        check_field_types(r, where)
        try:
            problem = Problem.from_fields(r)
            values = problem.values()
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
            raise DataError(f"{where}: steps: cannot be read as [op, operand] pairs ({e})") from None
        if values[-1] != r["answer"]:
            raise DataError(f"{where}: answer: {r['answer']}, but start and steps compute {values[-1]}")
        for i, (step, before) in enumerate(zip(problem.steps, values)):
            # integer chains: a worked solution writes 7 / 2 = 3, and its self-check fails
            if step.op == "div" and not step.repeat and before % step.operand:
                raise DataError(f"{where}: steps[{i}]: {before} / {step.operand} is not a whole number")
        try:  # the two forms every trajectory's prompt and rewrite are rendered from
            problem.words(), problem.expression()
        except (KeyError, IndexError, TypeError) as e:
            raise DataError(f"{where}: steps/phrasing: the question cannot be phrased ({type(e).__name__}: {e}); a "
                            "repeated block's op is add or mul, and a phrasing index must exist for its step's op")
        # the question the model reads must be the problem its worked solutions solve: every number of start and
        # steps appears in it (in any wording; a distractor's numbers may stand beside them)
        asked = set(re.findall(r"\d+", r["question"].replace(",", "")))
        absent = [str(n) for n in problem_numbers(problem) if str(abs(n)) not in asked]
        if absent:
            raise DataError(f"{where}: question: {r['question']!r} does not mention {', '.join(absent)} of its start "
                            "and steps; every trajectory's worked solution is rendered from those fields, so the "
                            "question must ask that problem")


def prepare(params: Params) -> dict[str, list[dict]]:
    task = params.task
    if task.source == "synthetic":
        splits = synthetic_splits(task, params.prepare, params.seed)
    else:
        if task.jsonl is None:
            raise DataError("task.jsonl: task.source is jsonl but no files are given ({train, dev, test})")
        splits = {name: read_records(getattr(task.jsonl, name)) for name in SPLITS}
        for name, records in splits.items():
            check_domain_fields(records, getattr(task.jsonl, name))
    return resolve_overlaps(splits, params.prepare.on_overlap)


@stage_main
def main() -> None:
    params = load_params()
    with stage_run("prepare", params, sections=["seed", "task", "prepare"]):
        if params.task.source == "jsonl" and params.task.jsonl is not None:
            check_declared(params.task.jsonl)
        splits = prepare(params)
        summary = {name: {"n": len(rs), "by_difficulty": dict(sorted(Counter(r["difficulty"] for r in rs).items()))}
                   for name, rs in splits.items()}
        with atomic_dir(OUT) as tmp:
            for name, rs in splits.items():
                (tmp / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rs), encoding="utf-8")
            (tmp / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        mlflow.log_metrics({f"n_{name}": len(rs) for name, rs in splits.items()})
        mlflow.log_dict(summary, "summary.json")
        counts = ", ".join(f"{name}={len(rs)}" for name, rs in splits.items())
        print(f"prepare: wrote {counts} to {OUT}/")


if __name__ == "__main__":
    main()
