"""Triton's GPU-free per-process caches are filled in the worker before it forks
(triton_warmup.warm_host_caches): a child forked afterwards finds `triton_key` (the hash of
libtriton that every kernel's cache key holds) computed and does not hash again."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_SCRIPT = textwrap.dedent(
    """
    import os, sys
    from eval_server.workers import triton_warmup
    key = triton_warmup._triton_function(triton_warmup._HOST_CACHES["triton_key"])
    assert key.cache_info().currsize == 0, "computed before the warm-up"
    if sys.argv[1] == "warm":
        assert "triton_key" in triton_warmup.warm_host_caches()
    pid = os.fork()
    if pid == 0:
        before = key.cache_info()
        key()
        after = key.cache_info()
        os._exit(0 if after.misses == before.misses else 3)
    _, status = os.waitpid(pid, 0)
    sys.exit(os.waitstatus_to_exitcode(status))
    """
)


def _child_exit(mode: str) -> int:
    return subprocess.run([sys.executable, "-c", _SCRIPT, mode], cwd=REPO, timeout=300).returncode


def test_a_child_forked_after_the_warm_up_does_not_hash_triton_again() -> None:
    assert _child_exit("warm") == 0


def test_without_the_warm_up_each_child_hashes_triton_itself() -> None:
    assert _child_exit("cold") == 3
