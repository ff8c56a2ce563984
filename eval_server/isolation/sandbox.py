"""Process hygiene for untrusted code: scrubbed environment, subreaper, killing a process tree.

Kept apart from worker.py so the server (which spawns workers) and the worker (which forks
evaluations) share one definition of what a candidate may see and how it is stopped.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import time
from collections.abc import Mapping

import psutil

# Only these variables reach a worker; everything else (credentials above all) is dropped.
_ALLOWED_PREFIXES = (
    "PATH",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "LANG",
    "LC_",
    "TZ",
    "CUDA_",
    "NVIDIA_",
    "TRITON_",
    "TORCH_",
    "PYTORCH_",
    "NCCL_",
    "OMP_",
    "MKL_",
    "OPENBLAS_",
    "CC",
    "CXX",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "TERM",
    "TMPDIR",
)
# Dropped even when the prefix is allowed (e.g. TORCH_HUB_TOKEN).
_SECRET_RE = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|COOKIE|SESSION)", re.IGNORECASE)


def scrubbed_env(base: Mapping[str, str], overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a worker: an allow-list of harmless variables, secrets removed, overrides applied."""
    env = {
        k: v
        for k, v in base.items()
        if any(k == p or k.startswith(p) for p in _ALLOWED_PREFIXES) and not _SECRET_RE.search(k)
    }
    env.update(overrides or {})
    return env


def become_subreaper() -> bool:
    """Orphaned descendants (a candidate's double-fork) get reparented to us, so we can reap them."""
    PR_SET_CHILD_SUBREAPER = 36
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def become_undumpable() -> bool:
    """Processes of the same user without CAP_SYS_PTRACE can no longer ptrace this process or
    read and write its memory through /proc: the judge, once it forked the candidate's runner
    (which drops every capability, `drop_privileges`)."""
    PR_SET_DUMPABLE = 4
    return _prctl(PR_SET_DUMPABLE, 0)


_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_CAP_VERSION_3 = 0x20080522


def drop_privileges() -> bool:
    """Give up every capability, and the means to get one back: the candidate's process. As root
    with CAP_SYS_PTRACE (a container run with every capability) it could otherwise ptrace its
    judge or write the judge's memory through /proc, whatever the judge's dumpable flag; without
    capabilities, the kernel refuses both for an undumpable judge, and for any judge that holds
    capabilities this process lacks. no_new_privs keeps an exec'd setuid or file-capability
    binary from bringing them back. True when the process ends with none (CapEff and CapPrm 0)."""
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)
    for cap in range(64):  # the bounding set needs CAP_SETPCAP, which goes last (capset below)
        _prctl(_PR_CAPBSET_DROP, cap)
    try:
        header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
        data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x 2 words: all empty
        ctypes.CDLL(None, use_errno=True).capset(header, data)
    except (OSError, AttributeError):
        return False
    return privileges() == {"CapEff": 0, "CapPrm": 0, "NoNewPrivs": 1}


_CLONE_NEWNS, _CLONE_NEWUSER = 0x00020000, 0x10000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_NOATIME, _MS_NODIRATIME, _MS_BIND = 32, 1024, 2048, 4096
_MS_REC, _MS_PRIVATE, _MS_RELATIME, _MS_STRICTATIME = 16384, 1 << 18, 1 << 21, 1 << 24
# a mount's options that a remount inside a user namespace must keep (the kernel locks them)
_KEPT_OPTIONS = (
    ("nosuid", _MS_NOSUID),
    ("nodev", _MS_NODEV),
    ("noexec", _MS_NOEXEC),
    ("noatime", _MS_NOATIME),
    ("nodiratime", _MS_NODIRATIME),
    ("relatime", _MS_RELATIME),
    ("strictatime", _MS_STRICTATIME),
)
# kernel and device file systems: left as they are (/dev/shm and the GPU's device nodes included)
_KERNEL_TREES = ("/proc", "/sys", "/dev")


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _mounts() -> list[tuple[str, str]]:
    """(mount point, per-mount options) of this process's mount namespace, in mount order."""
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        fields = [line.split() for line in fh]
    unescape = re.compile(r"\\([0-7]{3})")
    return [(unescape.sub(lambda m: chr(int(m.group(1), 8)), f[4]), f[5]) for f in fields if len(f) > 5]


