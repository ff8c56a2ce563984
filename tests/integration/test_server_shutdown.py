"""The long-running servers (eval server, buffer server, tiny engine) end the same way whatever
stops them: SIGTERM and SIGHUP take the Ctrl-C path and leave no child process behind; a busy
port is one line on stderr naming the port and the flag, and a non-zero exit."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from krl_common.service import start_service
from tests.processes import still_running

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port with a listener on it (what another server would hold)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


def _env() -> dict[str, str]:
    pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": pythonpath}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    from slime_ext.dev_engine.tiny_model import write_model_dir

    return write_model_dir(tmp_path_factory.mktemp("tiny") / "model")


def _server_cmd(name: str, port: int, tmp_path: Path, tiny_model: Path | None) -> list[str]:
    if name == "eval_server":
        return [
            sys.executable,
            "-m",
            "eval_server",
            "--devices",
            "cpu",
            "--cpu-workers",
            "1",
            "--port",
            str(port),
        ]
    if name == "buffer_server":
        return [
            sys.executable,
            "-m",
            "buffer_server",
            "--db",
            str(tmp_path / "b.sqlite"),
            "--port",
            str(port),
        ]
    assert tiny_model is not None
    return [
        sys.executable,
        "-m",
        "slime_ext.dev_engine.engine",
        "--model",
        str(tiny_model),
        "--port",
        str(port),
    ]


@pytest.mark.parametrize(
    ("name", "env_var"),
    [("eval_server", "EVAL_PORT"), ("buffer_server", "BUFFER_PORT"), ("tiny_engine", "ENGINE_PORT")],
)
def test_a_busy_port_is_one_line_naming_port_and_flag(
    name: str, env_var: str, busy_port: int, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    model = request.getfixturevalue("tiny_model") if name == "tiny_engine" else None
    cmd = [*_server_cmd(name, busy_port, tmp_path, model), "--log-level", "ERROR"]
    res = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode != 0
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith(f"{name}: port {busy_port} is in use")
    assert "--port N" in lines[0] and env_var in lines[0]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_eval_server_stops_its_workers_on_sigterm_and_sighup(sig: signal.Signals, tmp_path: Path) -> None:
    svc = start_service(
        "eval_server", ["--devices", "cpu", "--cpu-workers", "2"], tmp_path, startup_timeout_s=180
    )
    try:
        children = [c.pid for c in psutil.Process(svc.pid).children(recursive=True)]
        assert len(children) >= 2  # one process per CPU worker
        svc.proc.send_signal(sig)
        assert svc.proc.wait(timeout=60) == 0
        assert still_running(children) == []
        assert "shutting down" in svc.log_tail()
    finally:
        svc.stop()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_buffer_server_shuts_down_cleanly_on_sigterm_and_sighup(sig: signal.Signals, tmp_path: Path) -> None:
    svc = start_service(
        "buffer_server",
        ["--db", str(tmp_path / "b.sqlite"), "--ingest-workers", "2"],
        tmp_path,
        startup_timeout_s=120,
    )
    try:
        children = [c.pid for c in psutil.Process(svc.pid).children(recursive=True)]
        svc.proc.send_signal(sig)
        assert svc.proc.wait(timeout=60) == 0  # the `finally` ran: runner, ingest pool, database closed
        assert still_running(children) == []
        assert "shutting down" in svc.log_tail()
    finally:
        svc.stop()


def test_tiny_engine_exits_cleanly_on_sighup(tiny_model: Path, tmp_path: Path) -> None:
    svc = start_service(
        "slime_ext.dev_engine.engine", ["--model", str(tiny_model)], tmp_path, startup_timeout_s=180
    )
    try:
        svc.proc.send_signal(signal.SIGHUP)
        assert svc.proc.wait(timeout=60) == 0
        assert "shutting down after" in svc.log_tail()
    finally:
        svc.stop()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_eval_samples_stops_the_eval_server_it_started(sig: signal.Signals, tmp_path: Path) -> None:
    """tools.eval_samples starts its own eval server: SIGTERM/SIGHUP stop it (and its workers) as
    Ctrl-C does, instead of leaving them running when the tool dies."""
    cmd = [sys.executable, "-m", "tools.eval_samples", "--devices", "cpu", "--workers", "1", "--trials", "1"]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("eval server healthy"):
                break
        else:
            pytest.fail(f"no eval server started: {proc.stderr.read() if proc.stderr else ''}")
        children = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        assert len(children) >= 2  # the eval server and its worker
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + sig, err
    assert still_running(children) == []
