"""The judge's verdict cache: a SQLite file (``judge.cache``, kept across runs) so a re-run never pays twice.

Example:
    >>> cache = JudgeCache(".cache/judge.sqlite")                                          # doctest: +SKIP
    >>> cache.put(JudgeCache.key(identity, messages), "A", "... Verdict: A")                # doctest: +SKIP
"""
from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import threading
from pathlib import Path

from posttrain.errors import UserError

log = logging.getLogger(__name__)


class JudgeCacheError(UserError):
    """The cache file cannot be opened as a database."""


class JudgeCache:
    """verdicts keyed by sha256(judge identity, the full prompt): the prompt holds criteria and both responses."""

    def __init__(self, path: str | Path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = sqlite3.connect(str(path), check_same_thread=False, timeout=30)
            self.db.execute("CREATE TABLE IF NOT EXISTS verdicts (key TEXT PRIMARY KEY, verdict TEXT, raw TEXT)")
            self.db.commit()
        except sqlite3.DatabaseError as e:
            # never replaced here: the verdicts in it were paid for
            raise JudgeCacheError(f"judge cache {path}: {e}. Move it aside (`sqlite3 {path} .recover` salvages its "
                                  "verdicts) or point judge.cache at another file") from None
        self.lock = threading.Lock()

    @staticmethod
    def key(identity: list, messages: list[dict]) -> str:
        return hashlib.sha256(json.dumps([identity, messages], sort_keys=True).encode()).hexdigest()

    # A cache another process holds locked past the timeout (two runs sharing one file), or a page damaged after it
    # opened, costs a paid call or a lost entry, never the step: the verdict itself is in hand.
    def get(self, key: str) -> str | None:
        try:
            with self.lock:
                row = self.db.execute("SELECT verdict FROM verdicts WHERE key = ?", (key,)).fetchone()
        except sqlite3.DatabaseError as e:
            log.warning("judge cache unreadable (%s): asking the judge", e)
            return None
        return row[0] if row else None

    def put(self, key: str, verdict: str, raw: str) -> None:
        try:
            with self.lock:
                self.db.execute("INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?)", (key, verdict, raw))
                self.db.commit()
        except sqlite3.DatabaseError as e:
            log.warning("judge cache not written (%s): a re-run pays for this verdict again", e)
