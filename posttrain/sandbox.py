"""Run model-written Python (the DOTS ``pot`` action) in a separate, limited process.

Layers, each closing a different hole:
- a fresh interpreter (``python -I -S``) in an empty temporary directory, with an empty environment,
  so no secret in the parent's environment is visible;
- kernel resource limits set before exec: CPU seconds, address space, file size, open files;
- kernel confinement set before exec, by a launcher process (``posttrain.confinement``, where the kernel offers
  it): no network, no capability on the host, Landlock's file rules (read the Python install and system libraries,
  write only the temporary directory), no socket, no signal to a process outside the sandbox, no fork, no change to
  a file's metadata or inode flags, and the directory a tmpfs of 16 MiB of its own. These hold even against a
  program that gets around the audit hook below;
- a wall-clock timeout enforced by the parent, which kills the child's whole process group;
- a Python audit hook installed before the program runs (it cannot be removed afterwards, and its settings live
  in a closure the program cannot reach) that refuses sockets, subprocesses, forks, signals, ctypes, raised resource
  limits, file writes, creations, truncations, deletions or directory handles outside the temporary directory,
  reads outside it and the standard library, file metadata, and the import of the modules that reach the kernel
  without an audit event of their own (``_posixsubprocess`` forks and execs silently; ``multiprocessing`` spawns
  through it);
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
import selectors
import signal
import subprocess
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from posttrain.confinement import available_layers, confined_argv, interpreter, system_read_roots

_BOOTSTRAP = r"""
def _install_hook():
    # The hook reads only what is bound here, before the program runs: its closure, out of the program's reach (a
    # module global of __main__ could be rewritten through sys.modules['__main__']). It calls only builtin and C
    # functions: a name looked up at call time (any(), which the program can replace in builtins) or Python code
    # (os.path.realpath, whose module globals the program can rewrite) would let the program answer the check. And
    # it keeps no helper function: a refused call's traceback reaches the hook's frame, and from there a helper,
    # whose closure cells are writable.
    import sys, os
    type_, str_, bytes_, int_, issubclass_, PermissionError_, OSError_ = (
        type, str, bytes, int, issubclass, PermissionError, OSError)
    getcwd, lstat, readlink, fsencoding = os.getcwd, os.lstat, os.readlink, sys.getfilesystemencoding()
    tmp = getcwd()
    read_roots = tuple({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, tmp) if p})
    read_prefixes, write_prefix = tuple(r.rstrip("/") + "/" for r in read_roots), tmp.rstrip("/") + "/"
    blocked = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
               "os.kill", "os.killpg", "ctypes.", "os.putenv", "os.unsetenv", "pty.", "os.chdir", "os.chmod",
               "os.chown", "os.link", "os.symlink", "shutil.", "winreg.", "sys.settrace", "sys.setprofile",
               "resource.setrlimit", "resource.prlimit", "os.setxattr", "os.removexattr",
               "fcntl.ioctl")  # FS_IOC_SETFLAGS: a file readable here made immutable or append-only
    no_import = frozenset({"_posixsubprocess", "subprocess", "_ctypes", "ctypes", "_socket", "socket",
                           "_multiprocessing", "multiprocessing", "_posixshmem", "pty", "_xxsubinterpreters",
                           "_xxinterpchannels", "gc"})  # gc: it lists every object, this hook among them
    write_events = frozenset({"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.truncate", "os.utime"})
    read_events = frozenset({"open", "os.listdir", "os.scandir"})
    O_WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def hook(event, args):
        if event == "import":
            if type_(args[0]) is not str_:
                raise PermissionError_("sandbox: import of a name that is not a plain str is not allowed")
            # the last part too: _imp.create_dynamic loads a file under any dotted name and takes the module's init
            # function from the name's last part, so "x._posixsubprocess" is _posixsubprocess
            if args[0].partition(".")[0] in no_import or args[0].rpartition(".")[2] in no_import:
                raise PermissionError_(f"sandbox: import {args[0]} is not allowed")
            return
        if event.startswith(blocked):
            raise PermissionError_(f"sandbox: {event} is not allowed")
        if event in write_events:
            writes = True
            if event == "os.utime" and type_(args[0]) is int_:
                # a descriptor opened for reading suffices to set times: a file of the Python install's, here
                raise PermissionError_("sandbox: os.utime of a descriptor is not allowed")
        elif event in read_events:
            # O_CREAT and O_TRUNC write even with O_RDONLY: they would create or empty a file in the Python install
            writes = event == "open" and (type_(args[2]) is not int_ or args[2] & O_WRITES)
            args = args[:1]
        else:
            return
        for path in args:  # a path argument comes as str or bytes (os.fspath already applied); an int is a descriptor
            kind = type_(path)
            if issubclass_(kind, bytes_):
                path = bytes_.decode(path, fsencoding, "surrogateescape")
            elif issubclass_(kind, str_):
                path = str_.__str__(path)  # a plain copy: a subclass's own methods would run below
            else:
                continue
            # os.path.realpath's work with C functions only: symlinks resolved as the kernel will (a directory link
            # in the Python install may lead anywhere: /usr/lib/ssl/private, on Debian)
            todo, real, links = (path if path.startswith("/") else getcwd() + "/" + path).split("/")[::-1], "", 0
            while todo:
                part = todo.pop()
                if part == "" or part == ".":
                    continue
                if part == "..":
                    real = real.rpartition("/")[0]
                    continue
                try:
                    mode = lstat(real + "/" + part).st_mode
                except OSError_:
                    mode = 0  # not there (yet): the rest reads as written
                if (mode & 0o170000) != 0o120000:
                    real += "/" + part
                    continue
                links += 1
                target = readlink(real + "/" + part) if links <= 40 else "/"
                real = "" if target.startswith("/") else real
                todo += target.split("/")[::-1]
            real = real or "/"
            if event == "open" and not writes:
                # a directory handle only in the sandbox directory: the open event does not name the dir_fd a later
                # call's path is relative to, so this check would read that path as relative to the sandbox's
                try:
                    writes = (lstat(real).st_mode & 0o170000) == 0o040000
                except OSError_:
                    pass
            if writes and not (real == tmp or real.startswith(write_prefix)):
                raise PermissionError_(f"sandbox: {event}({path!r}) outside the sandbox directory")
            if not writes and not (real in read_roots or real.startswith(read_prefixes)):
                raise PermissionError_(f"sandbox: {event}({path!r}) outside the sandbox directory")

    with open("../program.py") as f:  # beside the sandbox directory, which may be a tmpfs of its own by now
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


