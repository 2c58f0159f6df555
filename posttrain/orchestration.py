"""Prefect settings for this repository, applied before Prefect is imported (it reads them at import).

- PREFECT_HOME: Prefect's database and state live in the repository's git-ignored ``.prefect/``, so the
  flow runs of `posttrain run` and the UI of `posttrain ui prefect` see the same history.
- The ephemeral API server gets 90 s to start (Prefect's default, 20 s, is too short on a loaded 2-core
  machine while it creates its database).
- No analytics (and no "database is locked" noise from them).
A setting already in the environment wins.
"""
from __future__ import annotations

import os
from pathlib import Path


def prefect_settings(root: Path | str = ".") -> dict[str, str]:
    return {
        "PREFECT_HOME": str(Path(root).resolve() / ".prefect"),
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }


def apply_prefect_settings(root: Path | str = ".") -> None:
    for key, value in prefect_settings(root).items():
        os.environ.setdefault(key, value)
