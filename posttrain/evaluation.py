"""Scoring responses against the verifier, per trajectory format (``posttrain.accuracy_summary`` sums them up).

A response is judged by the trajectory it follows: a ``pot`` response's answer is what its program
prints when run in the sandbox; any other response's answer is its last ``Answer: N``. For an open
prompt ("own choice") the trajectory is read from the first line the model wrote.

Example:
    >>> rows = score_responses([{"id": "q1", "answer": 5, "difficulty": 1}], ["cot"], ["Answer: 5"])
    >>> rows[0]["correct"]
    True
"""
from __future__ import annotations

import re

from posttrain.accuracy_summary import OWN_CHOICE
from posttrain.sandbox import SandboxLimits, run_programs
from posttrain.task.verifier import parse_integer, extract_answer
from posttrain.trajectories import BY_NAME, split_choice

_CODE = re.compile(r"```(?:python)?\n(.*?)(?:```|$)", re.DOTALL)


def program_of(response: str) -> str | None:
    """The first fenced code block of a response (an unclosed last block counts), or None."""
    m = _CODE.search(response)
    return m.group(1) if m else None


def score_responses(
    records: list[dict], formats: list[str], responses: list[str],
    limits: SandboxLimits = SandboxLimits(), workers: int = 2,
) -> list[dict]:
    """One row per (record, format, response): the trajectory followed, the answer found, correctness.

    ``formats[i]`` is a trajectory name or ``own_choice``; ``pot`` programs run in the sandbox,
    ``workers`` at a time.
    """
    rows, programs = [], {}
    for i, (rec, fmt, text) in enumerate(zip(records, formats, responses, strict=True)):
        if fmt == OWN_CHOICE:
            chosen, body = split_choice(text)
        else:
            chosen, body = BY_NAME[fmt], text
        row = {"id": rec["id"], "difficulty": rec["difficulty"], "format": fmt,
               "trajectory": chosen.name if chosen else None, "response": text, "reference": rec["answer"]}
        if rec.get("kind") is not None:  # the question's kind (synthetic task; optional in a user's data)
            row["kind"] = rec["kind"]
        if chosen is not None and chosen.solution == "pot":
            code = program_of(body)
            row["predicted"], row["reason"] = None, "no program" if code is None else "pending"
            if code is not None:
                programs[i] = code
        else:
            row["predicted"] = extract_answer(body)
            row["reason"] = "ok" if row["predicted"] is not None else "no answer line"
        rows.append(row)
    results = run_programs(list(programs.values()), limits, workers)
    for i, result in zip(programs, results):
        lines = result.stdout.strip().splitlines()
        value = parse_integer(lines[-1].strip()) if result.ok and lines else None
        rows[i]["predicted"] = value
        rows[i]["reason"] = result.reason if not result.ok else ("ok" if value is not None else "no integer printed")
    for row in rows:
        row["correct"] = row["predicted"] is not None and row["predicted"] == row["reference"]
    return rows