def _confined_command(limits: SandboxLimits, box: str, program: str) -> list[str]:
    mem = limits.memory_mb * 1024 * 1024
    rlimits = {"RLIMIT_CPU": limits.cpu_seconds, "RLIMIT_AS": mem, "RLIMIT_FSIZE": 1024 * 1024,
               "RLIMIT_NOFILE": 64, "RLIMIT_CORE": 0}
    return confined_argv([interpreter(), "-I", "-S", "-c", _BOOTSTRAP], system_read_roots() + [program], box,
                         available_layers(), rlimits)


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


def _remove_tree(root: str) -> None:
    """Remove ``root`` and all a program left in it, however deep. shutil.rmtree (and TemporaryDirectory) recurse once
    a level, so a program that nested directories past the recursion limit raised RecursionError in the caller;
    here each pass moves the contents of root's subdirectories up into root instead."""
    hoisted = 0
    while entries := list(os.scandir(root)):
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                os.unlink(entry.path)
                continue
            os.chmod(entry.path, 0o700)  # one made with mode 0 still belongs to us
            for sub in os.scandir(entry.path):
                if sub.is_dir(follow_symlinks=False):
                    os.chmod(sub.path, 0o700)  # a directory moves to another parent only if it is writable
                while os.path.lexists(target := os.path.join(root, f".hoisted-{hoisted}")):
                    hoisted += 1
                os.rename(sub.path, target)
            os.rmdir(entry.path)
    os.rmdir(root)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal past SIGRTMIN has no name of its own
        return f"signal {number}"


def run_program(code: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Execute ``code`` in the sandbox; never raises for anything the program does."""
    # the program beside the directory it may write: that directory may become a tmpfs of its own, over it
    tmp = tempfile.mkdtemp(prefix="posttrain-sandbox-")
    try:
        box, program = os.path.join(tmp, "box"), os.path.join(tmp, "program.py")
        os.mkdir(box)
        # a lone surrogate in the text is kept, for the child to fail on, not raised here
        Path(program).write_text(code, encoding="utf-8", errors="surrogatepass")
        # a session of its own, so that a timeout kills everything it started
        with subprocess.Popen(
            _confined_command(limits, box, program), cwd=box, env={}, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        ) as proc:
            out, err, stopped = _read_capped(proc, limits)
            if stopped:
                _kill(proc)
                return SandboxResult("", False, stopped)
    finally:
        try:
            _remove_tree(tmp)
        except OSError as e:  # what the program left there is not the caller's concern: say so, and go on
            warnings.warn(f"sandbox: could not remove {tmp}: {e}", RuntimeWarning, stacklevel=2)
    if proc.returncode != 0:
        if proc.returncode < 0:
            return SandboxResult("", False, f"killed by {_signal_name(-proc.returncode)}")
        lines = err.decode("utf-8", "replace").strip().splitlines()
        return SandboxResult("", False, "error: " + (lines[-1][:200] if lines else f"exit {proc.returncode}"))
    return SandboxResult(out.decode("utf-8", "replace"), True, "ok")


def run_programs(codes: list[str], limits: SandboxLimits = SandboxLimits(), workers: int = 2) -> list[SandboxResult]:
    """Run many programs, at most ``workers`` at once, results in input order."""
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(lambda c: run_program(c, limits), codes))
