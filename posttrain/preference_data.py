"""Preference data: SePPO's reference samples turned into chosen/rejected pairs, and the held-out benchmark.

Training pairs (``training_pairs``), for one prompt: the anchor y_w (the task's worked solution, written in the
trajectory the reference sample chose, so the two differ in substance rather than in style; left out where the
verifier rejects it, ``anchor_correct``) against each reference sample the label calls a loser, and every
reference sample the label calls a winner against every one it calls a loser. The label is the task verifier or the anchor rule (AAF: the sample wins when h_w < 0);
both decisions are kept on every sample so their agreement can be measured.

Tie pairs (``tie_pairs``), for one prompt: two samples with the same label and different text, and the anchor
against each winner; the PM may train on them with target 1/2 (``train_rm.tie_share``).

Benchmark pairs (``benchmark_pairs``), from the test split only: responses of several checkpoints with
verifier verdicts, balanced by difficulty: decisive pairs (one right, one wrong: the label names the right
one) and hard tie pairs (both wrong with different answers; both right with different lengths).

Example:
    >>> samples = [{"id": "q1", "question": "Compute 2 + 3.", "anchor": " cot\\nAnswer: 5",
    ...             "anchor_correct": True, "response": " cot\\nAnswer: 6", "verifier_wins": False,
    ...             "anchor_wins": False}]
    >>> [(p["chosen"], p["rejected"]) for p in training_pairs(samples, "verifier")]
    [(' cot\\nAnswer: 5', ' cot\\nAnswer: 6')]
"""
from __future__ import annotations

import random
from collections import defaultdict
from itertools import combinations

from posttrain.task.arithmetic import Problem
from posttrain.task.records import DataError, normalized_question
from posttrain.task.solutions import render_response
from posttrain.trajectories import BY_NAME, split_choice


def anchor_completion(record: dict, sample: str) -> str:
    """The worked solution in the trajectory ``sample`` names (``cot`` when it names none); seppo_sample scores it
    (``anchor_correct``), since pot's brute force of a huge repeated block fails."""
    chosen, _ = split_choice(sample)
    trajectory = chosen or BY_NAME["cot"]
    return f" {trajectory.name}\n{render_response(Problem.from_fields(record), trajectory)}"


def assign_references(n_prompts: int, samples_per_prompt: int, n_references: int, seed: int) -> list[list[int]]:
    """For each prompt, the reference checkpoint of each sample, uniform over the earlier checkpoints."""
    rng = random.Random(seed)
    return [[rng.randrange(n_references) for _ in range(samples_per_prompt)] for _ in range(n_prompts)]


def _groups_by_prompt(samples: list[dict], label: str) -> tuple[str, list[list[dict]]]:
    """The sample key holding ``label``'s verdict, and the samples grouped by prompt id (first-seen order)."""
    if label not in ("verifier", "anchor"):
        raise ValueError(f"label must be 'verifier' or 'anchor', got {label!r}")
    by_prompt: dict[str, list[dict]] = defaultdict(list)
    for s in samples:
        by_prompt[s["id"]].append(s)
    return ("verifier_wins" if label == "verifier" else "anchor_wins"), list(by_prompt.values())


def training_pairs(samples: list[dict], label: str) -> list[dict]:
    """Chosen/rejected pairs from reference samples; ``label`` is ``verifier`` or ``anchor``."""
    key, groups = _groups_by_prompt(samples, label)
    pairs = []
    for group in groups:
        first = group[0]
        winners = [s for s in group if s[key]]
        losers = [s for s in group if not s[key]]
        for s in losers:  # a loser may be the anchor's own text (the anchor rule judges h_w, not the text)
            if s["anchor_correct"] and s["response"].strip() != s["anchor"].strip():
                pairs.append({"id": s["id"], "question": s["question"], "chosen": s["anchor"],
                              "rejected": s["response"], "source": "anchor_vs_reference", "label": label})
        for w in winners:
            for s in losers:
                if w["response"] != s["response"]:
                    pairs.append({"id": first["id"], "question": first["question"], "chosen": w["response"],
                                  "rejected": s["response"], "source": "reference_vs_reference", "label": label})
    return pairs


