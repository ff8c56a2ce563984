"""eval_server/isolation/audit.py: which calls the evaluation child's audit hook refuses, by who
decided them. Each case runs in a fresh Python process (a hook cannot be removed): a file in a
temporary evaluation directory plays the candidate, a file outside it a library, and the process
must end with AUDIT_EXIT and the refusal line, or finish normally."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from eval_server.isolation import audit

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]

# Runs `candidate.run()` from a file in the evaluation directory, with `library.py` (outside it)
# importable: the candidate may call through it.
DRIVER = """
import sys
sys.path[:0] = [{libdir!r}, {evaldir!r}]
from eval_server.isolation import audit
audit.install({evaldir!r})
import candidate
candidate.run()
print("FINISHED")
"""

LIBRARY = """
import sys

def frame_for(caller):  # a library that reads frames itself (as torch or Triton may)
    return sys._getframe(1) is not None

def trace_off():
    sys.settrace(None)

def write(path):
    with open(path, "w") as fh:
        fh.write("x")
"""

REFUSED = {
    "settrace": "import sys\ndef run():\n    sys.settrace(None)",
    "setprofile_via_getattr": "import torch\ndef run():\n    getattr(getattr(torch, 'sys'), 'setprofile')(None)",
    "threading_thread_builtin_target": (
        "import sys, threading\ndef run():\n    t = threading.Thread(target=sys.setprofile, args=(None,))\n"
        "    t.start(); t.join()"
    ),
    "getframe": "import sys\ndef run():\n    sys._getframe()",
    "inspect_currentframe": "import inspect\ndef run():\n    inspect.currentframe()",
    "traceback_frame": "def run():\n    e = ValueError()\n    try:\n        raise e\n    except ValueError as exc:\n        exc.__traceback__.tb_frame",
    "generator_frame": "def run():\n    (i for i in ()).gi_frame",
    "current_frames": "import sys\ndef run():\n    sys._current_frames()",
    "gc_objects": "import gc\ndef run():\n    gc.get_objects()",
    "gc_referrers": "import gc\ndef run():\n    gc.get_referrers(run)",
    "ctypes": "import ctypes\ndef run():\n    ctypes.string_at(id(run), 8)",
    "os_system": "import os\ndef run():\n    os.system('true')",
    "subprocess": "import subprocess\ndef run():\n    subprocess.run(['true'])",
    "kill": "import os\ndef run():\n    os.kill(os.getpid(), 0)",
    "exec": "def run():\n    exec('x = 1')",
    "code_replace_location": "import os\ndef run():\n    run.__code__.replace(co_filename=os.__file__)",
    "marshal_loads": "import marshal\ndef run():\n    marshal.loads(marshal.dumps(1))",
    "marshal_via_importlib_internals": (
        "import importlib._bootstrap_external as b, marshal\n"
        "def run():\n    b._compile_bytecode(marshal.dumps(run.__code__), name='x')"
    ),
    "open_outside": "import os\ndef run():\n    open(os.__file__).close()",
    "write_outside_via_pathlib": "import pathlib\ndef run():\n    pathlib.Path('..', 'never').write_text('x')",
    "proc_via_stdlib": "import pathlib\ndef run():\n    pathlib.Path('/proc/self/maps').read_text()",
    "rename_outside": "import os\ndef run():\n    os.rename('nothing-here', '../never')",
}

ALLOWED = {
    "stdlib_helpers": (
        "import collections, dataclasses, enum, functools, typing\n"
        "@dataclasses.dataclass\nclass C:\n    a: int = 1\n"
        "P = collections.namedtuple('P', 'a b')\nclass N(typing.NamedTuple):\n    a: int\n"
        "class E(enum.Enum):\n    A = 1\n"
        "def run():\n    C(); P(1, 2); N(1); functools.lru_cache(lambda: 1)"
    ),
    "library_reads_frames": "import library\ndef run():\n    library.frame_for(run)",
    "library_hooks_interpreter": "import library\ndef run():\n    library.trace_off()",
    "library_writes_outside": "import library, os\ndef run():\n    library.write(os.path.join(os.path.dirname(library.__file__), 'f'))",
    "files_inside": "import os\ndef run():\n    open('mine.txt', 'w').write('x'); os.rename('mine.txt', 'yours.txt'); open('yours.txt').read()",
    "read_stdlib_via_pathlib": "import pathlib, json\ndef run():\n    pathlib.Path(json.__file__).read_text()",
    "import_new_stdlib_module": "def run():\n    import fractions, decimal  # first load: importlib opens and execs their files",
    "import_module_reads_cached_bytecode": (
        "import importlib\n"
        "def run():\n    importlib.import_module('fractions')  # first load: its cached bytecode is unmarshalled"
    ),
}


def _run(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    evaldir, libdir = tmp_path / "eval", tmp_path / "lib"
    evaldir.mkdir()
    libdir.mkdir()
    (evaldir / "candidate.py").write_text(textwrap.dedent(source))
    (libdir / "library.py").write_text(LIBRARY)
    driver = tmp_path / "driver.py"  # a file outside the evaluation directory, as the evaluator is
    driver.write_text(DRIVER.format(evaldir=str(evaldir), libdir=str(libdir)))
    return subprocess.run(
        [sys.executable, str(driver)], cwd=evaldir, capture_output=True, text=True, timeout=120,
        env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO)},
    )  # fmt: skip


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_when_the_candidate_decides(tmp_path: Path, name: str) -> None:
    proc = _run(tmp_path, REFUSED[name])
    assert proc.returncode == audit.AUDIT_EXIT, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    assert "FINISHED" not in proc.stdout
    assert audit.refusal_reason(proc.stderr), proc.stderr[-2000:]


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_allowed_when_the_standard_library_or_a_library_acts(tmp_path: Path, name: str) -> None:
    proc = _run(tmp_path, ALLOWED[name])
    assert proc.returncode == 0 and "FINISHED" in proc.stdout, (proc.returncode, proc.stderr[-2000:])


def test_refusal_reason_reads_the_last_line() -> None:
    out = f"noise\n{audit.REFUSAL_PREFIX}sys.settrace: sys.settrace\nmore\n{audit.REFUSAL_PREFIX}open: opens '/x'\n"
    assert audit.refusal_reason(out) == "open: opens '/x'"
    assert audit.refusal_reason("nothing here") is None


def test_interpreter_hooks_see_a_thread_trace_hook() -> None:
    import threading

    before = audit.interpreter_hooks()
    threading.settrace(lambda *a: None)
    try:
        assert audit.interpreter_hooks() != before
    finally:
        threading.settrace(None)  # type: ignore[arg-type]
    assert audit.interpreter_hooks() == before
