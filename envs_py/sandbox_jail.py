"""The kernel layers of a sandbox: namespaces, an empty read-only root, dropped ids and capabilities, rlimits and a
seccomp allowlist (issue #49). Standard library plus ``pyseccomp`` (ctypes over Debian's libseccomp2); it runs in
the sandbox process (``sandbox_child.py``) before any cell, never in the host.

``isolate`` is called by the process the host started or the zygote forked ("the keeper"). It unshares PID,
network, mount, IPC and UTS namespaces (and a user namespace when not root, which is what lets an ordinary user do
this), then forks the sandbox proper: pid 1 of its own PID namespace, so no other process is visible, and none can
be signalled, traced or re-scheduled by a cell. The keeper only waits for it, and dies with its own parent (the
zygote or the host); the sandbox dies with the keeper (parent-death signal) and, being its namespace's init, takes
the namespace down with it. The host is told the sandbox's pid with a ``jail`` frame, so it can stop it between
cells and kill it.

The allowlist admits only what a running cell needs (memory, reading and writing its two pipes, timers, clocks,
signals to itself); ``fcntl`` only reads flags or sets flags without O_ASYNC, so a cell cannot name a signal target
(F_SETOWN/F_SETSIG). Everything else fails with EPERM. Architectures other than the native one are killed.
"""

import ctypes
import os
import platform
import resource
import signal
import sys

NOBODY = 65534
NAMESPACES = {"user": 0x10000000, "pid": 0x20000000, "net": 0x40000000, "mount": 0x00020000, "ipc": 0x08000000,
              "uts": 0x04000000}
PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 0x4000, 1 << 18
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}  # syscall numbers; elsewhere chroot
# Syscalls a running cell may make (with the argument filters in build_filter). Names libseccomp does not know on
# this machine are skipped.
ALLOWED = ("read", "write", "readv", "writev", "close", "lseek", "fstat", "newfstatat", "select", "pselect6", "poll",
           "ppoll", "epoll_wait", "epoll_pwait", "epoll_pwait2", "epoll_ctl", "mmap", "munmap", "mremap", "mprotect",
           "brk", "madvise", "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "sigaltstack",
           "setitimer", "getitimer", "alarm", "clock_gettime", "clock_getres", "gettimeofday", "time", "nanosleep",
           "clock_nanosleep", "getpid", "gettid", "getppid", "getuid", "geteuid", "getgid", "getegid", "getresuid",
           "getresgid", "getgroups", "getrandom", "futex", "sched_yield", "getrusage", "times", "exit", "exit_group",
           "restart_syscall", "getcwd", "uname")


class Refused(Exception):
    """The kernel refused a layer (the message names which)."""


_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise Refused(f"{what} failed: {os.strerror(err)} (errno {err})")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _die_with_parent(watch_fd: int | None = None, parent: int | None = None) -> None:
    """Arms the parent-death signal, then exits at once if the parent is already gone (the parent pid changed, or
    ``watch_fd`` ends without the byte the keeper writes once it has named this process to the host), which the
    signal would have missed."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if parent is not None and os.getppid() != parent:
        os._exit(0)
    if watch_fd is not None and os.read(watch_fd, 1) != b"k":
        os._exit(0)


def _empty_root() -> str:
    """Makes this mount namespace's root an empty read-only tmpfs (the old root detached); returns how."""
    _check(_libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "making / private")
    base = next((p for p in ("/tmp", "/mnt", "/dev") if os.path.isdir(p)), None)
    if base is None:
        raise Refused("no directory to mount the empty root on")
    _check(_libc.mount(b"tmpfs", base.encode(), b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                       b"size=4k,mode=0555"), "mounting the empty root")
    os.chdir(base)
    nr = PIVOT_ROOT.get(platform.machine())
    if nr is not None:
        _check(_libc.syscall(nr, b".", b"."), "pivot_root")
        _check(_libc.umount2(b".", 2), "detaching the old root")  # MNT_DETACH
        how = "empty read-only tmpfs (pivot_root, old root detached)"
    else:
        _check(_libc.chroot(b"."), "chroot")
        how = "empty read-only tmpfs (chroot)"
    os.chdir("/")
    return how


def _drop_capabilities() -> None:
    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    _check(_libc.capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)()), "dropping capabilities")