def tie_pairs(samples: list[dict], label: str) -> list[dict]:
    """Pairs the label calls a tie, as (a, b): two reference samples of a prompt with the same verdict (both
    winners or both losers) and different text, and each winner against its own anchor where they differ.

    Bradley-Terry pairs carry only "one is better", so a PM trained on them alone is taught no neutral answer
    and is confidently one-sided on ties; online RLHF samples mostly such pairs (both right or both wrong).
    """
    key, groups = _groups_by_prompt(samples, label)
    pairs = []
    for group in groups:
        first = group[0]
        texts = {verdict: list(dict.fromkeys(s["response"] for s in group if bool(s[key]) == verdict
                                              and s["response"].strip()))
                 for verdict in (True, False)}
        for verdict, found in texts.items():
            pairs += [{"id": first["id"], "question": first["question"], "a": a, "b": b, "label": label,
                       "source": "both_winners" if verdict else "both_losers"} for a, b in combinations(found, 2)]
        with_anchor = dict.fromkeys((s["anchor"], s["response"]) for s in group
                                    if s[key] and s["anchor_correct"] and s["response"].strip() != s["anchor"].strip())
        pairs += [{"id": first["id"], "question": first["question"], "a": anchor, "b": w, "label": label,
                   "source": "anchor_vs_winner"} for anchor, w in with_anchor]
    return pairs


def _pair(rec: dict, a: dict, b: dict, kind: str, rng: random.Random) -> dict:
    if rng.random() < 0.5:
        a, b = b, a
    if kind == "decisive":
        label = "A" if a["correct"] else "B"
    else:
        label = "tie"
    return {"id": rec["id"], "question": rec["question"], "difficulty": rec["difficulty"], "kind": kind,
            "a": a["response"], "b": b["response"], "a_source": a["source"], "b_source": b["source"],
            "a_correct": a["correct"], "b_correct": b["correct"], "label": label,
            "same_trajectory": a["trajectory"] == b["trajectory"]}


def benchmark_pairs(records: list[dict], responses: dict[str, list[dict]], pairs_per_difficulty: int,
                    hard_pairs_per_difficulty: int, seed: int) -> list[dict]:
    """Pairs balanced by difficulty; ``responses[id]`` holds dicts with response, correct, predicted,
    n_tokens, trajectory and source (the checkpoint). Questions are visited round-robin, one pair each per
    round, so no question dominates a difficulty."""
    rng = random.Random(seed)
    candidates: dict[tuple[int, str], dict[str, list[tuple[dict, dict]]]] = defaultdict(dict)
    for rec in records:
        rs = [r for r in responses.get(rec["id"], []) if r["response"].strip()]
        kinds = {"decisive": [], "both_wrong": [], "both_right": []}
        for a, b in combinations(rs, 2):
            if a["response"].strip() == b["response"].strip():
                continue  # a sample that reproduces the reference solution is no pair with it
            if a["correct"] != b["correct"]:
                kinds["decisive"].append((a, b))
            elif not a["correct"] and a["predicted"] != b["predicted"]:
                kinds["both_wrong"].append((a, b))
            elif a["correct"] and a["n_tokens"] != b["n_tokens"]:
                kinds["both_right"].append((a, b))
        for kind, found in kinds.items():
            if found:
                rng.shuffle(found)
                candidates[(rec["difficulty"], kind)][rec["id"]] = found
    by_id = {r["id"]: r for r in records}
    out = []
    for (difficulty, kind), per_question in sorted(candidates.items()):
        quota = pairs_per_difficulty if kind == "decisive" else hard_pairs_per_difficulty
        ids = sorted(per_question)
        rng.shuffle(ids)
        taken = 0
        while taken < quota and any(per_question[i] for i in ids):
            for i in ids:
                if per_question[i] and taken < quota:
                    out.append(_pair(by_id[i], *per_question[i].pop(), kind=kind, rng=rng))
                    taken += 1
    return out


def check_no_leakage(pairs: list[dict], train_records: list[dict], where: str) -> None:
    """Raise DataError if a benchmark question (by id or by text) is also a training question."""
    ids = {r["id"] for r in train_records}
    questions = {normalized_question(r["question"]) for r in train_records}
    leaked = sorted({p["id"] for p in pairs if p["id"] in ids or normalized_question(p["question"]) in questions})
    if leaked:
        raise DataError(f"{where}: {len(leaked)} benchmark questions are also training questions "
                        f"(first: {leaked[:3]}); build the benchmark from the test split only")
