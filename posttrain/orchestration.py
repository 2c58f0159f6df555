"""Prefect settings for this repository, applied before Prefect is imported (it reads them at import).

- PREFECT_HOME: Prefect's database and state live in the repository's git-ignored ``.prefect/``, so the
  flow runs of `posttrain run` and the UI of `posttrain ui prefect` see the same history.
- The ephemeral API server gets 90 s to start (Prefect's default, 20 s, is too short on a loaded 2-core
  machine while it creates its database).
- No analytics (and no "database is locked" noise from them).
A setting already in the environment wins.

``run_dvc`` runs a DVC command for a flow's task: its output reaches the task's log line by line as it comes, and
an interrupted task stops the command together with the stage DVC started.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
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


INTERRUPT_GRACE_SECONDS = 30.0
"""How long an interrupted command gets to stop on SIGINT (DVC releases its lock, a stage stops between steps)
before its process group is killed."""


def run_logged(cmd: Sequence[str], env: dict[str, str], log: Callable[[str], None]) -> tuple[int, str]:
    """Run ``cmd`` in a process group of its own; hand each output line (stdout and stderr) to ``log`` as it comes;
    return the exit code and the whole output.

    If this process is interrupted meanwhile (Ctrl-C, the SIGTERM by which Prefect cancels a flow run, an error in
    ``log``), the whole group gets SIGINT, as Ctrl-C in a terminal would give it, and SIGKILL after
    ``INTERRUPT_GRACE_SECONDS``; then the exception goes on. Killing only the direct child, as ``subprocess.run``
    does, left the stage DVC had started running on, holding the cores and writing into the workspace.
    """
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True)
    lines = []
    try:
        # text mode reads a progress bar's carriage-return refresh as a line of its own
        for line in proc.stdout:
            if line.strip():
                lines.append(line.rstrip())
                log(lines[-1])
        return proc.wait(), "\n".join(lines)
    except BaseException:
        stop_group(proc)
        raise
    finally:
        proc.stdout.close()


def stop_group(proc: subprocess.Popen) -> None:
    """SIGINT to ``proc``'s process group; SIGKILL to whatever of it still runs after the grace period (or at
    once on a second interruption meanwhile)."""
    deadline = time.monotonic() + INTERRUPT_GRACE_SECONDS
    try:
        os.killpg(proc.pid, signal.SIGINT)
        while time.monotonic() < deadline:
            proc.poll()  # reaps the direct child, which would otherwise stay in the group as a zombie
            os.killpg(proc.pid, 0)  # ProcessLookupError once every process in the group has ended
            time.sleep(0.2)
    except ProcessLookupError:
        pass
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class CommandFailed(RuntimeError):
    """A DVC command (a stage it ran) failed; the message names it and holds the output's last lines, which have
    already reached the log as they came, so the command line ends on it without a traceback of its own."""


def run_dvc(args: Sequence[str], extra_env: dict[str, str], log: Callable[[str], None], what: str) -> str:
    """``python -m dvc <args>`` through ``run_logged``; its output, or a CommandFailed naming ``what`` with the
    output's last lines if it fails."""
    env = {**os.environ, **extra_env,
           # dvc.yaml runs `python3 -m stages.<name>`: this interpreter's environment must come first on PATH
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.setdefault("TQDM_MININTERVAL", "30")  # a progress bar writes a log line every 30 s, not ten a second
    code, output = run_logged([sys.executable, "-m", "dvc", *args], env, log)
    if code != 0:
        tail = "\n".join(output.splitlines()[-15:])
        raise CommandFailed(f"{what} failed (exit {code}):\n{tail}")
    return output
