"""A buffer server that refuses to start leaves nothing behind: a busy port is refused before the
database exists, and a start that fails after it (a bad recipe) removes the files it created,
never an existing database."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def _start(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "buffer_server", *args], capture_output=True, text=True, timeout=120
    )


def test_a_refused_start_leaves_no_files(tmp_path: Path) -> None:
    db = tmp_path / "data" / "b.sqlite"
    db.parent.mkdir()
    res = _start("--db", str(db), "--recipe", str(tmp_path / "missing.yaml"), "--port", "0")
    assert res.returncode != 0 and "recipe file not found" in res.stderr
    assert list(db.parent.iterdir()) == []
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        res = _start("--db", str(db), "--port", str(busy.getsockname()[1]))
    assert res.returncode != 0 and "is in use" in res.stderr
    assert list(db.parent.iterdir()) == []


def test_an_existing_database_is_kept_when_a_start_fails(tmp_path: Path) -> None:
    db = tmp_path / "b.sqlite"
    from buffer_server.store.buffer_store import BufferStore
    from buffer_server.store.rules import GroupRules

    BufferStore(str(db), GroupRules(group_size=2)).close()
    before = sorted(p.name for p in tmp_path.iterdir())
    res = _start("--db", str(db), "--recipe", str(tmp_path / "missing.yaml"), "--port", "0")
    assert res.returncode != 0
    assert sorted(p.name for p in tmp_path.iterdir()) == before
