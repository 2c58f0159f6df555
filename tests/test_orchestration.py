"""run_logged / run_dvc: a flow task's command streams its output, and an interrupted task stops all it started."""
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import posttrain.orchestration as orchestration
from posttrain.orchestration import run_dvc, run_logged


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def test_each_line_reaches_the_log_while_the_command_runs(tmp_path):
    # the command waits for a file that only the log callback of its first line creates
    flag = tmp_path / "seen"
    cmd = python(f"""
        import pathlib, sys, time
        print("first", flush=True)
        for _ in range(200):
            if pathlib.Path({str(flag)!r}).exists():
                break
            time.sleep(0.05)
        else:
            sys.exit(3)
        print("progress 50%\\rprogress 100%", file=sys.stderr, flush=True)
        print("second")
    """)
    logged = []

    def log(line):
        logged.append(line)
        flag.touch()

    code, output = run_logged(cmd, {}, log)
    assert code == 0
    assert logged == ["first", "progress 50%", "progress 100%", "second"]  # a \r refresh is a line of its own
    assert output.splitlines() == logged


@pytest.mark.parametrize("ignores_sigint", [False, True])
def test_an_interrupted_run_stops_the_command_and_what_it_started(tmp_path, monkeypatch, ignores_sigint):
    # as `dvc repro` starts a stage: a child that starts a grandchild and waits on it
    monkeypatch.setattr(orchestration, "INTERRUPT_GRACE_SECONDS", 2.0)
    grandchild = "import signal, time\n" + ("signal.signal(signal.SIGINT, signal.SIG_IGN)\n" if ignores_sigint else "") \
        + "time.sleep(600)"
    cmd = python(f"""
        import os, subprocess, sys
        stage = subprocess.Popen([sys.executable, "-c", {grandchild!r}])
        print(os.getpid(), stage.pid, flush=True)
        stage.wait()
    """)
    pids = []

    def log(line):
        pids.extend(int(p) for p in line.split())
        raise KeyboardInterrupt  # Ctrl-C (or Prefect's cancellation) while the stage runs

    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_logged(cmd, {}, log)
    assert len(pids) == 2
    for _ in range(50):  # the orphaned grandchild is reaped by init, not by us
        if not any(running(p) for p in pids):
            break
        time.sleep(0.1)
    assert not any(running(p) for p in pids), "the interrupted command or the process it started still runs"
    assert time.monotonic() - start < 20



def test_a_second_interruption_kills_at_once(monkeypatch):
    # a stage that ignores SIGINT, a long grace, and a second Ctrl-C one second into it
    monkeypatch.setattr(orchestration, "INTERRUPT_GRACE_SECONDS", 600.0)
    cmd = python("""
        import os, signal, time
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print(os.getpid(), flush=True)
        time.sleep(600)
    """)
    pids = []

    def second_interrupt(*_):
        raise KeyboardInterrupt

    def log(line):
        pids.append(int(line))
        signal.signal(signal.SIGALRM, second_interrupt)
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        raise KeyboardInterrupt

    previous = signal.getsignal(signal.SIGALRM)
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_logged(cmd, {}, log)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.monotonic() - start < 30
    assert not running(pids[0])

def test_run_dvc_names_what_failed_with_the_output_tail(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RuntimeError, match=r"stage nothing failed \(exit \d+\):\nERROR: you are not inside of a DVC repository"):
        run_dvc(["repro", "--single-item", "nothing"], {}, lambda line: None, what="stage nothing")


