"""The 12 DOTS reasoning trajectories as data, and the prompt format that names one.

A trajectory composes one action per layer (METHODS.md section 1): analysis (``rewrite``,
``decompose`` or none), solution (``cot`` or ``pot``) and verification (``verify`` or none).
Its name lists the non-empty actions joined by ``+`` (``cot``, ``decompose+pot+verify``).

Every model in the pipeline sees the same text layout::

    Question: <question>
    Trajectory: <name>
    <response: analysis, solution, verification, final answer>

When the trajectory is left to the model, the prompt stops after ``Trajectory:`` and the model
writes the name itself, which is how a planner's choice is read back.

Example:
    >>> t = Trajectory.from_name("rewrite+pot")
    >>> t.n_actions, t.solution
    (2, 'pot')
    >>> prompt("Compute 2 + 3.", t)
    'Question: Compute 2 + 3.\\nTrajectory: rewrite+pot\\n'
"""
from __future__ import annotations

from dataclasses import dataclass

ANALYSES: tuple[str | None, ...] = (None, "rewrite", "decompose")
SOLUTIONS: tuple[str, ...] = ("cot", "pot")
VERIFICATIONS: tuple[str | None, ...] = (None, "verify")


@dataclass(frozen=True)
class Trajectory:
    analysis: str | None
    solution: str
    verification: str | None

    @property
    def actions(self) -> tuple[str, ...]:
        return tuple(a for a in (self.analysis, self.solution, self.verification) if a)

    @property
    def name(self) -> str:
        return "+".join(self.actions)

    @property
    def n_actions(self) -> int:
        """Trajectory length, the DOTS tie-breaker (fewer actions first)."""
        return len(self.actions)

    @classmethod
    def from_name(cls, name: str) -> "Trajectory":
        """Parse ``rewrite+cot+verify``; raise ValueError naming what is wrong."""
        parts = [p.strip() for p in name.strip().split("+") if p.strip()]
        analysis = [p for p in parts if p in ANALYSES]
        solution = [p for p in parts if p in SOLUTIONS]
        verification = [p for p in parts if p in VERIFICATIONS]
        unknown = [p for p in parts if p not in {*ANALYSES, *SOLUTIONS, *VERIFICATIONS}]
        if unknown or len(solution) != 1 or len(analysis) > 1 or len(verification) > 1:
            raise ValueError(f"not a trajectory name: {name!r} (expected e.g. 'decompose+pot+verify')")
        t = cls(analysis[0] if analysis else None, solution[0], verification[0] if verification else None)
        if t.name != "+".join(parts):
            raise ValueError(f"actions out of order in {name!r}: expected {t.name!r}")
        return t


TRAJECTORIES: tuple[Trajectory, ...] = tuple(
    Trajectory(a, s, v) for a in ANALYSES for s in SOLUTIONS for v in VERIFICATIONS
)
BY_NAME: dict[str, Trajectory] = {t.name: t for t in TRAJECTORIES}

QUESTION_PREFIX = "Question: "
TRAJECTORY_PREFIX = "Trajectory:"


def prompt(question: str, trajectory: Trajectory | None = None) -> str:
    """The model input; with ``trajectory=None`` the model chooses the trajectory itself."""
    head = f"{QUESTION_PREFIX}{question}\n{TRAJECTORY_PREFIX}"
    return head if trajectory is None else f"{head} {trajectory.name}\n"


def plain_prompt(question: str) -> str:
    """The input of a model trained without trajectories (vanilla SFT): the question alone."""
    return f"{QUESTION_PREFIX}{question}\n"


def split_choice(completion: str) -> tuple[Trajectory | None, str]:
    """For a completion of an open prompt: the trajectory the model named, and the rest.

    Returns ``(None, completion)`` when the first line names no valid trajectory.
    """
    first, _, rest = completion.partition("\n")
    try:
        return Trajectory.from_name(first), rest
    except ValueError:
        return None, completion
