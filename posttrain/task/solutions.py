"""Reference responses for every trajectory, written programmatically from an arithmetic problem.

These are the warm-up SFT targets: for each of the 12 trajectories the text a competent solver
would write, so that after warm-up the model can execute any trajectory named in its prompt.

- ``rewrite``:   restates the question in the other form (words <-> expression).
- ``decompose``: lists one sub-question per operation, each building on the previous result.
- ``cot``:       one line per operation with its result, then ``Answer: N``.
- ``pot``:       a Python program whose printed output is the answer (executed in the sandbox).
- ``verify``:    walks the inverse operations back to the start value (for ``pot``, as an assert).

A net-zero repeated block (``repeat`` kind) is one line that notes it cancels in text (``cot``,
``decompose``, ``verify``), a loop in a program (``pot`` brute-forces it, as programs do), and nothing in a
``rewrite`` (the clean expression, which the solution after it then follows).

Example:
    >>> from posttrain.task.arithmetic import Problem, Step
    >>> p = Problem(start=7, steps=(Step("add", 5), Step("mul", 3)), form="expression")
    >>> print(render_response(p, Trajectory.from_name("cot")))
    Step 1: 7 + 5 = 12
    Step 2: 12 * 3 = 36
    Answer: 36
"""
from __future__ import annotations

from posttrain.task.arithmetic import INVERSE, SYMBOL, Problem, Step, apply_op
from posttrain.trajectories import Trajectory

_PY = {"add": "+", "sub": "-", "mul": "*", "div": "//"}


def _rewrite(p: Problem) -> str:
    other = Problem(p.start, p.steps, "expression" if p.form == "words" else "words", p.phrasing)
    return f"Rewrite: {other.question}"


def _block(s: Step) -> str:
    """A net-zero block in text, e.g. ``+ 4 - 4 (1000 times)``."""
    return f"{SYMBOL[s.op]} {s.operand} {SYMBOL[INVERSE[s.op]]} {s.operand} ({s.repeat} times)"


def _decompose(p: Problem) -> str:
    lines = ["Decompose:"]
    for i, s in enumerate(p.steps, start=1):
        base = str(p.start) if i == 1 else f"#{i - 1}"
        lines.append(f"#{i}: {base} {_block(s) if s.repeat else f'{SYMBOL[s.op]} {s.operand}'}")
    return "\n".join(lines)


def _cot(p: Problem) -> str:
    v = p.values()
    return "\n".join(
        f"Step {i}: {v[i - 1]} {_block(s)} cancels, so {v[i]}" if s.repeat
        else f"Step {i}: {v[i - 1]} {SYMBOL[s.op]} {s.operand} = {v[i]}" for i, s in enumerate(p.steps, start=1)
    )


def _verify_text(p: Problem) -> str:
    x, parts = p.answer, []
    for s in reversed(p.steps):
        if s.repeat:
            parts.append(f"{x} {_block(s)} = {x}")
            continue
        inv = INVERSE[s.op]
        y = apply_op(inv, x, s.operand)
        parts.append(f"{x} {SYMBOL[inv]} {s.operand} = {y}")
        x = y
    return "Verify: " + "; ".join(parts) + f"; back to {p.start}: correct"


def _program_lines(var: str, s: Step, inverse: bool) -> list[str]:
    if s.repeat:
        ops = (s.op, INVERSE[s.op])
        return [f"for _ in range({s.repeat}):"] + [f"    {var} = {var} {_PY[op]} {s.operand}" for op in ops]
    return [f"{var} = {var} {_PY[INVERSE[s.op] if inverse else s.op]} {s.operand}"]


def _program(p: Problem, verify: bool) -> str:
    lines = [f"x = {p.start}"] + [line for s in p.steps for line in _program_lines("x", s, inverse=False)]
    if verify:
        lines.append("y = x")
        lines += [line for s in reversed(p.steps) for line in _program_lines("y", s, inverse=True)]
        lines.append(f"assert y == {p.start}")
    lines.append("print(x)")
    return "```python\n" + "\n".join(lines) + "\n```"


def render_response(p: Problem, t: Trajectory) -> str:
    """The reference response for problem ``p`` following trajectory ``t`` (no trailing newline)."""
    parts: list[str] = []
    if t.analysis == "rewrite":
        parts.append(_rewrite(p))
        p = p.without_repeats()  # the solution follows the restated (clean) question
    elif t.analysis == "decompose":
        parts.append(_decompose(p))
    if t.solution == "pot":
        parts.append(_program(p, verify=t.verification == "verify"))
    else:
        parts.append(_cot(p))
        if t.verification == "verify":
            parts.append(_verify_text(p))
        parts.append(f"Answer: {p.answer}")
    return "\n".join(parts)