def test_a_cancelled_prefect_flow_run_stops_the_stage_it_was_running(tmp_path):
    # Prefect cancels a flow run by SIGTERM to its process, which its engine turns into an exception in the task
    pids = tmp_path / "pids"
    stage = """
        import os, subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(os.getpid(), child.pid, flush=True)
        child.wait()
    """
    script = tmp_path / "flow.py"
    script.write_text(textwrap.dedent(f"""
        import pathlib, sys
        from posttrain.orchestration import apply_prefect_settings, run_logged
        apply_prefect_settings({str(tmp_path)!r})
        from prefect import flow, task

        @task
        def stage():
            return run_logged({python(stage)!r}, {{}}, pathlib.Path({str(pids)!r}).write_text)

        @flow
        def pipeline():
            return stage()

        pipeline()
    """))
    # a group of its own, to take down at the end the ephemeral Prefect server the flow starts (it outlives a
    # SIGTERM'd flow process)
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 180
        while not (pids.exists() and pids.read_text().strip()) and time.monotonic() < deadline:
            assert proc.poll() is None, "the flow ended before its stage started"
            time.sleep(0.2)
        started = [int(p) for p in pids.read_text().split()]
        proc.send_signal(signal.SIGTERM)  # what Prefect's runner does to cancel
        proc.wait(timeout=60)
        for _ in range(50):
            if not any(running(p) for p in started):
                break
            time.sleep(0.1)
        assert not any(running(p) for p in started), "the cancelled flow's stage still runs"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_killed_flow_process_takes_its_stage_down_with_it(tmp_path):
    """Prefect's runner cancels a flow run with SIGTERM and SIGKILLs it 30 s later, as long as our own grace: a
    stage still stopping then (or a flow process killed by the OOM killer or `kill -9`) ran on, in a session of
    its own, holding the cores and DVC's lock."""
    pids = tmp_path / "pids"
    stage = """
        import os, signal, subprocess, sys
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a stage slow to stop
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(os.getpid(), child.pid, flush=True)
        child.wait()
    """
    flow = python(f"""
        import pathlib
        from posttrain.orchestration import run_logged
        run_logged({python(stage)!r}, {{}}, pathlib.Path({str(pids)!r}).write_text)
    """)
    proc = subprocess.Popen(flow, cwd=Path(__file__).resolve().parents[1], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    started = []
    try:
        deadline = time.monotonic() + 60
        while not (pids.exists() and pids.read_text().strip()) and time.monotonic() < deadline:
            assert proc.poll() is None, "the flow process ended before its stage started"
            time.sleep(0.1)
        started = [int(p) for p in pids.read_text().split()]
        proc.send_signal(signal.SIGINT)  # the interruption: our grace period starts
        time.sleep(1)
        proc.kill()  # the runner's SIGKILL, before our grace ran out
        proc.wait()
        for _ in range(100):
            if not any(running(p) for p in started):
                break
            time.sleep(0.1)
        assert not any(running(p) for p in started), "the killed flow's stage still runs"
    finally:
        for p in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_prefects_temporary_server_outlives_the_terminals_ctrl_c(tmp_path):
    """A terminal's Ctrl-C reaches the whole foreground group: it killed the temporary API server, and the flow then
    retried its crash report against it for 2.5 minutes. The server now starts with SIGINT blocked (and still stops
    on Prefect's SIGTERM at exit)."""
    probe = textwrap.dedent("""
        import os, re, signal, time
        from posttrain.orchestration import apply_prefect_settings, start_prefect_server
        apply_prefect_settings(os.environ["PROBE_ROOT"])
        from prefect.server.api.server import SubprocessASGIServer
        start_prefect_server()
        server = SubprocessASGIServer().server_process
        blocked = int(re.search(r"SigBlk:\\s*([0-9a-f]+)", open(f"/proc/{server.pid}/status").read()).group(1), 16)
        os.kill(server.pid, signal.SIGINT)
        time.sleep(2)
        print(bool(blocked & 1 << (signal.SIGINT - 1)), server.poll() is None,
              bool(signal.pthread_sigmask(signal.SIG_BLOCK, set()) & {signal.SIGINT}))
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    out = subprocess.run([sys.executable, "-c", probe], env={**env, "PROBE_ROOT": str(tmp_path)}, capture_output=True,
                         text=True, timeout=300)
    # blocked in the server, the server alive after a SIGINT, and this process's own mask as it was
    assert out.stdout.split() == ["True", "True", "False"], out.stdout + out.stderr[-3000:]


@pytest.mark.parametrize("error, traceback_kept", [
    (orchestration.CommandFailed("stage train_rm failed (exit 1):\nits last lines"), False),
    (orchestration.UserError("params.yaml: rlhf.budget: must be at most 1"), False),
    (ZeroDivisionError("a crash of our own"), True),
])
def test_a_stage_failure_the_cli_explains_reaches_prefects_log_without_a_traceback(error, traceback_kept):
    """Prefect's engine logs a failed task, then its flow, each with a traceback through its own frames: 80 lines
    before the CLI's one-line error, for a failure whose message already names the stage and its last lines."""
    import logging

    import flows.pipeline  # noqa: F401  (installs the filter, as `posttrain run` and the deployments import it)

    for name in ("prefect.task_runs", "prefect.flow_runs"):
        try:
            raise error
        except Exception:
            record = logging.getLogger(name).makeRecord(name, logging.ERROR, __file__, 0, "Task run failed with "
                                                        "exception: %r", (error,), sys.exc_info())
        assert all(f.filter(record) for f in logging.getLogger(name).filters)
        text = logging.Formatter().format(record)
        assert str(error).splitlines()[0] in text
        assert ("Traceback" in text) is traceback_kept, name
