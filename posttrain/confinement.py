"""Kernel-enforced confinement for the sandbox's child, applied by a launcher to itself before it execs the program.

The sandbox's audit hook lives in the same interpreter as the program it watches, so a program that finds a way
around it (Python's docs say plainly that audit hooks are no sandbox) would have the host. These layers are the
kernel's, inherited across exec and irrevocable, so they hold whatever the program does inside Python:

- a new user and network namespace: no network at all (not even loopback), and no capability in the host's
  namespaces, so even a sandbox started by root is held by the process limit below and cannot open raw sockets;
- a seccomp filter: the program cannot fork (threads it may start die with it), so nothing escapes the wall-clock
  kill and no fork bomb reaches the host; nor change a file's mode, owner, times, extended attributes or inode
  flags, which Landlock does not cover: its owner (root, for a pipeline run as root) may do that to any file it can
  name; nor open a socket (a UNIX socket's path reaches the host from any namespace), trace a process, or signal
  one other than itself (by pid or pidfd: Landlock's signal scope needs Linux 6.12);
- Landlock (Linux >= 5.13): files may be read only under the given read roots, written, created or removed only
  under the sandbox directory; from ABI 4 no TCP bind or connect, from ABI 6 no signal to a process outside the
  sandbox and no abstract UNIX socket;
- a tmpfs of its own over the sandbox directory, in a private mount namespace: RLIMIT_FSIZE caps each file, but a
  program that writes file after file filled the host's disk (2 GB in 2 CPU seconds; RAM, where /tmp is a
  tmpfs) and could leave a tree too deep for the caller to remove; this caps what it writes in all, and it
  all vanishes with the process.

Each layer is applied where the kernel offers it (``available_layers``); where none is, the audit hook and the
resource limits remain. No maintained Python binding covers Landlock's network and scope rules (the ``landlock``
package handles files only), so the three syscalls are called through ctypes here; the seccomp filter is a short
BPF program, written out here rather than taking libseccomp on as a system dependency.

The layers are applied by a launcher (``confined_argv``): a fresh interpreter, which confines itself and then execs
the program. Applied between fork and exec in a child of the caller (``preexec_fn``), they ran Python code in a copy
of a process with threads (torch's, the sandbox's pool), which Python's docs warn may deadlock; and that fork copied
the caller's page tables, so a caller holding 4 GiB started programs ten times slower. Without ``preexec_fn``,
``subprocess`` starts the launcher with vfork, at a cost that does not grow with the caller.

Example:
    >>> sorted(available_layers())                                  # doctest: +SKIP
    ['landlock', 'namespaces', 'seccomp', 'tmpfs']
    >>> subprocess.run(confined_argv([interpreter(), "-I", "-S", "-c", "print(6 * 7)"], system_read_roots(), box,
    ...                              available_layers()), cwd=box, env={}, start_new_session=True)  # doctest: +SKIP
"""
from __future__ import annotations

# the launcher runs this file for every program it starts: only modules quick to import here (dataclasses, json,
# subprocess and tempfile took 20 ms of each start); the parent's probe imports what it needs itself
import collections
import ctypes
import errno
import functools
import os
import resource
import struct
import sys

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same numbers on every architecture
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
_CLONE_NEWUSER, _CLONE_NEWNET, _CLONE_NEWNS = 0x10000000, 0x40000000, 0x00020000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
TMPFS_OPTIONS = b"size=16m,nr_inodes=1024,mode=0700"  # all the sandbox directory holds, in bytes and files
# the ids the child has in its namespace: a tmpfs creates no file for an id unmapped there, and not 0, so that exec
# drops the capabilities the namespace's creator holds in it
_INSIDE_ID = 65534

