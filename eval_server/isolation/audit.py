"""The evaluation child's audit hook (PEP 578): candidate code cannot trace, profile or walk
the interpreter, reach native memory, start processes or forge code locations, however it
reaches the function that would do it.

`install(evaldir)` runs in the forked child before the candidate is imported. CPython keeps the
hook in the interpreter's state: no Python code can list or remove it. For every watched event
the hook looks at the Python stack and finds the frame that *decided* the call: the innermost
frame that is neither the standard library nor generated code (`<string>`, `<frozen ...>`), which
only ever act on behalf of their caller (so `inspect.currentframe()`, `threading.settrace`,
`dataclasses`-built functions and `functools.partial` launder nothing). When that frame is the
candidate's (a file in the evaluation directory other than the reference), or when no frame
decides (a thread whose target is a builtin), the event is refused: the hook writes one line
naming the event to the evaluation's output log and ends the process with `AUDIT_EXIT`. The
worker reports that exit as `rejected` (check `runtime.audit`). Ending the process is the
guarantee: an exception could be caught, a flag could be reset, an exit cannot be undone.

Calls made by torch, Triton or the evaluator itself are never refused (Triton's JIT compiles,
opens its cache and starts ptxas from inside a candidate's launch). Refused when the candidate
decides (docs/EVAL_SERVER.md, "Threat model", says what this does not cover):

- interpreter hooks: `sys.settrace`, `sys.setprofile` and their all-threads forms,
  `sys.monitoring.register_callback` (3.12);
- the evaluator's frames and objects: `sys._getframe` when called directly or through a module
  that hands frames out (inspect, traceback, logging, bdb, pdb), `sys._current_frames`,
  `sys._current_exceptions`, traceback / generator / coroutine frame attributes, the garbage
  collector's object queries;
- native code and memory: every `ctypes` event;
- processes and signals: `os.system`, `subprocess.Popen`, `os.exec*`, `os.spawn*`,
  `os.posix_spawn`, `os.fork`, `os.forkpty`, `os.kill`, `os.killpg`, `signal.pthread_kill`;
- code with a forged location: `exec` / `compile` called directly by the candidate, any code
  object compiled or built (`code.__new__`) under an absolute path outside the evaluation
  directory, and unmarshalling (`marshal.loads`, also through importlib's internals) other than
  an import reading a module's cached bytecode;
- files: opened directly by the candidate outside the evaluation directory, or opened for writing
  outside it (also through the standard library), anything under /proc, and files changed,
  moved or linked outside it.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

# The exit status of a process ended by a refused event (the worker turns it into `rejected`).
AUDIT_EXIT = 87
# The line the hook writes before exiting; the worker reads the reason after it.
REFUSAL_PREFIX = "EVALUATOR AUDIT REFUSED: "
CHECK_ID = "runtime.audit"

_STDLIB = tuple({os.path.abspath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "platstdlib")})
_SITE = ("site-packages", "dist-packages")

# Modules of the standard library that return frames to their caller.
_FRAME_HANDERS = ("inspect", "traceback", "logging", "bdb", "pdb")

_HOOK_EVENTS = frozenset(
    {
        "sys.settrace",
        "sys.setprofile",
        "sys._settraceallthreads",
        "sys._setprofileallthreads",
        "sys.monitoring.register_callback",
    }
)
_INTROSPECTION_EVENTS = frozenset(
    {
        "sys._current_frames",
        "sys._current_exceptions",
        "gc.get_objects",
        "gc.get_referrers",
        "gc.get_referents",
    }
)
# The frame getters CPython audits (as object.__getattr__); a frame's own f_back / f_locals are not.
_FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
_PROCESS_EVENTS = frozenset(
    {
        "os.system",
        "subprocess.Popen",
        "os.exec",
        "os.spawn",
        "os.posix_spawn",
        "os.fork",
        "os.forkpty",
        "os.kill",
        "os.killpg",
        "signal.pthread_kill",
        "pty.spawn",
    }
)
_FILE_CHANGE_EVENTS = frozenset(
    {
        "os.rename",
        "os.remove",
        "os.rmdir",
        "os.mkdir",
        "os.chmod",
        "os.chown",
        "os.link",
        "os.symlink",
        "os.truncate",
        "os.utime",
        "shutil.rmtree",
        "shutil.move",
        "shutil.copyfile",
        "shutil.copytree",
    }
)
# The import system's entry points (importlib's frozen bootstrap, importlib.import_module): an
# import reads a module's cached bytecode with marshal on the importer's behalf.
_IMPORT_ENTRIES = frozenset({"_find_and_load", "_gcd_import", "_handle_fromlist", "import_module"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


def is_stdlib(filename: str) -> bool:
    """Whether `filename` is a file of the standard library (installed packages below it are not)."""
    path = os.path.abspath(filename)
    return path.startswith(_STDLIB) and not any(part in _SITE for part in path.split(os.sep))


def _transparent(filename: str) -> bool:
    """Frames that act on behalf of their caller: the standard library and generated code."""
    if not filename.startswith(os.sep):
        return True  # <string>, <frozen importlib._bootstrap>, <stdin>, ...
    return is_stdlib(filename)


def _is_file_content(source: Any, filename: str) -> bool:
    """Whether `source` is what the file `filename` holds: code compiled under a library's path
    is that library's only when it is the file's own text."""
    try:
        with open(filename, "rb") as fh:  # the hook's own open: not audited again (re-entry)
            data = fh.read()
    except OSError:
        return False
    if isinstance(source, str):
        source = source.encode()
    return isinstance(source, bytes | bytearray) and bytes(source) == data


def _module_of(filename: str) -> str:
    return os.path.splitext(os.path.basename(filename))[0]


class _Auditor:
    """The hook's state, reachable only through the hook itself (which no Python code can get)."""

    def __init__(self, evaldir: Path, exit_fn: Callable[[int], Any]) -> None:
        self.evaldir = os.path.abspath(evaldir) + os.sep
        self.reference = os.path.join(self.evaldir, "reference.py")
        self.exit = exit_fn
        self.busy = threading.local()

    # ------------------------------------------------------------------ attribution
    def _candidate(self, filename: str) -> bool:
        if not filename.startswith(os.sep):  # generated code: never the candidate's own file
            return False
        path = os.path.abspath(filename)
        return path.startswith(self.evaldir) and path != self.reference

    def _inside(self, path: Any) -> bool:
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, str):
            return False
        return os.path.abspath(path).startswith(self.evaldir)

    def _decider(self, frame: FrameType | None) -> tuple[FrameType | None, FrameType | None]:
        """(the innermost frame, the first frame that is not transparent, or None)."""
        direct = frame
        while frame is not None and _transparent(frame.f_code.co_filename):
            frame = frame.f_back
        return direct, frame

    @staticmethod
    def _called_by_decider(frame: FrameType | None, decider: FrameType | None) -> FrameType | None:
        """The transparent frame the decider called (None when the decider is the innermost frame)."""
        called = None
        while frame is not None and frame is not decider:
            called, frame = frame, frame.f_back
        return called

    # ------------------------------------------------------------------ the rules
    def refusal(self, event: str, args: tuple[Any, ...], frame: FrameType | None) -> str | None:
        """Why `event` is refused with this stack, or None when it is allowed."""
        watched = (
            event in _HOOK_EVENTS
            or event in _INTROSPECTION_EVENTS
            or event in _PROCESS_EVENTS
            or event in _FILE_CHANGE_EVENTS
            or event.startswith("ctypes.")
            or event in ("sys._getframe", "object.__getattr__", "exec", "compile", "code.__new__", "open")
            or event in ("marshal.loads", "marshal.load")
        )
        if not watched:
            return None
        if event == "object.__getattr__" and (len(args) < 2 or args[1] not in _FRAME_ATTRIBUTES):
            return None
        direct, decider = self._decider(frame)
        by_candidate = decider is None or self._candidate(decider.f_code.co_filename)
        direct_candidate = direct is not None and self._candidate(direct.f_code.co_filename)
        if event == "sys._getframe":
            handed_out = direct is not None and _module_of(direct.f_code.co_filename) in _FRAME_HANDERS
            return "frame access" if (direct_candidate or handed_out) and by_candidate else None
        if event in ("exec", "compile"):
            if direct_candidate:
                return "dynamic code"
            if event == "compile" and by_candidate and len(args) > 1 and self._forged_location(args[1]):
                if _is_file_content(args[0], args[1]):
                    return None  # the import system compiling a module's own file (a first import)
                return f"code compiled under {args[1]!r}"
            return None
        if event in ("marshal.loads", "marshal.load"):
            # Code unmarshalled with any file name (a library's, to look transparent): allowed only
            # as the import system's own reading of a module's bytecode, entered by an import.
            called = self._called_by_decider(direct, decider)
            entry = called is not None and called.f_code.co_name in _IMPORT_ENTRIES
            return "code from marshalled data" if by_candidate and not entry else None
        if event == "code.__new__":
            name = args[1] if len(args) > 1 else None
            return f"code built under {name!r}" if by_candidate and self._forged_location(name) else None
        if event == "open":
            return self._open_refusal(args, direct_candidate, by_candidate)
        if event in _FILE_CHANGE_EVENTS:
            paths = [a for a in args if isinstance(a, str | bytes)]
            outside = [p for p in paths if not self._inside(p)]
            return f"changes {outside[0]!r}" if by_candidate and outside else None
        return event if by_candidate else None

    def _forged_location(self, filename: Any) -> bool:
        return isinstance(filename, str) and filename.startswith(os.sep) and not self._inside(filename)

    def _open_refusal(self, args: tuple[Any, ...], direct_candidate: bool, by_candidate: bool) -> str | None:
        path = args[0] if args else None
        mode = args[1] if len(args) > 1 else None
        flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
        if not by_candidate:
            return None
        if isinstance(path, int):
            return f"opens file descriptor {path}"
        text = os.fsdecode(path) if isinstance(path, bytes) else path
        if not isinstance(text, str) or self._inside(text):
            return None
        if os.path.abspath(text).startswith(("/proc/", "/dev/mem", "/dev/kmem")):
            return f"opens {text!r}"
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool(flags & _WRITE_FLAGS)
        if writing or direct_candidate:
            return f"opens {text!r}" + (" for writing" if writing else "")
        return None

    # ------------------------------------------------------------------ the hook
    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if getattr(self.busy, "on", False):
            return  # the hook's own sys._getframe and attribute reads
        self.busy.on = True
        try:
            reason = self.refusal(event, args, sys._getframe(1))
        finally:
            self.busy.on = False
        if reason is not None:
            self._refuse(event, reason)

    def _refuse(self, event: str, reason: str) -> None:
        line = f"{REFUSAL_PREFIX}{event}: {reason}\n".encode(errors="replace")
        try:
            os.write(2, line)
        except OSError:
            pass  # the exit status alone still says it
        self.exit(AUDIT_EXIT)


