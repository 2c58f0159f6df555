"""The sandbox turns misbehaving programs into "no answer" with a reason; the host is unaffected."""
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from posttrain.confinement import available_layers, confine, interpreter, system_read_roots
from posttrain.sandbox import SandboxLimits, run_program, run_programs

FAST = SandboxLimits(cpu_seconds=1, wall_seconds=3.0, memory_mb=128)


def test_runs_a_program():
    r = run_program("print(sum(range(10)))")
    assert r.ok and r.stdout == "45\n"


HOSTILE = [
    ("while True:\n    pass", "killed"),
    ("import time\ntime.sleep(30)", "timeout"),
    ("x = bytearray(10**9)", "MemoryError"),
    ("import socket\nsocket.create_connection(('127.0.0.1', 80))", "socket"),
    ("import os\nos.system('true')", "os.system"),
    ("import subprocess\nsubprocess.run(['true'])", "subprocess"),
    ("import os\nos.fork()", "os.fork"),
    ("open('/tmp/posttrain-sandbox-escape', 'w').write('x')", "outside"),
    ("import os\nos.remove('/etc/hostname')", "outside"),
    ("print(open('/etc/passwd').read())", "outside"),
    ("import os\nprint(os.environ)", "environ"),
    ("import ctypes", "ctypes"),
    ("print('x' * 10**6)", "output too large"),
    ("def f(): return f()\nf()", "RecursionError"),
    ("raise ValueError('boom')", "ValueError"),
    ("import os\nwhile True:\n    os.fork()", "os.fork"),                       # fork bomb
    ("x = [0] * 10**9", "MemoryError"),                                         # memory bomb, another shape
    ("__import__('os').system('true')", "os.system"),                           # import tricks
    ("import importlib\nimportlib.import_module('ctypes')", "ctypes"),
    ("import shutil\nshutil.rmtree('/work')", "rmtree"),                        # deleting files
    ("import sys\nsys.stdout.write('y' * 10**8)", "MemoryError"),              # huge output
    ("print(open('/proc/self/environ').read())", "outside"),                    # secrets through /proc
    ("import os\nos.kill(os.getppid(), 9)", "os.kill"),                         # attacking the host process
    ("import os\nos.killpg(0, 9)", "os.killpg"),
    # _posixsubprocess.fork_exec forks and execs with no audit event of its own; multiprocessing spawns through it
    ("import _posixsubprocess", "import _posixsubprocess"),
    ("import multiprocessing\nmultiprocessing.Process(target=print).start()", "import multiprocessing"),
    ("import _imp, importlib.util\n_imp.create_dynamic(importlib.util.find_spec('_socket'))", "import _socket"),
    ("import resource\nresource.setrlimit(resource.RLIMIT_CPU, (-1, -1))", "resource.setrlimit"),
    # rewriting the hook's settings: they used to be module globals of __main__, reachable from the program
    ("import sys\nm = sys.modules['__main__']\nm._blocked = (); m._tmp = '/'; m._allowed_read = ('/',)\n"
     "open('/tmp/posttrain-sandbox-escape', 'w').write('x')", "outside"),
    ("import gc", "import gc"),                                                 # gc.get_objects() reaches the hook
]


@pytest.mark.parametrize("code, reason", HOSTILE)
def test_hostile_programs_yield_no_answer(code, reason):
    r = run_program(code, FAST)
    assert not r.ok and r.stdout == ""
    assert reason in r.reason, r.reason
    assert not os.path.exists("/tmp/posttrain-sandbox-escape")


@pytest.mark.parametrize("flags", ["os.O_RDONLY | os.O_CREAT", "os.O_RDONLY | os.O_TRUNC"])
def test_a_read_only_open_that_creates_or_truncates_is_a_write(flags):
    # the standard library is readable; O_CREAT or O_TRUNC on an O_RDONLY open would plant or empty a file in it
    target = Path(sys.base_prefix) / f"posttrain-sandbox-probe-{uuid.uuid4().hex}.txt"
    try:
        r = run_program(f"import os\nos.close(os.open({str(target)!r}, {flags}, 0o644))", FAST)
        assert not r.ok and "outside" in r.reason, r.reason
        assert not target.exists()
    finally:
        target.unlink(missing_ok=True)