# filesystem access rights by the ABI that introduced them
_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_ABI1 = (1 << 13) - 1  # execute .. make_sym
_FS_BY_ABI = {1: _FS_ABI1, 2: _FS_ABI1 | 1 << 13, 3: _FS_ABI1 | 3 << 13, 4: _FS_ABI1 | 3 << 13}
_FS_ALL_FROM_5 = _FS_ABI1 | 7 << 13  # + refer, truncate, ioctl_dev
_FILE_RIGHTS = _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | 1 << 14 | 1 << 15  # the rights a rule on a file may hold
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1

# seccomp, by machine (numbers from 424 on are the same on every architecture)
# arch: the audit arch seccomp_data carries; refused: outright; signalling: kill, tkill, tgkill, rt_sigqueueinfo,
# rt_tgsigqueueinfo, allowed towards itself only
_Syscalls = collections.namedtuple("_Syscalls", "arch clone clone3 refused signalling ioctl")


# refused outright on every machine: the metadata setters numbered alike everywhere (fchmodat2, setxattrat,
# removexattrat, file_setattr), pidfd_send_signal, pidfd_open, pidfd_getfd (a signal by pidfd, which neither the
# audit hook nor a Landlock without its signal scope, before Linux 6.12, sees), and io_uring, whose requests
# (connect, openat) no seccomp filter reads
_REFUSED_EVERYWHERE = (452, 463, 466, 469, 424, 434, 438, 425, 426, 427)
_SECCOMP = {
    # fork, vfork; chmod, chown, utime and the xattr setters in every form; socket, connect, socketpair (a pathname
    # UNIX socket of the host, Docker's or Ray's, is reachable from any network namespace and Landlock does not
    # check connect); ptrace, process_vm_readv, process_vm_writev
    "x86_64": _Syscalls(0xC000003E, 56, 435, (57, 58, 90, 91, 92, 93, 94, 132, 188, 189, 190, 197, 198, 199, 235,
                                              260, 261, 268, 280, 41, 42, 53, 101, 310, 311) + _REFUSED_EVERYWHERE,
                        (62, 200, 234, 129, 297), 16),
    "aarch64": _Syscalls(0xC00000B7, 220, 435, (5, 6, 7, 14, 15, 16, 52, 53, 54, 55, 88, 198, 199, 203, 117, 270,
                                                271) + _REFUSED_EVERYWHERE,
                         (129, 130, 131, 138, 240), 29),
}
# ioctls that change an inode's flags (append-only, immutable, noatime, ...), its project or its generation: the
# sandbox's owner (root, for a pipeline run as root) owns every file it can open, and Landlock's ioctl right covers
# devices only. FS_IOC_SETFLAGS and FS_IOC_SETVERSION in their 64- and 32-bit forms, FS_IOC_FSSETXATTR.
_INODE_IOCTLS = (0x40086602, 0x40046602, 0x40087602, 0x40047602, 0x401C5820)
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_LD_ABS_W, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_CLONE_THREAD = 0x00010000


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where Landlock is absent or disabled."""
    if sys.platform != "linux":  # syscall numbers are Linux's; elsewhere 444 is another call
        return 0
    abi = _libc.syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(0, int(abi))


def _checked(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _landlock(read_roots: list[str], write_root: str, abi: int) -> None:
    """Confine this process (and what it execs) to reading ``read_roots`` and writing ``write_root``."""
    fs = _FS_BY_ABI.get(abi, _FS_ALL_FROM_5)
    attr = _RulesetAttr(fs, _NET_BIND_TCP | _NET_CONNECT_TCP if abi >= 4 else 0,
                        _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL if abi >= 6 else 0)
    size = ctypes.sizeof(ctypes.c_uint64) * (1 if abi < 4 else 2 if abi < 6 else 3)
    ruleset = _checked(_libc.syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size),
                                     ctypes.c_uint32(0)), "landlock_create_ruleset")
    try:
        read = _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR
        for path, access in [(p, read) for p in read_roots] + [(write_root, fs)]:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                if not os.path.isdir(path):
                    access &= _FILE_RIGHTS
                rule = _PathBeneathAttr(access & fs, fd)
                _checked(_libc.syscall(_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), ctypes.c_uint32(0)),
                         f"landlock_add_rule({path})")
            finally:
                os.close(fd)
        _checked(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
        _checked(_libc.syscall(_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)), "landlock_restrict_self")
    finally:
        os.close(ruleset)


def _no_new_processes() -> None:
    """A seccomp filter that refuses fork, vfork and a clone that is not a thread's (RLIMIT_NPROC cannot: the kernel
    exempts uid 0 from it in every namespace), any change to a file's metadata or inode flags, sockets, tracing
    another process, and a signal to any process but the program's own. clone3 reports ENOSYS, so the C library
    falls back to clone, whose flags a filter can read (clone3's sit behind a pointer). A call from another ABI (a
    64-bit process can still make 32-bit or x32 calls with other numbers) is refused outright."""
    calls = _SECCOMP[os.uname().machine]
    own_pid = os.getpid()  # the child's, kept across exec; a pid of 0 is its own process group (it called setsid)
    deny, allow = _RET_ERRNO | errno.EPERM, _RET_ALLOW
    code = [(_LD_ABS_W, 0, 0, 4), (_JEQ, 1, 0, calls.arch), (_RET, 0, 0, deny),  # seccomp_data.arch
            (_LD_ABS_W, 0, 0, 0), (_JGE, 0, 1, 0x40000000), (_RET, 0, 0, deny)]  # .nr; x32 calls have this bit
    for nr in calls.refused:
        code += [(_JEQ, 0, 1, nr), (_RET, 0, 0, deny)]
    for nr in calls.signalling:  # the target pid is args[0]'s low word (pid_t is 32 bits; little-endian machines)
        code += [(_JEQ, 0, 5, nr), (_LD_ABS_W, 0, 0, 16), (_JEQ, 2, 0, 0), (_JEQ, 1, 0, own_pid),
                 (_RET, 0, 0, deny), (_RET, 0, 0, allow)]
    n = len(_INODE_IOCTLS)  # the request is args[1]'s low word
    code += [(_JEQ, 0, n + 3, calls.ioctl), (_LD_ABS_W, 0, 0, 24)]
    code += [(_JEQ, n - i, 0, request) for i, request in enumerate(_INODE_IOCTLS)]
    code += [(_RET, 0, 0, allow), (_RET, 0, 0, deny)]
    code += [(_JEQ, 0, 1, calls.clone3), (_RET, 0, 0, _RET_ERRNO | errno.ENOSYS),
             (_JEQ, 1, 0, calls.clone), (_RET, 0, 0, allow),
             (_LD_ABS_W, 0, 0, 16), (_JSET, 0, 1, _CLONE_THREAD), (_RET, 0, 0, allow), (_RET, 0, 0, deny)]  # .args[0]
    filters = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *ins) for ins in code))

    class _Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = _Prog(len(code), ctypes.addressof(filters))
    _checked(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    _checked(_libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0), "prctl(PR_SET_SECCOMP)")


def _own_tmpfs(write_root: str, uid: int, gid: int) -> None:
    """Mount a size-capped tmpfs over ``write_root`` (in the mount namespace just unshared) and enter it."""
    maps = (("setgroups", "deny"), ("uid_map", f"{_INSIDE_ID} {uid} 1"), ("gid_map", f"{_INSIDE_ID} {gid} 1"))
    for name, text in maps:
        fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    _checked(_libc.mount(b"tmpfs", os.fsencode(write_root), b"tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
                         TMPFS_OPTIONS), "mount tmpfs")
    os.chdir(write_root)  # the working directory was set before the mount, on the directory now beneath it


def confine(read_roots: list[str], write_root: str, layers: frozenset[str]) -> None:
    """Apply ``layers`` to the calling process, irrevocably; ``confined_argv``'s launcher calls it before exec."""
    uid, gid = os.getuid(), os.getgid()  # read before unsharing: unmapped, they read 65534 after
    flags = ((_CLONE_NEWUSER | _CLONE_NEWNET) * ("namespaces" in layers)
             | (_CLONE_NEWUSER | _CLONE_NEWNS) * ("tmpfs" in layers))
    if flags:
        _checked(_libc.unshare(flags), "unshare")
    if "tmpfs" in layers:
        _own_tmpfs(write_root, uid, gid)
    if "landlock" in layers:
        _landlock(read_roots, write_root, landlock_abi())
    if "seccomp" in layers:
        _no_new_processes()


