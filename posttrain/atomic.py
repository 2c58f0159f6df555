"""Atomic writes: a killed stage never leaves a half-written output for DVC to cache.

Files are written to a temporary sibling and renamed into place; directories are built in a
temporary sibling and swapped in by two renames (the old one aside, the new one in: POSIX has no portable
exchange of two directories), and a kill between them is undone on the next write of that directory. The
siblings are made by plain ``open``/``mkdir``, so outputs get the user's umask like any other file (``tempfile``'s private 0600 / 0700 modes would leave every model and
report unreadable to the rest of a team, or to an MLflow or Prefect server running as another user).

In a multi-process launch only rank 0 writes (see ``posttrain.process_group``).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import shutil
import tempfile
from pathlib import Path

from posttrain.process_group import is_main_process, wait_for_everyone


def temporary_sibling(path: Path) -> Path:
    """A fresh hidden name beside ``path`` (same filesystem, so the final rename is atomic)."""
    return path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")


def _is_token(text: str) -> bool:
    return len(text) == 12 and all(c in "0123456789abcdef" for c in text)


def stale_temporaries(path: Path) -> list[Path]:
    """Temporary siblings an earlier, killed write of the directory ``path`` left: its build, or its old version
    being removed (``temporary_sibling`` names both). Nothing else writes ``path`` while its stage runs (DVC's lock)."""
    prefixes = (f".{path.name}.", f"..{path.name}.old.")
    return [p for p in path.parent.iterdir() if p.name.endswith(".tmp")
            and any(p.name.startswith(pre) and _is_token(p.name[len(pre):-len(".tmp")]) for pre in prefixes)]


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file in the same directory and ``os.replace`` (on rank 0 only)."""
    if not is_main_process():
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(path)
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def finite_json(obj):
    """``obj`` with every NaN or infinite float replaced by None. JSON has neither: Python's json writes them as
    bare ``NaN`` / ``Infinity``, which strict parsers (jq, JavaScript, so DVC's VS Code extension and Studio)
    refuse, losing the whole metrics file for the sake of one undefined figure (a Spearman on a constant column)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj


def atomic_write_json(path: str | Path, obj) -> None:
    """Strict JSON (an undefined figure is null, see ``finite_json``), keys sorted so a re-run diffs cleanly."""
    atomic_write_text(path, json.dumps(finite_json(obj), indent=2, sort_keys=True, allow_nan=False) + "\n")


@contextlib.contextmanager
def atomic_dir(path: str | Path):
    """Yield a temporary directory; on success it replaces ``path`` whole, on error it is removed.

    On ranks other than 0 the directory is thrown away; every rank leaves once rank 0 has swapped it in."""
    if not is_main_process():
        with tempfile.TemporaryDirectory(prefix=f"{Path(path).name}.rank") as tmp:
            yield Path(tmp)
        wait_for_everyone()
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    old = path.with_name(f".{path.name}.old")
    if old.is_dir() and not path.exists():  # a kill between the two renames of an earlier swap: put it back
        os.replace(old, path)
    for stale in stale_temporaries(path):  # a kill mid-build left a whole copy (of a model: gigabytes) each time
        shutil.rmtree(stale, ignore_errors=True)
    tmp = temporary_sibling(path)
    tmp.mkdir()
    try:
        yield tmp
        if path.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            # renamed before it is removed: a kill midway through the removal must not leave a half-deleted `old`,
            # which the repair above would put back as the output once DVC has removed it for a re-run
            trash = temporary_sibling(old)
            os.replace(old, trash)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    wait_for_everyone()
