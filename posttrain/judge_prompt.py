"""The pairwise judge prompt and the verdict parser (shared by the client and the local judge service).

The prompt frames the question and both responses between fixed markers, so the local service can read
them back; the parser finds the verdict in an answer full of chatter, reasoning or markdown.

Example:
    >>> parse_verdict("Let me think... A is off by one. **Final verdict: [[B]]**")
    'B'
    >>> parse_verdict("Both are fine, it's a tie.") is None     # no explicit verdict line
    True
"""
from __future__ import annotations

import re

SYSTEM = "You are an impartial judge comparing two responses to the same question."
QUESTION_MARK, A_MARK, B_MARK, END_MARK = "[Question]", "[Response A]", "[Response B]", "[End of responses]"
INSTRUCTIONS = ("Compare the two responses by these criteria: {criteria}\n"
                "Think briefly, then end with exactly one line: 'Verdict: A', 'Verdict: B' or 'Verdict: tie'.")

# A verdict keyword, then markdown, quotes, brackets or a JSON key's closing quote, a separator (":", "=", a dash; the
# full-width "：" of a Chinese-tuned judge), then the side. "answer" only counts with a colon ("Final answer: B"):
# "Response A's answer is a wrong number" is reasoning, not a verdict for A. An uppercase A/B always counts; a
# lowercase a/b only standing alone (before the line's end, punctuation or markdown: "verdict: b."), since before a
# word it is the article ("the winner is a response that...", "my verdict: a slight edge to B"), and that would
# override the real verdict above it. A side named with the other ("Verdict: A and B are equally good", "A or B") is
# no verdict for either.
_GAP = r"[\s*_\"'`\[\(]*"
_VERDICT = re.compile(
    r"(?:(?:verdict|winner|better response|preferred response)" + _GAP + r"(?:is\b" + _GAP + r")?"
    r"|answer[*\"'`]*\s*(?=[:=：]))(?:[:=：\-–—]" + _GAP + r")?(?:(?:response|assistant)\b" + _GAP + r")?"
    r"(?:a\s+(?=tie|draw))?"
    r"((?-i:[AB]|[ab](?=[^\S\n]*(?:\n|$|[^\w\s])))|tie|draw)(?![\w-])"
    r"(?!\s*(?:and|or|&|/|vs\.?|versus|nor)\s*(?:response\s+)?[AB]\b)",
    re.IGNORECASE)
_BRACKETED = re.compile(r"\[\[\s*(A|B|C|tie)\s*\]\]", re.IGNORECASE)  # MT-Bench style [[A]]; [[C]] = tie
# R1 and math-tuned judges box their final answer whatever they were told: \boxed{B}, \boxed{\text{Response A}}
_BOXED = re.compile(r"\\boxed\s*\{\s*(?:\\text(?:bf)?\s*\{\s*)?(?:(?:response|assistant)\s+)?(A|B|tie|draw)\s*\}",
                    re.IGNORECASE)
# an answer that is nothing but the side ("B", "**A**", "Tie."): a terse model's whole verdict
_BARE = re.compile(r"[\s*_`'\"\[(]*(A|B|tie|draw)[\s*_`'\"\]).!]*", re.IGNORECASE)


def judge_messages(question: str, a: str, b: str, criteria: str) -> list[dict]:
    user = (f"{QUESTION_MARK}\n{question}\n{A_MARK}\n{a.strip()}\n{B_MARK}\n{b.strip()}\n{END_MARK}\n"
            + INSTRUCTIONS.format(criteria=criteria))
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def read_messages(messages: list[dict]) -> tuple[str, str, str] | None:
    """(question, A, B) back from a judge prompt built by ``judge_messages``; None if it is not one."""
    text = next((m.get("content", "") for m in reversed(messages) if m.get("role") == "user"), "")
    m = re.search(re.escape(QUESTION_MARK) + r"\n(.*?)\n" + re.escape(A_MARK) + r"\n(.*?)\n" + re.escape(B_MARK)
                  + r"\n(.*?)\n" + re.escape(END_MARK), text, re.DOTALL)
    return (m.group(1), m.group(2), m.group(3)) if m else None


def parse_verdict(text: str | None) -> str | None:
    """'A', 'B' or 'tie' from a judge's answer (the last explicit verdict wins, an "answer:" only where no other
    keyword names a side); None when there is none."""
    if not text:
        return None
    # reasoning models: drop closed <think> blocks; R1-style output has only the closing tag (the opening one is in
    # the prompt template), so read after the last one; an unclosed <think> (a cut-off answer) is reasoning to the end
    text = re.sub(r"<think>.*?</think>", " ", text, flags=re.DOTALL | re.IGNORECASE)
    text = re.split(r"</think>", text, flags=re.IGNORECASE)[-1]
    text = re.split(r"<think>", text, flags=re.IGNORECASE)[0]
    # "answer:" is the weaker keyword: after "Verdict: A" the note "(Response B's final answer: B is wrong.)" reads
    # as an answer for B, and on a task whose answers are letters it is one; it decides only where nothing else does
    found = sorted([(not m.group(0).lower().startswith("answer"), m.start(), m.group(1))
                    for m in _VERDICT.finditer(text)]
                   + [(True, m.start(), m.group(1)) for m in _BRACKETED.finditer(text)]
                   + [(True, m.start(), m.group(1)) for m in _BOXED.finditer(text)])
    if not found and (bare := _BARE.fullmatch(text)):
        found = [(True, 0, bare.group(1))]
    if not found:
        return None
    v = found[-1][2].lower()
    return {"a": "A", "b": "B", "tie": "tie", "draw": "tie", "c": "tie"}[v]


def combine_orders(ab: str | None, ba: str | None) -> str | None:
    """One verdict (about the original A, B) from asking (A, B) and then (B, A).

    Disagreement (position bias) counts as a tie; if one order failed, the other decides; both failed: None.
    """
    flipped = {"A": "B", "B": "A", "tie": "tie", None: None}[ba]
    if ab is None or flipped is None:
        return ab or flipped
    return ab if ab == flipped else "tie"
