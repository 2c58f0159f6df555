"""Execute trajectories with the solver model, including the ``verify`` action's retry loop.

A trajectory with ``verify`` ends with a self-check: in text (``Verify: ... = 7; back to 7``) the value
the model walks back to must equal the question's start value; in a program, the ``assert`` must hold.
A response whose check fails is solved again (a fresh sample), up to ``verify_retries`` more times;
the last attempt stands. Everything else is scored once, by the verifier or the sandbox.

Example:
    >>> executor = TrajectoryExecutor(generator, verify_retries=1)                    # doctest: +SKIP
    >>> rows = executor.run(records, [BY_NAME["cot+verify"]] * len(records), temperature=0.4)  # doctest: +SKIP
    >>> rows[0]["correct"], rows[0]["attempts"]                                       # doctest: +SKIP
    (True, 1)
"""
from __future__ import annotations

import re

from posttrain.evaluation import OWN_CHOICE, score_responses
from posttrain.generation import HFGenerator, VLLMGenerator
from posttrain.sandbox import SandboxLimits
from posttrain.trajectories import BY_NAME, Trajectory, prompt

_VERIFY = re.compile(r"Verify:(.*)", re.IGNORECASE)
_RESULT = re.compile(r"=\s*(-?\d+)")
_BACK_TO = re.compile(r"back to\s*(-?\d+)", re.IGNORECASE)


def check_failed(row: dict, start: int | None) -> bool:
    """Whether a scored response's own self-check failed (False when it has none or cannot be checked)."""
    name = row["trajectory"]
    if name is None or BY_NAME[name].verification != "verify":
        return False
    if BY_NAME[name].solution == "pot":
        return row["reason"].startswith("error: AssertionError")
    m = _VERIFY.search(row["response"])
    if m is None:
        return True  # the trajectory asked for a check and none was written
    # the value walked back to: the last "= N", or with no step to undo (a rewrite that dropped the question's only,
    # net-zero, step) the "back to N" itself
    results = _RESULT.findall(m.group(1)) or _BACK_TO.findall(m.group(1))
    return start is not None and (not results or int(results[-1]) != int(start))


class TrajectoryExecutor:
    """Generate, score, and re-solve failed self-checks; one batched generation call per attempt."""

    def __init__(self, generator: HFGenerator | VLLMGenerator, limits: SandboxLimits = SandboxLimits(), workers: int = 2,
                 verify_retries: int = 1):
        self.generator = generator
        self.limits = limits
        self.workers = workers
        self.verify_retries = verify_retries

    def run(self, records: list[dict], trajectories: list[Trajectory | None], temperature: float = 0.0,
            seed: int = 0, desc: str = "solve") -> list[dict]:
        """One scored row per (record, trajectory); ``None`` lets the model choose (own choice)."""
        formats = [t.name if t else OWN_CHOICE for t in trajectories]
        prompts = [prompt(r["question"], t) for r, t in zip(records, trajectories, strict=True)]
        rows: list[dict | None] = [None] * len(records)
        pending = list(range(len(records)))
        for attempt in range(1 + self.verify_retries):
            completions = self.generator.generate([prompts[i] for i in pending], temperature=temperature,
                                                  seed=seed + attempt, desc=f"{desc} (attempt {attempt + 1})")
            scored = score_responses([records[i] for i in pending], [formats[i] for i in pending],
                                     [c.text for c in completions], self.limits, self.workers)
            for i, row, c in zip(pending, scored, completions):
                rows[i] = {**row, "attempts": attempt + 1, "n_tokens": (rows[i] or {}).get("n_tokens", 0) + c.n_tokens}
            pending = [i for i in pending if check_failed(rows[i], records[i].get("start"))]
            if not pending or temperature == 0:
                break  # greedy decoding would only repeat the same answer
        return rows  # type: ignore[return-value]
