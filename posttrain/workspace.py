"""A fresh copy of the project as its own git repository, for end-to-end tests, benchmarks and experiments
that must not touch the user's workspace; and the checks a kill-and-resume run makes on such a copy (kill a
command's process group at a chosen moment, verify DVC's cache and a stage's outputs).

Example:
    >>> repo = clone_workspace(Path("/work/main"), Path("/tmp/x"), profile="configs/params.smoke.yaml")  # doctest: +SKIP
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml


def clone_workspace(source: Path, dest: Path, profile: str | None = None) -> Path:
    """Copy the files git tracks (or would track) from ``source`` into ``dest``, without generated
    outputs or ``dvc.lock``; optionally use ``profile`` as params.yaml; commit it all."""
    # -z: NUL-separated, unquoted names (a plain listing splits 'user data.jsonl' and quotes non-ASCII names)
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=source,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for f in filter(None, files):
        if (source / f).is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / f, dest / f)
    if profile:
        shutil.copy(dest / profile, dest / "params.yaml")
    (dest / "dvc.lock").unlink(missing_ok=True)
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=posttrain", "-c", "user.email=posttrain@localhost", "commit", "-qm",
                 "workspace copy"]):
        subprocess.run(cmd, cwd=dest, check=True)
    return dest


@dataclass
class KilledRun:
    seconds: float  # from start to the kill (or to the command's own exit)
    killed: bool  # False: the command exited (or never became ready) before the kill
    returncode: int | None  # the command's own exit code if it exited first, else None


def run_and_kill(cmd: list[str], cwd: Path, env: dict, kill_now: Callable[[float], bool], timeout: float = 3600,
                 poll_s: float = 0.02) -> KilledRun:
    """Start ``cmd`` in its own session and SIGKILL its whole process group (dvc, the stage, its workers) as soon
    as ``kill_now(seconds since start)`` is true, or at ``timeout``; returns when and whether it was killed. Polls
    every ``poll_s`` so a kill can land while a file is being written."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    while proc.poll() is None:
        elapsed = time.perf_counter() - start
        if kill_now(elapsed) or elapsed > timeout:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:  # the group exited between the poll and the kill
                break
            proc.wait()
            return KilledRun(elapsed, True, None)
        time.sleep(poll_s)
    return KilledRun(time.perf_counter() - start, False, proc.wait())


def damaged_cache_objects(repo: Path) -> list[str]:
    """What is wrong with ``repo``'s DVC cache: objects whose content does not hash to their name (half-written
    or damaged), files that are not objects (left-over temporaries), and outputs recorded in dvc.lock whose object
    (or, for a directory, any of its files' objects) is missing. Empty when the cache is whole."""
    root = repo / ".dvc/cache/files/md5"
    problems = []
    for f in sorted(root.rglob("*")) if root.exists() else []:
        if not f.is_file():
            continue
        name = f.parent.name + f.name.removesuffix(".dir")
        if len(name) != 32 or any(c not in "0123456789abcdef" for c in name):
            problems.append(f"not a cache object: {f.relative_to(repo)}")
        elif hashlib.md5(f.read_bytes()).hexdigest() != name:
            problems.append(f"content does not match its hash: {f.relative_to(repo)}")
    uncached = {path for stage in yaml.safe_load((repo / "dvc.yaml").read_text())["stages"].values()
                for kind in ("outs", "metrics", "plots") for out in stage.get(kind, []) if isinstance(out, dict)
                for path, opts in out.items() if not (opts or {}).get("cache", True)}
    lock = yaml.safe_load((repo / "dvc.lock").read_text()) if (repo / "dvc.lock").exists() else {}
    for stage, entry in (lock.get("stages") or {}).items():
        for out in entry.get("outs", []):
            md5 = out.get("md5", "")
            if out["path"] in uncached:
                continue
            obj = root / md5[:2] / md5[2:]
            if not obj.is_file():
                problems.append(f"{stage}: {out['path']} has no cache object {md5}")
            elif md5.endswith(".dir"):
                problems += [f"{stage}: {out['path']}/{e['relpath']} has no cache object {e['md5']}"
                             for e in json.loads(obj.read_text())
                             if not (root / e["md5"][:2] / e["md5"][2:]).is_file()]
    return problems


def invalid_outputs(paths: list[Path]) -> list[str]:
    """Files under ``paths`` that do not parse as their kind (JSONL row by row, JSON, safetensors headers, torch
    zips, CSV, PNG): what a consumer of a stage's outputs would trip on."""
    from PIL import Image

    from posttrain.checkpoints import WEIGHT_SUFFIXES, is_damaged
    from posttrain.jsonl import read_jsonl

    bad = []
    for path in paths:
        for f in sorted(path.rglob("*")) if path.is_dir() else [path]:
            if not f.is_file():
                continue
            try:
                if f.suffix == ".jsonl":
                    read_jsonl(f)
                elif f.suffix == ".json":
                    json.loads(f.read_text())
                elif f.suffix in WEIGHT_SUFFIXES and is_damaged(f):
                    raise ValueError("cut short or unreadable weights")
                elif f.suffix == ".csv":
                    list(csv.reader(f.read_text().splitlines()))
                elif f.suffix == ".png":
                    with Image.open(f) as image:
                        image.verify()
            except Exception as e:  # noqa: BLE001 - any failure to parse is the finding
                bad.append(f"{f}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    return bad
