"""Which training checkpoint a killed run resumes from.

A SIGKILL can land while the Trainer is still writing ``checkpoint-<n>``: the directory exists but its
weights, optimizer or state are half there, and ``transformers.trainer_utils.get_last_checkpoint`` (which only
looks at directory names) would hand it to ``Trainer.train`` to crash on. The Trainer writes
``trainer_state.json`` after everything else, so a checkpoint is complete when that file (or a later marker
such as RLVR's rollout state) is present and parses. A file damaged after the fact (a disk error, a bad copy)
is caught too: every safetensors file must cover its header's tensors, and every torch pickle (optimizer,
scheduler) must be a whole zip archive. A damaged checkpoint is skipped with a warning, and the run resumes
from the one before it.
"""
from __future__ import annotations

import hashlib
import json
import warnings
import zipfile
from pathlib import Path

from pydantic import BaseModel
from safetensors import SafetensorError, safe_open
from transformers.trainer import TRAINER_STATE_NAME


def checkpoint_dir(root: Path, cfg: BaseModel, seed: int, key_files: list[Path], known_hashes: dict | None = None
                   ) -> Path:
    """A directory unique to this config and these inputs, so a resumed run never picks up checkpoints made from
    other inputs. Inputs are ``key_files`` (hashed here; a directory: every file inside) and ``known_hashes``
    (hashes computed elsewhere, e.g. DVC's md5s of the stage's deps, so large inputs are not read again)."""
    h = hashlib.sha256(json.dumps([seed, cfg.model_dump(), known_hashes or {}], sort_keys=True).encode())
    for path in key_files:
        for f in sorted(path.rglob("*")) if path.is_dir() else [path]:
            if f.is_file():
                h.update(f.read_bytes())
    return root / h.hexdigest()[:16]


WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin")


def is_damaged(path: Path) -> bool:
    """True when a weight or state file (safetensors, or a torch.save zip) is cut short or unreadable (cheap:
    the header or the zip directory only, no tensor is read)."""
    if path.suffix == ".safetensors":
        try:
            with safe_open(str(path), framework="pt"):
                return False
        except (SafetensorError, OSError):
            return True
    return not zipfile.is_zipfile(path)  # torch.save writes a zip archive; a cut one has no central directory


def damaged_files(checkpoint: Path) -> list[str]:
    """Names of the weight and state files in ``checkpoint`` that are cut short or unreadable."""
    return [p.name for p in sorted(checkpoint.iterdir()) if p.suffix in WEIGHT_SUFFIXES and is_damaged(p)]


def is_complete(checkpoint: Path, marker: str = TRAINER_STATE_NAME) -> bool:
    """True when ``checkpoint/marker`` exists and is whole JSON (a kill mid-write leaves it truncated) and no
    weight or state file is damaged."""
    try:
        json.loads((checkpoint / marker).read_text())
    except (OSError, ValueError):
        return False
    bad = damaged_files(checkpoint)
    if bad:
        warnings.warn(f"{checkpoint}: damaged {', '.join(bad)}; not resuming from it", stacklevel=2)
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
