"""The default task: seeded multi-step integer arithmetic with graded difficulty.

A problem is a start value and a chain of operations (``difficulty`` = number of operations), asked
either in words ("Start with 7. Add 5. ...") or as one nested expression ("Compute ((7 + 5) * 3) - 4.").
Every intermediate value stays a non-negative integer and divisions are exact, so a verifier can check
the final integer.

Three kinds of question make the choice of reasoning trajectory matter (DOTS, METHODS.md section 1):
- ``chain``: small numbers (values up to ``max_value``); a small model can do each step in text.
- ``bignum``: two- and three-digit operands (values in the thousands); step-by-step text arithmetic
  fails for a small model, while a program (``pot``) only has to copy the numbers.
- ``distractor``: a ``chain`` in words with irrelevant sentences holding numbers between the steps;
  restating the question as a clean expression first (``rewrite``) removes them.
- ``repeat``: a ``chain`` in words where one step is a net-zero block repeated ``n`` times ("Add 4, then
  subtract 4, and repeat this 1000000000 times."). A program that runs the loop (``pot``'s brute force)
  passes the sandbox's CPU limit when ``n`` is huge and gives no answer, while text that notes the block
  cancels (``cot``) or a restatement that drops it (``rewrite``: the clean expression) solves it at once;
  for a small ``n`` the loop is instant. The planner must read the size of ``n`` to choose.

Example:
    >>> import random
    >>> p = sample_problem(random.Random(0), difficulty=3, form="expression", max_operand=20, max_value=200)
    >>> p.answer == p.values()[-1]
    True
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal, get_args

from posttrain.task.records import DataError

Op = Literal["add", "sub", "mul", "div"]
Form = Literal["words", "expression"]
Kind = Literal["chain", "bignum", "distractor", "repeat"]
KINDS: tuple[str, ...] = get_args(Kind)

# bignum ranges: start 10..99, add/sub 100..999, multiply by 11..29; no division
BIG_START, BIG_ADD, BIG_MUL = (10, 99), (100, 999), (11, 29)

_DISTRACTORS = (
    "A box holds {n} pens.", "The bus leaves at {n} o'clock.", "Tom is {n} years old.",
    "There are {n} birds outside.", "The room has {n} chairs.", "Ann reads {n} pages a day.",
)

SYMBOL: dict[str, str] = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
# Inverse operation, used by the verification action to walk back to the start value.
INVERSE: dict[str, str] = {"add": "sub", "sub": "add", "mul": "div", "div": "mul"}

# repeat: counts a loop runs through in milliseconds, and counts no sandbox CPU limit lets it finish
REPEAT_SMALL = (2, 3, 5, 10, 20, 50, 100, 1000, 10000, 100000)
REPEAT_HUGE = (10**8, 10**9, 10**10, 10**12, 10**15)
_REPEAT_WORDS: dict[str, tuple[str, ...]] = {
    "add": ("Add {k}, then subtract {k}, and repeat this {n} times.",
            "Do this {n} times: increase it by {k} and decrease it by {k}."),
    "mul": ("Multiply by {k}, then divide by {k}, and repeat this {n} times.",
            "Do this {n} times: make it {k} times as large and split it into {k} equal parts."),
}

# Several phrasings per operation so that "rewrite" (restating the question) carries information.
_WORDS: dict[str, tuple[str, ...]] = {
    "add": ("Add {k}.", "Increase it by {k}.", "Then add {k}."),
    "sub": ("Subtract {k}.", "Take away {k}.", "Decrease it by {k}."),
    "mul": ("Multiply by {k}.", "Multiply the result by {k}.", "Make it {k} times as large."),
    "div": ("Divide by {k}.", "Split it into {k} equal parts and keep one.", "Divide the result by {k}."),
}


def apply_op(op: str, x: int, k: int) -> int:
    """The value after applying ``op`` with operand ``k`` to ``x`` (division is exact by construction)."""
    if op == "add":
        return x + k
    if op == "sub":
        return x - k
    if op == "mul":
        return x * k
    if op == "div":
        return x // k
    raise ValueError(f"unknown operation {op!r}")


@dataclass(frozen=True)
class Step:
    """One operation; with ``repeat`` > 0 it is the net-zero block "``op`` then its inverse", ``repeat`` times."""

    op: Op
    operand: int
    repeat: int = 0

    def apply(self, x: int) -> int:
        return x if self.repeat else apply_op(self.op, x, self.operand)


@dataclass(frozen=True)
class Problem:
    """One arithmetic chain and the way its question is phrased."""

    start: int
    steps: tuple[Step, ...]
    form: Form
    phrasing: tuple[int, ...] = ()  # template index per step (words form only)
    kind: Kind = "chain"
    distractors: tuple[tuple[int, str], ...] = ()  # (insert after step i, sentence), words form only

    @property
    def difficulty(self) -> int:
        return len(self.steps)

    def values(self) -> list[int]:
        """Running values: the start, then the value after each step."""
        out = [self.start]
        for s in self.steps:
            out.append(s.apply(out[-1]))
        return out

    @property
    def answer(self) -> int:
        return self.values()[-1]

    def expression(self) -> str:
        """The chain as one fully parenthesised expression, e.g. ``((7 + 5) * 3) - 4`` (net-zero repeated
        blocks leave no trace: this is the clean form a ``rewrite`` restates)."""
        text, n = str(self.start), 0
        for s in self.steps:
            if s.repeat:
                continue
            text = f"{f'({text})' if n else text} {SYMBOL[s.op]} {s.operand}"
            n += 1
        return text

    def words(self, with_distractors: bool = True) -> str:
        inserted = dict(self.distractors) if with_distractors else {}
        parts = [f"Start with {self.start}."]
        for i, s in enumerate(self.steps):
            templates = _REPEAT_WORDS[s.op] if s.repeat else _WORDS[s.op]
            parts.append(templates[self.phrasing[i] if i < len(self.phrasing) else 0].format(k=s.operand, n=s.repeat))
            if i in inserted:
                parts.append(inserted[i])
        return " ".join(parts) + " What is the result?"

    def without_repeats(self) -> "Problem":
        """The same problem with its net-zero repeated blocks dropped (same answer)."""
        keep = [i for i, s in enumerate(self.steps) if not s.repeat]
        return Problem(self.start, tuple(self.steps[i] for i in keep), self.form,
                       tuple(self.phrasing[i] for i in keep if i < len(self.phrasing)), self.kind, self.distractors)

    @property
    def question(self) -> str:
        return self.words() if self.form == "words" else f"Compute {self.expression()}."

    def to_fields(self) -> dict:
        """Domain fields stored beside ``id, question, answer, difficulty`` in the JSONL records."""
        return {
            "form": self.form,
            "start": self.start,
            "steps": [[s.op, s.operand, s.repeat] if s.repeat else [s.op, s.operand] for s in self.steps],
            "phrasing": list(self.phrasing),
            "kind": self.kind,
            "distractors": [list(d) for d in self.distractors],
        }

    @classmethod
    def from_fields(cls, record: dict) -> "Problem":
        return cls(
            start=int(record["start"]),
            steps=tuple(Step(op, int(k), int(rest[0]) if rest else 0) for op, k, *rest in record["steps"]),
            form=record["form"],
            phrasing=tuple(record.get("phrasing") or ()),
            kind=record.get("kind", "chain"),
            distractors=tuple((int(i), text) for i, text in record.get("distractors") or ()),
        )


def _feasible_steps(x: int, max_operand: int, max_value: int) -> list[Step]:
    """All operations that keep the running value a non-negative integer <= max_value."""
    steps: list[Step] = []
    steps += [Step("add", k) for k in range(1, max_operand + 1) if x + k <= max_value]
    steps += [Step("sub", k) for k in range(1, min(max_operand, x) + 1)]
    steps += [Step("mul", k) for k in range(2, 10) if x * k <= max_value]
    steps += [Step("div", k) for k in range(2, 10) if x > 0 and x % k == 0 and x // k > 0]
    return steps


def _big_steps(x: int, rng: random.Random) -> list[Step]:
    steps = [Step("add", rng.randint(*BIG_ADD)), Step("mul", rng.randint(*BIG_MUL))]
    k = rng.randint(BIG_ADD[0], min(BIG_ADD[1], x)) if x >= BIG_ADD[0] else None
    return steps + ([Step("sub", k)] if k else [])


def sample_problem(
    rng: random.Random, difficulty: int, form: Form, max_operand: int, max_value: int, kind: Kind = "chain",
) -> Problem:
    """Draw one problem with ``difficulty`` operations; the operation type is drawn first, uniformly
    among the feasible ones, so multiplication and division are not drowned out by add/sub."""
    if kind in ("distractor", "repeat"):
        form = "words"
    start = rng.randint(*BIG_START) if kind == "bignum" else rng.randint(1, max(max_operand, max_value // 2))
    x, steps = start, []
    for _ in range(difficulty - 1 if kind == "repeat" else difficulty):
        feasible = _big_steps(x, rng) if kind == "bignum" else _feasible_steps(x, max_operand, max_value)
        by_op: dict[str, list[Step]] = {}
        for s in feasible:
            by_op.setdefault(s.op, []).append(s)
        op = rng.choice(sorted(by_op))
        step = rng.choice(by_op[op])
        steps.append(step)
        x = apply_op(step.op, x, step.operand)
    if kind == "repeat":
        # a net-zero block goes in at a random place (the values around it are unchanged); half the time
        # with a count no loop finishes within the sandbox's CPU limit
        op = rng.choice(("add", "mul"))
        counts = REPEAT_HUGE if rng.random() < 0.5 else REPEAT_SMALL
        steps.insert(rng.randint(0, len(steps)),
                     Step(op, rng.randint(2, max_operand) if op == "add" else rng.randint(2, 9), rng.choice(counts)))
    phrasing = tuple(rng.randrange(len(_REPEAT_WORDS[s.op] if s.repeat else _WORDS[s.op])) for s in steps) \
        if form == "words" else ()
    distractors: tuple[tuple[int, str], ...] = ()
    if kind == "distractor":
        places = sorted(rng.sample(range(difficulty), k=max(1, difficulty // 2)))
        distractors = tuple((i, rng.choice(_DISTRACTORS).format(n=rng.randint(2, max_value))) for i in places)
    return Problem(start=start, steps=tuple(steps), form=form, phrasing=phrasing, kind=kind, distractors=distractors)


def generate_problems(
    n: int, seed: int, difficulties: range, max_operand: int, max_value: int,
    forms: tuple[Form, ...] = ("words", "expression"), kind_weights: dict[str, float] | None = None,
) -> list[Problem]:
    """``n`` problems with distinct question texts, balanced over difficulties and forms, of kinds
    drawn with ``kind_weights`` (default: all ``chain``).

    Raises ``DataError`` when the space of distinct questions is too small for ``n``.
    """
    rng = random.Random(seed)
    weights_by_kind = {k: w for k, w in (kind_weights or {"chain": 1.0}).items() if w > 0}
    kinds, weights = list(weights_by_kind), list(weights_by_kind.values())
    seen: set[str] = set()
    out: list[Problem] = []
    attempts = 0
    while len(out) < n:
        i = len(out)
        difficulty = difficulties[i % len(difficulties)]
        form = forms[(i // len(difficulties)) % len(forms)]
        kind = rng.choices(kinds, weights)[0] if len(kinds) > 1 else kinds[0]
        p = sample_problem(rng, difficulty, form, max_operand, max_value, kind)
        attempts += 1
        if p.question in seen:
            if attempts > 50 * n:
                raise DataError(
                    f"could only make {len(out)} distinct questions of {n}: raise task.max_operand "
                    f"or task.max_value, or lower the split sizes"
                )
            continue
        seen.add(p.question)
        out.append(p)
    return out
