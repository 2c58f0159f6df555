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
import fcntl
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from posttrain.errors import UserError


def prefect_settings(root: Path | str = ".") -> dict[str, str]:
    return {
        "PREFECT_HOME": str(Path(root).resolve() / ".prefect"),
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }


def apply_prefect_settings(root: Path | str = ".") -> None:
    for key, value in prefect_settings(root).items():
        os.environ.setdefault(key, value)


class ExplainedFailureFilter(logging.Filter):
    """Drops the traceback Prefect's engine logs with a task or flow that failed on a CommandFailed or a UserError:
    the message already holds the failed stage's last lines (or the bad key), the traceback only points at our own
    ``raise`` through forty lines of Prefect's engine, twice (task, then flow), before the CLI's one-line error."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], (CommandFailed, UserError)):
            record.exc_info, record.exc_text = None, None
        return True


def quiet_explained_failures() -> None:
    """Install ``ExplainedFailureFilter`` on Prefect's flow and task run loggers (once); a crash keeps its traceback."""
    for name in ("prefect.flow_runs", "prefect.task_runs"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, ExplainedFailureFilter) for f in logger.filters):
            logger.addFilter(ExplainedFailureFilter())


def start_prefect_server() -> None:
    """Start Prefect's temporary API server now (unless ``PREFECT_API_URL`` names a standing one), with SIGINT blocked
    in the process it spawns: a signal mask survives exec and uvicorn only sets handlers. A terminal's Ctrl-C reaches
    every process of the foreground group, and the server it killed left the interrupted flow retrying its crash
    report against a dead API for two and a half minutes, ending in a network traceback. Prefect's clients reuse
    this one server (one per process) and stop it at exit with SIGTERM, which is not blocked."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        SubprocessASGIServer().start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)  # a Ctrl-C meanwhile is delivered here, to this process


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
    watchdog = group_watchdog(proc.pid)
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
        release(watchdog)


# Reads its stdin to the end: nothing there means the process that started the group died before it could say
# the group is done (a SIGKILL leaves no chance to stop it), so the group goes too.
WATCHDOG = """
import os, signal, sys
if not sys.stdin.buffer.read():
    try:
        os.killpg(int(sys.argv[1]), signal.SIGKILL)
    except ProcessLookupError:
        pass
"""


def group_watchdog(pgid: int) -> subprocess.Popen:
    """A process that SIGKILLs process group ``pgid`` if this process dies without ``release``-ing it. The group
    is a session of its own, so nothing else reaches it: Prefect's runner SIGKILLs a cancelled flow run 30 s after
    its SIGTERM, as our grace period ends, and the OOM killer or `kill -9` give no grace at all; the stage then ran
    on, holding the cores and DVC's lock. The watchdog has a session of its own too, out of reach of the terminal's
    Ctrl-C and of a kill of this process."""
    return subprocess.Popen([sys.executable, "-c", WATCHDOG, str(pgid)], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def release(watchdog: subprocess.Popen) -> None:
    """Tell ``watchdog`` its group is done with (it ended, or ``stop_group`` ended it), so it exits."""
    watchdog.communicate(b"done")  # writes, closes and waits; a watchdog gone already is no error


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


PIPELINE_LOCK = Path(".dvc/tmp/posttrain-pipeline.lock")


@contextlib.contextmanager
def pipeline_lock(path: Path = PIPELINE_LOCK):
    """Hold the repository's pipeline lock for a whole flow run, or stop at once with a UserError if another run holds
    it. DVC locks only while one of its commands runs: between two stages, and even while a stage runs, a second
    run with a profile or overrides rewrote params.yaml under the first one's stages. The kernel drops the lock
    with the process that held it, so a killed run leaves none behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+", encoding="utf-8") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            raise UserError(f"another pipeline run (PID {f.read().strip() or '?'}) is running in this repository "
                            f"({path} is its lock); start this one when it has finished") from None
        f.truncate(0)
        f.write(str(os.getpid()))
        f.flush()
        yield