@functools.cache
def available_layers() -> frozenset[str]:
    """The layers this kernel applies, probed once per process: each confines a child that starts Python and writes a
    file in its directory."""
    if sys.platform != "linux":
        return frozenset()
    import subprocess  # here, not at the top: see the imports
    import tempfile

    layers, read_roots = set(), system_read_roots()
    candidates = (["namespaces", "tmpfs"] + ["landlock"] * (landlock_abi() >= 1)
                  + ["seccomp"] * (os.uname().machine in _SECCOMP))
    for layer in candidates:
        with tempfile.TemporaryDirectory(prefix="posttrain-probe-") as box:
            try:
                subprocess.run(confined_argv([interpreter(), "-I", "-S", "-c", "open('probe', 'w').close()"],
                                             read_roots, box, frozenset([layer])),
                               check=True, capture_output=True, timeout=60, cwd=box, env={})
                layers.add(layer)
            except (subprocess.SubprocessError, OSError):
                pass
    return frozenset(layers)


def interpreter() -> str:
    """The interpreter's own file, not a virtualenv's link to it: started with -I -S it needs no virtualenv, and
    Landlock then has nothing to allow there."""
    return os.path.realpath(sys.executable)


def system_read_roots() -> list[str]:
    """What an interpreter needs to read to start: its own install and the shared libraries it links."""
    exe_home = os.path.dirname(os.path.dirname(interpreter()))
    roots = {sys.base_prefix, sys.base_exec_prefix, exe_home, "/lib", "/lib64", "/usr/lib", "/usr/lib64",
             "/usr/local/lib", "/etc/ld.so.cache"}
    return sorted(r for r in roots if r and os.path.exists(r))


