"""Errors the user can fix (bad params, bad rows, missing models) and the stage entry point that
reports them as one clear message instead of a traceback."""
from __future__ import annotations

import functools
import logging
import sys


class UserError(Exception):
    """A problem in the user's inputs; its message names the file, key or row to fix."""


def stage_main(fn):
    """Decorate a stage's ``main``: log to stderr, turn a UserError into ``error: ...`` and exit 2, and Ctrl-C into
    one line and exit 130 (a traceback from wherever torch was, before)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        except KeyboardInterrupt:
            stage = fn.__module__.rpartition(".")[2]
            print(f"{stage}: interrupted; `dvc repro` resumes it from its last checkpoint", file=sys.stderr)
            sys.exit(130)

    return wrapper