def test_a_write_under_a_directory_handle_outside_the_sandbox_is_refused():
    # the open event names the relative path only, not the directory handle it is relative to: the audit hook
    # reads it as a path in the sandbox directory, and only the kernel's Landlock rules refuse it
    if "landlock" not in available_layers():
        pytest.skip("this kernel does not offer Landlock")
    name = f"posttrain-sandbox-probe-{uuid.uuid4().hex}.txt"
    try:
        r = run_program(f"import os, sys\nfd = os.open(sys.base_prefix, os.O_RDONLY)\n"
                        f"os.open({name!r}, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)", FAST)
        assert not r.ok and "Permission denied" in r.reason, r.reason
        assert not (Path(sys.base_prefix) / name).exists()
    finally:
        (Path(sys.base_prefix) / name).unlink(missing_ok=True)


def test_output_past_the_cap_stops_the_program_at_once():
    start = time.perf_counter()
    r = run_program("import sys, time\nsys.stdout.write('x' * 10**6)\nsys.stdout.flush()\ntime.sleep(30)", FAST)
    assert r.reason == "output too large" and time.perf_counter() - start < FAST.wall_seconds


def test_secrets_in_the_parent_environment_are_invisible(monkeypatch):
    monkeypatch.setenv("POSTTRAIN_TEST_SECRET", "hunter2")
    r = run_program("import os, sys\nprint(sys.argv, sys.flags.isolated, dict(os.environb))")
    assert r.ok and "hunter2" not in r.stdout and "POSTTRAIN_TEST_SECRET" not in r.stdout


def test_many_programs_in_parallel_keep_order():
    codes = [f"print({i} * 2)" for i in range(20)] + ["while True: pass"]
    results = run_programs(codes, FAST, workers=4)
    assert [r.stdout.strip() for r in results[:20]] == [str(i * 2) for i in range(20)]
    assert not results[-1].ok


def _children() -> list[int]:
    """Live child processes of this process (from /proc: no psutil needed)."""
    kids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:
            continue
        if fields.get("PPid", "").strip() == str(os.getpid()) and not fields.get("State", "").startswith("Z"):
            kids.append(int(status.parent.name))
    return kids


def test_the_whole_battery_at_once_leaves_the_host_healthy():
    codes = [code for code, _ in HOSTILE] * 2
    results = run_programs(codes, FAST, workers=4)
    assert not any(r.ok for r in results)
    assert [reason in r.reason for r, (_, reason) in zip(results, HOSTILE * 2)] == [True] * len(codes)
    assert not os.path.exists("/tmp/posttrain-sandbox-escape") and Path("/etc/hostname").exists()
    assert _children() == [], "a sandboxed program left a process behind"
    assert run_program("print(6 * 7)").stdout == "42\n"  # and the sandbox still works


KERNEL_PROBES = """
import os, socket, sys

def attempt(name, action):
    try:
        action()
        print(name, "allowed")
    except OSError:
        print(name, "refused")

outside, port, host = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
attempt("write outside", lambda: open(os.path.join(outside, "planted.txt"), "w").write("x"))
attempt("read outside", lambda: open(os.path.join(outside, "secret.txt")).read())
attempt("connect", lambda: socket.create_connection(("127.0.0.1", port), timeout=2))
attempt("fork", lambda: os.fork() or os._exit(0))
attempt("signal the host", lambda: os.kill(host, 0))
attempt("write inside", lambda: open("inside.txt", "w").write("x"))
"""
REFUSED_BY = {"namespaces": {"connect"}, "landlock": {"write outside", "read outside", "connect", "signal the host"},
              "seccomp": {"fork"}}


@pytest.mark.parametrize("layer", sorted(REFUSED_BY))
def test_each_kernel_layer_holds_without_the_audit_hook(layer, tmp_path):
    # each layer the kernel enforces, alone: a program that got past the audit hook still cannot reach the host
    if layer not in available_layers():
        pytest.skip(f"this kernel does not offer {layer}")
    box, outside = tmp_path / "box", tmp_path / "outside"
    box.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("hunter2")
    with socket.create_server(("127.0.0.1", 0)) as server:
        args = [str(outside), str(server.getsockname()[1]), str(os.getpid())]
        out = subprocess.run([interpreter(), "-I", "-S", "-c", KERNEL_PROBES, *args], cwd=box, env={},
                             capture_output=True, text=True, timeout=60,
                             preexec_fn=lambda: confine(system_read_roots(), str(box), frozenset([layer])))
    seen = dict(line.rsplit(" ", 1) for line in out.stdout.splitlines())
    assert {k for k, v in seen.items() if v == "refused"} == REFUSED_BY[layer], out.stdout + out.stderr
    assert (box / "inside.txt").exists()
