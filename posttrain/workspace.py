"""A fresh copy of the project as its own git repository: for end-to-end tests, benchmarks and
experiments that must not touch the user's workspace.

Example:
    >>> repo = clone_workspace(Path("/work/main"), Path("/tmp/x"), profile="configs/params.smoke.yaml")  # doctest: +SKIP
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def clone_workspace(source: Path, dest: Path, profile: str | None = None) -> Path:
    """Copy the files git tracks (or would track) from ``source`` into ``dest``, without generated
    outputs or ``dvc.lock``; optionally use ``profile`` as params.yaml; commit it all."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=source,
                           capture_output=True, text=True, check=True).stdout.split()
    for f in files:
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