def confine_writes(writable: list[str]) -> list[str]:
    """Make every file system read-only for this process and its children but the paths in
    `writable` (and /proc, /sys, /dev): the candidate's process, which could otherwise rewrite
    the evaluator's own source, the site-packages a later process loads, or the reference cache
    (native code reaches what no audit hook sees). A user namespace of its own (mapped to the
    same user) owns a mount namespace of its own: nothing outside this process changes. Call
    single-threaded (the kernel refuses a multithreaded process a user namespace), before
    `drop_privileges`. Returns the mount points that stayed writable against the request (empty:
    all as asked); raises OSError when the kernel refuses the namespaces."""
    libc = ctypes.CDLL(None, use_errno=True)

    def call(result: int, what: str) -> None:
        if result != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    uid, gid = os.geteuid(), os.getegid()
    call(libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS), "unshare(CLONE_NEWUSER | CLONE_NEWNS)")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w", encoding="ascii") as fh:
            fh.write(text)
    call(libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None), "mount --make-rprivate /")
    kept = [os.path.realpath(p) for p in writable if os.path.exists(p)]
    for path in kept:  # each its own mount, which the remounts below leave writable
        raw = path.encode()
        call(libc.mount(raw, raw, None, _MS_BIND | _MS_REC, None), f"mount --bind {path}")
    left = []
    for point, options in _mounts():
        if _under(point, kept) or _under(point, list(_KERNEL_TREES)) or "ro" in options.split(","):
            continue
        flags = _MS_BIND | _MS_REMOUNT | _MS_RDONLY
        present = options.split(",")
        for option, flag in _KEPT_OPTIONS:
            if option in present:
                flags |= flag
        if libc.mount(None, point.encode(), None, flags, None) != 0:
            left.append(point)
    with contextlib.suppress(OSError):  # the working directory was looked up before the binds
        os.chdir(os.getcwd())
    return left


def confinement_refused(writable: list[str]) -> str:
    """Why a process cannot be confined as `confine_writes(writable)` would (empty: it can),
    tried in a forked child so the caller stays as it is: a kernel or container that refuses
    user namespaces (Docker's default seccomp profile does) answers here, once, at start."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's lines run in another process
        os.close(r)
        try:
            left = confine_writes(writable)
            answer = f"mounts left writable: {left}" if left else ""
        except OSError as exc:
            answer = str(exc)
        os.write(w, answer.encode()[:4000])
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        answer = fh.read().decode()
    os.waitpid(pid, 0)
    return answer


def privileges(pid: int | str = "self") -> dict[str, int]:
    """A process's effective and permitted capability sets and its no_new_privs flag, as the
    kernel reports them in /proc (empty when it cannot be read)."""
    fields = {"CapEff": 16, "CapPrm": 16, "NoNewPrivs": 10}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            lines = [line.split(":", 1) for line in fh if ":" in line]
    except OSError:
        return {}
    return {k.strip(): int(v.strip(), fields[k.strip()]) for k, v in lines if k.strip() in fields}


def kill_tree(pid: int) -> None:
    """SIGKILL a process group led by `pid` and every descendant still visible."""
    # List descendants before killing anything: once `pid` dies its children are reparented
    # (to init or a subreaper), and one that left the group (setsid) would no longer be found.
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        children = []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.kill()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def reap_group(pgid: int, grace_s: float) -> bool:
    """Reap every child of this process in process group `pgid` (a killed evaluation's: its
    runner is reparented here when the judge exits first), waiting at most `grace_s` for the
    killed ones to finish dying; True when none is left. Without the wait, a runner still dying
    when the evaluation's answer went out stayed a zombie until the next evaluation."""
    deadline = time.monotonic() + grace_s
    while True:
        try:
            pid, _ = os.waitpid(-pgid, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)


def kill_strays(keep: int | None = None) -> list[int]:
    """Kill every child of this process but `keep` (the worker's prepared pair), with its tree, and
    reap it: after an evaluation the worker has no other child, unless one of the candidate's
    processes escaped its group (setsid) and outlived its parent, so the subreaper inherited it
    (a double fork). Left alone, it would run beside every later evaluation, e.g. loading the GPU
    while references are timed. Returns the pids killed."""
    try:
        children = [c.pid for c in psutil.Process().children()]
    except psutil.Error:
        return []
    killed = [pid for pid in children if pid != keep]
    for pid in killed:  # reaped once dead, here or by a later reap_all: never waited for
        kill_tree(pid)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    return killed


def reap_all(keep: int | None = None) -> None:
    """Collect every exited child (including reparented orphans) so no zombie remains; stop at
    `keep`, a child whose exit status its owner reads later."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == keep:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(info.si_pid, 0)


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and its descendants (0 if it is gone)."""
    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total
