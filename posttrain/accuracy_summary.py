"""A system's accuracy summed up from scored rows (``posttrain.evaluation.score_responses``), and which of its
figures are its own choice's.

Apart from the scoring, which runs programs in the sandbox: the report and the pipeline's summary read these figures
without depending on the sandbox, so a change there does not rebuild them.

Example:
    >>> rows = [{"id": "q1", "difficulty": 1, "format": "own_choice", "trajectory": "cot", "correct": True}]
    >>> own_choice(summarize(rows, [12]))["accuracy"]
    1.0
"""
from __future__ import annotations

from collections import Counter, defaultdict

from posttrain.trajectories import BY_NAME

OWN_CHOICE = "own_choice"
# the systems evaluate scores, in the pipeline's order (the report's rows, the pipeline run's summary lines)
SYSTEM_ORDER = ("warmup", "sft_vanilla", "dots_internal", "dots_external", "rlhf", "rlvr")
OWN_WAY_FORMATS = {"external", "vanilla"}  # the one format of a system that answers its own way (no trajectory named)


def summarize(rows: list[dict], n_tokens: list[int]) -> dict:
    """Accuracy overall / per difficulty / per format, and mean response tokens; per question kind too where the
    rows carry one.

    Returns ``{"accuracy": float, "mean_response_tokens": float, "by_format": {fmt: {"accuracy",
    "by_difficulty": {d: acc}[, "by_kind": {k: acc}]}}, "by_difficulty": {d: acc}, "mean_actions_by_difficulty":
    {d: mean}[, "by_kind": {k: acc}, "questions_by_kind": {k: n}]}`` (actions of the trajectories the system chose,
    not those a static format named).
    """
    def acc(rs: list[dict]) -> float:
        return round(sum(r["correct"] for r in rs) / len(rs), 4) if rs else 0.0

    def by_kind(rs: list[dict]) -> dict:
        # the test split's kinds need not follow train's (prepare.stratify_kinds), so each kind's figure is shown
        kinds: dict[str, list[dict]] = defaultdict(list)
        for r in rs:
            if "kind" in r:
                kinds[r["kind"]].append(r)
        return {"by_kind": {k: acc(v) for k, v in sorted(kinds.items())}} if kinds else {}

    by_fmt: dict[str, list[dict]] = defaultdict(list)
    by_diff: dict[int, list[dict]] = defaultdict(list)
    for r in rows:
        by_fmt[r["format"]].append(r)
        by_diff[r["difficulty"]].append(r)
    formats = {}
    for fmt, rs in by_fmt.items():
        per_d: dict[int, list[dict]] = defaultdict(list)
        for r in rs:
            per_d[r["difficulty"]].append(r)
        formats[fmt] = {"accuracy": acc(rs), "by_difficulty": {str(d): acc(v) for d, v in sorted(per_d.items())},
                        **by_kind(rs)}
    actions: dict[int, list[int]] = defaultdict(list)
    for r in rows:
        # the trajectories the system chose (own choice, the external planner's): a static format's is the prompt's,
        # and a model scored on all 12 would otherwise show their mean, whatever it chose
        if r["trajectory"] and r["format"] not in BY_NAME:
            actions[r["difficulty"]].append(BY_NAME[r["trajectory"]].n_actions)
    return {
        "accuracy": acc(rows),
        "mean_actions_by_difficulty": {str(d): round(sum(a) / len(a), 3) for d, a in sorted(actions.items())},
        "mean_response_tokens": round(sum(n_tokens) / max(1, len(n_tokens)), 2),
        "by_difficulty": {str(d): acc(v) for d, v in sorted(by_diff.items())},
        "by_format": formats,
        **by_kind(rows),
        **({"questions_by_kind": dict(sorted(Counter(kind for kind in ids.values()).items()))}
           if (ids := {r["id"]: r["kind"] for r in rows if "kind" in r}) else {}),
    }


def own_choice(summary: dict) -> dict | None:
    """A system's own accuracy from its ``summarize`` figures, as evaluate, the report and the pipeline run give it:
    its own-choice figures where it was also scored on static trajectories (their mean over every format is another
    system's), the summary itself for a system that answers its own way (external planner, vanilla SFT) or one given
    without formats, and None for a model scored on static trajectories alone (``evaluate.formats`` without
    own_choice): their figures are no choice of its own."""
    by_format = summary.get("by_format") or {}
    if OWN_CHOICE in by_format:
        return by_format[OWN_CHOICE]
    return summary if set(by_format) <= OWN_WAY_FORMATS else None
