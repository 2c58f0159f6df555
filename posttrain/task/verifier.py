"""Final-answer extraction from free text and comparison with the reference integer.

The convention the models are trained on is a last line ``Answer: 42``; the parser also accepts the
forms models and judges write in the wild (``**Answer:** 1,234``, ``\\boxed{42}``, ``The answer is 42.``,
``-7``, ``42.0``) and takes the last one, so a model that revises itself is judged on its final word.

Example:
    >>> extract_answer("Step 1: 2 + 2 = 4\\nAnswer: 4")
    4
    >>> is_correct("answer: 1,000.", 1000)
    True
"""
from __future__ import annotations

import re

# Commas only as thousands separators, and the number must end there: "1,2", "3/4", "1e5" or "3.0.1" is not the
# integer its first digits spell.
_NUMBER = r"[-+\u2212]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w/^]|[.,]\d)"
_PATTERNS = [
    re.compile(r"answer\s*\**\s*(?:is)?\s*[:=]?\s*\**\s*(?:is\s*)?\$?\s*(" + _NUMBER + r")", re.IGNORECASE),
    re.compile(r"\\boxed\{\s*(" + _NUMBER + r")\s*\}"),
]


def parse_integer(text: str) -> int | None:
    """``text`` as a whole number (``42``, ``-1,234``, ``12.0``), or None: a program printing ``1,2``, ``1e5`` or
    ``1_000`` did not print the integer float() would make of it. Any size reads exactly."""
    if not re.fullmatch(_NUMBER, text.strip()):
        return None
    # Read exactly, not through float(): past 2**53 a float is not the integer written (10**17 + 1 read as 10**17),
    # so a task whose answers are that large could not be verified at all.
    whole, _, fraction = text.strip().replace(",", "").replace("\u2212", "-").partition(".")
    if fraction.strip("0"):
        return None
    try:
        return int(whole)
    except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits): no answer anyone stated
        return None


def extract_answer(text: str | None) -> int | None:
    """The last stated final answer in ``text`` as an integer, or None when there is none.

    Only an explicit answer marker counts (``Answer:``, ``answer is``, ``\\boxed{}``): a number
    somewhere in the reasoning is not an answer. Non-integer answers give None.
    """
    if not text:
        return None
    best: tuple[int, str] | None = None
    for pattern in _PATTERNS:
        for m in pattern.finditer(text):
            if best is None or m.start() >= best[0]:
                best = (m.start(), m.group(1))
    if best is None:
        return None
    # A trailing thousands separator or sentence period is not part of the number.
    return parse_integer(best[1].rstrip(",."))


def is_correct(text: str | None, answer: int) -> bool:
    """Whether the final answer stated in ``text`` equals ``answer``."""
    got = extract_answer(text)
    return got is not None and got == int(answer)