def isolate(parent: int, announce) -> dict:
    """Puts the rest of this process's life in fresh namespaces. The calling process becomes the keeper: it calls
    ``announce(pid)`` with the sandbox's pid, waits for it and exits with it, never returning. Returns, in the
    sandbox (pid 1 of its namespace, its own session, an empty root, uid 65534, no capabilities), the layers
    entered. Raises :class:`Refused` (in the caller, before any fork) when the kernel refuses the namespaces."""
    root = os.getuid() == 0
    host_uid, host_gid = os.geteuid(), os.getegid()
    # Root needs no user namespace (so it keeps working where unprivileged user namespaces are off); an ordinary
    # user gets its capabilities over the other namespaces from one.
    names = [n for n in NAMESPACES if n != "user" or not root]
    _check(_libc.unshare(sum(NAMESPACES[n] for n in names)), "unshare(" + ", ".join(names) + ")")
    if not root:  # the one id this user may map: its own, seen inside as 65534
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{NOBODY} {host_uid} 1")
        _write("/proc/self/gid_map", f"{NOBODY} {host_gid} 1")
    _die_with_parent(parent=parent)
    watch_r, watch_w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(watch_r)
        announce(pid)
        os.write(watch_w, b"k")  # named: the sandbox may go on (its ready frame comes after this jail frame)
        os.close(0)  # the sandbox alone holds the host's pipes: their end is its end
        os.close(1)
        while True:
            try:
                os.waitpid(pid, 0)
                break
            except InterruptedError:
                continue
            except ChildProcessError:
                break
        os._exit(0)
    os.close(watch_w)
    os.setsid()
    how_root = _empty_root()
    if root:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)  # leaves no capability
    else:
        _drop_capabilities()
    _die_with_parent(watch_fd=watch_r)  # after setuid, which clears it
    os.close(watch_r)
    return {"namespaces": names, "uid": os.getuid(), "host_uid": NOBODY if root else host_uid, "root": how_root,
            "capabilities": "none"}


def drop_uid_only(parent: int) -> dict:
    """The opted-out path (no namespaces): uid 65534 when root, parent-death signal. Returns the layers entered."""
    if os.getuid() == 0:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    _die_with_parent(parent=parent)
    return {"namespaces": [], "uid": os.getuid(), "host_uid": os.getuid(), "root": "shared with the host",
            "capabilities": "none" if os.getuid() != 0 else "root's"}


def set_rlimits(config: dict, open_fds: list[int]) -> dict:
    """Applies the sandbox's rlimits; returns them."""
    limits = {"NPROC": 0, "FSIZE": 0, "CORE": 0, "MEMLOCK": 0, "MSGQUEUE": 0, "NOFILE": max(open_fds) + 1,
              "CPU": config["life_cpu"], "AS": config["memory"]}
    for name, value in limits.items():
        resource.setrlimit(getattr(resource, "RLIMIT_" + name), (value, value))
    return limits


def import_seccomp(lib: str):
    """Returns the pyseccomp module from directory ``lib`` (None where it or libseccomp is missing: the layer
    report says so, and the host refuses to run cells)."""
    if not lib:
        return None
    sys.path.insert(0, lib)
    try:
        import pyseccomp
        return pyseccomp
    except Exception:  # noqa: BLE001  (pyseccomp raises whatever ctypes does when libseccomp is absent)
        return None
    finally:
        sys.path.remove(lib)


def build_filter(seccomp):
    """Returns the allowlist as a ``pyseccomp.SyscallFilter`` (not loaded), or None without pyseccomp."""
    if seccomp is None:
        return None
    f = seccomp.SyscallFilter(seccomp.ERRNO(1))  # EPERM for everything not allowed
    for name in ALLOWED:
        try:
            f.add_rule(seccomp.ALLOW, name)
        except (OSError, RuntimeError, ValueError):  # unknown to this libseccomp/architecture
            pass
    A, EQ, MASKED = seccomp.Arg, seccomp.EQ, seccomp.MASKED_EQ
    for cmd in (1, 2, 3):  # F_GETFD, F_SETFD, F_GETFL
        f.add_rule(seccomp.ALLOW, "fcntl", A(1, EQ, cmd))
    f.add_rule(seccomp.ALLOW, "fcntl", A(1, EQ, 4), A(2, MASKED, 0o20000, 0))  # F_SETFL without O_ASYNC
    f.add_rule(seccomp.ALLOW, "ioctl", A(1, EQ, 0x5401))  # TCGETS (isatty)
    f.add_rule(seccomp.ALLOW, "sched_getaffinity", A(0, EQ, 0))  # its own only
    f.add_rule(seccomp.ALLOW, "prlimit64", A(0, EQ, 0), A(2, EQ, 0))  # read its own limits, set none
    return f


def load_filter(seccomp, f) -> None:
    """Loads the allowlist into this process (irrevocably; it also sets no-new-privileges)."""
    # abort() signals itself: its own pid only (1 in its namespace), known only now, in the sandbox
    f.add_rule(seccomp.ALLOW, "tgkill", seccomp.Arg(0, seccomp.EQ, os.getpid()))
    f.load()


def dumpable(flag: bool) -> None:
    """Sets whether this process may be traced or have its /proc read by its uid (off in the sandbox)."""
    _libc.prctl(PR_SET_DUMPABLE, int(flag), 0, 0, 0)
