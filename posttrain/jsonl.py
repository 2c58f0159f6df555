"""JSON Lines files the stages hand each other, read with errors that name the file and line.

These files are the pipeline's own outputs (user data goes through ``posttrain.task.records``, which checks
every field); a damaged one, e.g. left by a disk that filled up, stops the reader with the place and the fix
instead of a bare ``JSONDecodeError`` deep in a stage.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "rows.jsonl"
    >>> _ = p.write_text('{"id": 1}\\n\\n{"id": 2}\\n')
    >>> read_jsonl(p)
    [{'id': 1}, {'id': 2}]
"""
from __future__ import annotations

import json
from pathlib import Path

from posttrain.errors import UserError


class JsonlError(UserError, ValueError):
    """A pipeline JSONL file is missing or damaged; the message names file:line and the stage to re-run."""


def read_jsonl(path: str | Path) -> list[dict]:
    """Every row of ``path`` (blank lines skipped)."""
    path = Path(path)
    rows = []
    try:
        with path.open("rb") as f:
            for number, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))  # bytes: json decodes UTF-8 itself
                    except (json.JSONDecodeError, UnicodeDecodeError) as e:
                        raise JsonlError(f"{path}:{number}: not valid JSON ({getattr(e, 'msg', None) or e.reason}); the file is damaged: "
                                         f"re-run the stage that writes it (dvc repro --force <stage>)") from None
    except FileNotFoundError:
        raise JsonlError(f"{path}: no such file; run `dvc repro` (or the stage that writes it) first") from None
    return rows
