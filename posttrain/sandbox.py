"""Run model-written Python (the DOTS ``pot`` action) in a separate, limited process.

Layers, each closing a different hole:
- a fresh interpreter (``python -I -S``) in an empty temporary directory, with an empty environment,
  so no secret in the parent's environment is visible;
- kernel resource limits set before exec: CPU seconds, address space, file size, open files, and one process
  (no fork, no thread);
- kernel confinement set before exec (``posttrain.confinement``, where the kernel offers it): no network, no
  capability on the host, and Landlock's file rules (read the Python install and system libraries, write only the
  temporary directory), no signal to a process outside the sandbox. These hold even against a program that gets
  around the audit hook below;
- a wall-clock timeout enforced by the parent, which kills the child's whole process group;
- a Python audit hook installed before the program runs (it cannot be removed afterwards, and its settings live
  in a closure the program cannot reach) that refuses sockets, subprocesses, forks, signals, ctypes, raised resource limits, file writes, creations,
  truncations or deletions outside the temporary directory, reads outside it and the standard library, and the
  import of the modules that reach the kernel without an audit event of their own (``_posixsubprocess`` forks
  and execs silently; ``multiprocessing`` spawns through it);
- output read as it comes and capped at ``max_output_bytes``: a program that prints without end is killed at
  the cap, not buffered in the caller's memory.

A program that loops, allocates without bound, raises, or tries any of the above yields
``SandboxResult(answer=None, reason=...)``; the calling stage never crashes or hangs.

Example:
    >>> run_program("print(6 * 7)").stdout
    '42\\n'
"""
from __future__ import annotations

import os
import resource
import selectors
import signal
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from posttrain.confinement import available_layers, confine, interpreter, system_read_roots

_BOOTSTRAP = r"""
def _install_hook():
    # everything the hook reads lives in this closure, out of the program's reach (a module global of __main__
    # could be rewritten through sys.modules['__main__'], and the hook would then allow everything)
    import sys, os
    tmp = os.getcwd()
    allowed_read = tuple(p for p in {sys.prefix, sys.base_prefix, sys.exec_prefix, tmp} if p)
    blocked = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
               "os.kill", "os.killpg", "ctypes.", "os.putenv", "os.unsetenv", "pty.", "os.chdir", "os.chmod",
               "os.chown", "os.link", "os.symlink", "shutil.", "winreg.", "sys.settrace", "sys.setprofile",
               "resource.setrlimit", "resource.prlimit")
    no_import = frozenset({"_posixsubprocess", "subprocess", "_ctypes", "ctypes", "_socket", "socket",
                           "_multiprocessing", "multiprocessing", "_posixshmem", "pty", "_xxsubinterpreters",
                           "_xxinterpchannels", "gc"})  # gc: it lists every object, this hook among them
    write_events = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.truncate", "os.utime")
    realpath, fsdecode, O_WRITES = os.path.realpath, os.fsdecode, (
        os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND)

    def inside(path, roots):
        try:
            p = realpath(fsdecode(path))
        except Exception:
            return False
        return any(p == r or p.startswith(r.rstrip("/") + "/") for r in roots)

    def hook(event, args):
        if event == "import" and str(args[0]).split(".")[0] in no_import:
            raise PermissionError(f"sandbox: import {args[0]} is not allowed")
        if event.startswith(blocked):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event in write_events and not all(inside(a, (tmp,)) for a in args if isinstance(a, (str, bytes))):
            raise PermissionError(f"sandbox: {event} outside the sandbox directory")
        if event == "open":
            path, mode, flags = args
            if isinstance(path, int):
                return
            # O_CREAT and O_TRUNC write even with O_RDONLY: they would create or empty a file in the Python install
            writes = (mode and any(c in mode for c in "wax+")) or (flags or 0) & O_WRITES
            if not inside(path, (tmp,) if writes else allowed_read):
                raise PermissionError(f"sandbox: open({path!r}) outside the sandbox directory")

    with open("program.py") as f:
        code = f.read()
    sys.addaudithook(hook)
    del os.environ
    return code


_code = _install_hook()
del _install_hook
exec(compile(_code, "program.py", "exec"), {"__name__": "__main__"})
"""


_STDERR_TAIL = 16384  # bytes of a failed program's stderr kept for its last line


@dataclass(frozen=True)
class SandboxLimits:
    cpu_seconds: int = 2
    wall_seconds: float = 5.0
    memory_mb: int = 256
    max_output_bytes: int = 4096


@dataclass(frozen=True)
class SandboxResult:
    stdout: str
    ok: bool
    reason: str  # "ok", "timeout", "error: <last stderr line>", "output too large", ...


def sandbox_limits(cfg) -> SandboxLimits:
    """Limits from the ``sandbox`` section of params.yaml."""
    return SandboxLimits(cfg.cpu_seconds, cfg.wall_seconds, cfg.memory_mb)


def _limit_child(limits: SandboxLimits, tmp: str):
    # probed and listed here, in the parent: between fork and exec the child only applies them
    layers, read_roots = available_layers(), system_read_roots()

    def apply() -> None:
        os.setsid()  # own process group, so a timeout kills everything it started
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds))
        mem = limits.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024 * 1024, 1024 * 1024))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        confine(read_roots, tmp, layers)

    return apply


def _read_capped(proc: subprocess.Popen, limits: SandboxLimits) -> tuple[bytes, bytes, str | None]:
    """The child's stdout and stderr as they come, until both close and it exits; stops early with "timeout" at
    the wall limit or "output too large" past the cap (stderr keeps only its tail: the error is its last line)."""
    deadline = time.monotonic() + limits.wall_seconds
    out, err = bytearray(), bytearray()
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return bytes(out), bytes(err), "timeout"
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                key.data.extend(chunk)
            if len(out) > limits.max_output_bytes:
                return bytes(out), bytes(err), "output too large"
            del err[:-_STDERR_TAIL]
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:  # closed its output but runs on
        return bytes(out), bytes(err), "timeout"
    return bytes(out), bytes(err), None


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_program(code: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Execute ``code`` in the sandbox; never raises for anything the program does."""
    with tempfile.TemporaryDirectory(prefix="posttrain-sandbox-") as tmp:
        Path(tmp, "program.py").write_text(code, encoding="utf-8")
        with subprocess.Popen(
            [interpreter(), "-I", "-S", "-c", _BOOTSTRAP],
            cwd=tmp, env={}, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            preexec_fn=_limit_child(limits, tmp),
        ) as proc:
            out, err, stopped = _read_capped(proc, limits)
            if stopped:
                _kill(proc)
                return SandboxResult("", False, stopped)
    if proc.returncode != 0:
        if proc.returncode < 0:
            return SandboxResult("", False, f"killed by {signal.Signals(-proc.returncode).name}")
        lines = err.decode("utf-8", "replace").strip().splitlines()
        return SandboxResult("", False, "error: " + (lines[-1][:200] if lines else f"exit {proc.returncode}"))
    return SandboxResult(out.decode("utf-8", "replace"), True, "ok")


def run_programs(codes: list[str], limits: SandboxLimits = SandboxLimits(), workers: int = 2) -> list[SandboxResult]:
    """Run many programs, at most ``workers`` at once, results in input order."""
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(lambda c: run_program(c, limits), codes))
