"""Task records: the JSONL schema every dataset goes through, ingest with row-level errors, splits.

A record is one JSON object per line with at least ``id, question, answer, difficulty``; domain
fields (``form``, ``start``, ``steps``...) ride along untouched. A bad row stops the ingest with
``file:line: field: problem``; an id or question that appears in two splits is reported by name.
"""
from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from posttrain.errors import UserError


class DataError(UserError, ValueError):
    """A dataset problem, phrased so that the user can find and fix the row."""


class Record(BaseModel):
    """One task question with its verifiable integer answer."""

    model_config = ConfigDict(extra="allow", strict=False)

    id: str = Field(min_length=1, description="unique within the dataset")
    question: str = Field(min_length=1, description="the question text shown to the model")
    answer: int = Field(description="the integer the verifier compares against")
    difficulty: int = Field(ge=1, description="1 = easiest; for the default task, the number of operations")

    @field_validator("id", "question")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("is blank")
        return v

    @field_validator("answer", "difficulty", mode="before")
    @classmethod
    def _integral(cls, v):
        if isinstance(v, bool):
            raise ValueError("must be an integer, got a boolean")
        if isinstance(v, float) and not v.is_integer():
            raise ValueError(f"must be an integer, got {v}")
        return v


def read_records(path: str | Path) -> list[dict]:
    """Read and validate a JSONL file; raise DataError naming ``file:line: field: problem``."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    records: list[dict] = []
    ids: dict[str, int] = {}
    questions: dict[str, tuple[int, str]] = {}  # normalized question -> its first line and id
    with path.open("rb") as f:
        for lineno, data in enumerate(f, start=1):
            try:
                line = data.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{lineno}: (row): not UTF-8 text (byte {data[e.start]:#04x} at column "
                                f"{e.start + 1})") from None
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: (row): not valid JSON: {e.msg} at column {e.colno}") from None
            except ValueError as e:  # valid JSON Python will not read: an integer of more than 4,300 digits
                raise DataError(f"{path}:{lineno}: (row): {e}") from None
            if not isinstance(raw, dict):
                raise DataError(f"{path}:{lineno}: (row): expected a JSON object, got {type(raw).__name__}")
            try:
                rec = Record.model_validate(raw)
            except ValidationError as e:
                err = e.errors()[0]
                field = ".".join(str(p) for p in err["loc"]) or "(row)"
                problem = "missing" if err["type"] == "missing" else f"{err['msg']} (got {err.get('input')!r})"
                raise DataError(f"{path}:{lineno}: {field}: {problem}") from None
            if rec.id in ids:
                raise DataError(f"{path}:{lineno}: id: duplicate id {rec.id!r} (first on line {ids[rec.id]})")
            ids[rec.id] = lineno
            # the same question twice weighs it twice in training and counts twice in a score
            first_line, first_id = questions.setdefault(normalized_question(rec.question), (lineno, rec.id))
            if first_line != lineno:
                raise DataError(f"{path}:{lineno}: question: row {rec.id!r} asks the question of line {first_line} "
                                f"(row {first_id!r}) again")
            records.append(rec.model_dump())
    if not records:
        raise DataError(f"{path}: no records")
    return records


def normalized_question(question: str) -> str:
    """A question as overlap checks compare it: case and runs of whitespace do not make another question."""
    return " ".join(question.lower().split())


def find_split_overlaps(splits: dict[str, list[dict]]) -> list[str]:
    """Human-readable lines for every id or question (``normalized_question``) shared by two splits (empty when
    clean)."""
    problems: list[str] = []
    names = list(splits)
    keyed = {"id": lambda r: r["id"], "question": lambda r: normalized_question(r["question"])}
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            for key, of in keyed.items():
                shown = {of(r): r[key] for r in splits[a]}  # a shared value is shown as split a writes it
                shared = sorted(shown[v] for v in set(shown) & {of(r) for r in splits[b]})
                for value in shared[:5]:
                    problems.append(f"{key} {value!r} is in both {a} and {b}")
                if len(shared) > 5:
                    problems.append(f"... and {len(shared) - 5} more {key}s shared by {a} and {b}")
    return problems
