"""The GPU tests' launcher environment (tests/gpu/launched.py): a port the caller set is kept,
every other port setting gets a free port of its own, so two GPU tests can share a machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gpu.launched import PORT_SETTINGS, RAY_WORKER_PORTS, launcher_env

pytestmark = pytest.mark.unit


def test_ports_the_caller_did_not_set_are_free_and_distinct(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in PORT_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("EVAL_PORT", "18200")
    monkeypatch.setenv("TMUX", f"{tmp_path / 'tmux.sock'},1,0")  # inside a tmux session
    env = launcher_env()
    assert env["EVAL_PORT"] == "18200" and "TMUX" not in env
    chosen = [int(env[name]) for name in PORT_SETTINGS if name != "EVAL_PORT"]
    assert len(set(chosen)) == len(chosen) and all(
        not RAY_WORKER_PORTS[0] <= p <= RAY_WORKER_PORTS[1] for p in chosen
    ), chosen