def confined_argv(argv: list[str], read_roots: list[str], write_root: str, layers: frozenset[str],
                  rlimits: dict[str, int] | None = None) -> list[str]:
    """The command that runs ``argv`` under ``layers`` and then the resource ``rlimits`` (name -> soft and hard
    limit, as ``{"RLIMIT_CPU": 2}``): a launcher that applies them to itself and execs ``argv[0]``. If it cannot, it
    exits 1 with the reason as its last line of stderr, and ``argv`` never runs. Start it with ``start_new_session``
    for a process group of its own: the launcher keeps its pid across exec."""
    limits = ",".join(f"{name}={limit}" for name, limit in (rlimits or {}).items())
    # -I -S: this file imports the standard library only, and nothing from the caller's environment or site
    return [interpreter(), "-I", "-S", os.path.abspath(__file__), write_root, ",".join(sorted(layers)), limits,
            str(len(read_roots)), *read_roots, *argv]


def _launch(args: list[str]) -> None:
    """``confined_argv``'s launcher: its arguments as that function lays them out."""
    write_root, layers, limits, n_roots = args[:4]
    read_roots, argv = args[4:4 + int(n_roots)], args[4 + int(n_roots):]
    # confined before it is limited: confinement opens files and maps memory that the limits may not leave room for
    confine(read_roots, write_root, frozenset(filter(None, layers.split(","))))
    for name, limit in (item.split("=") for item in filter(None, limits.split(","))):
        resource.setrlimit(getattr(resource, name), (int(limit), int(limit)))
    os.execv(argv[0], argv)


if __name__ == "__main__":
    try:
        _launch(sys.argv[1:])
    except Exception as e:  # exec failed or a layer could not be applied: the reason, as the program's error line
        sys.exit(f"confinement: {type(e).__name__}: {e}")
