"""Which training checkpoint a killed run resumes from.

A SIGKILL can land while the Trainer is still writing ``checkpoint-<n>``: the directory exists but its
weights, optimizer or state are half there, and ``transformers.trainer_utils.get_last_checkpoint`` (which only
looks at directory names) would hand it to ``Trainer.train`` to crash on. The Trainer writes
``trainer_state.json`` after everything else, so a checkpoint is complete when that file (or a later marker
such as RLVR's rollout state) is present and parses.
"""
from __future__ import annotations

import json
from pathlib import Path

from transformers.trainer import TRAINER_STATE_NAME


def is_complete(checkpoint: Path, marker: str = TRAINER_STATE_NAME) -> bool:
    """True when ``checkpoint/marker`` exists and is whole JSON (a kill mid-write leaves it truncated)."""
    try:
        json.loads((checkpoint / marker).read_text())
    except (OSError, ValueError):
        return False
    return True


def last_complete_checkpoint(root: Path, marker: str = TRAINER_STATE_NAME) -> str | None:
    """The newest complete ``checkpoint-<n>`` under ``root``, or None (no directory, or nothing complete yet).

    >>> last_complete_checkpoint(Path("checkpoints/does-not-exist")) is None
    True
    """
    done = [p for p in Path(root).glob("checkpoint-*")
            if p.name.split("-")[-1].isdigit() and is_complete(p, marker)]
    return str(max(done, key=lambda p: int(p.name.split("-")[1]))) if done else None