def install(evaldir: Path | str, exit_fn: Callable[[int], Any] = os._exit) -> None:
    """Install the hook for an evaluation whose files live in `evaldir` (irreversible: call it in
    the disposable evaluation process only). `exit_fn` is for tests in a subprocess."""
    # A first import of a module the candidate asks for must not write its bytecode next to the
    # library (every file change outside the evaluation directory that it decides is refused).
    sys.dont_write_bytecode = True
    sys.addaudithook(_Auditor(Path(evaldir), exit_fn))


def refusal_reason(output: str) -> str | None:
    """The refused event named in an evaluation's output log (the last one), if any."""
    lines = [ln for ln in output.splitlines() if ln.startswith(REFUSAL_PREFIX)]
    return lines[-1][len(REFUSAL_PREFIX) :] if lines else None


def interpreter_hooks() -> tuple[Any, ...]:
    """The interpreter hooks in force: compared around every candidate call (a second layer
    for hooks set without an audited call, e.g. by native code)."""
    tools: tuple[Any, ...] = ()
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is not None:
        tools = tuple(monitoring.get_tool(i) for i in range(6))
    gettrace = getattr(threading, "gettrace", None)
    getprofile = getattr(threading, "getprofile", None)
    thread_hooks = (gettrace(), getprofile()) if gettrace and getprofile else ()
    return (sys.gettrace(), sys.getprofile(), *thread_hooks, *tools)
