"""The CPU dry run end to end (`python -m tools.dry_run`): tiny model, real eval server (CPU),
buffer server with its agent runner, the embedded /generate engine or an external one, one
rollout step in a private tmux server; then nothing of the run is left running."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

from slime_ext.trajectory.record import parse_record

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed (apt-get install tmux)"),
]

REPO = Path(__file__).resolve().parents[2]


class _StubEngine(BaseHTTPRequestHandler):
    """An engine that is up (/health, /get_model_info answer) but whose /generate answers
    `generate_status` after `generate_delay_s` (a hang when that is long)."""

    generate_status = 500
    generate_delay_s = 0.0

    def do_GET(self) -> None:
        self._reply(200, b'{"model_path": "stub"}')

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        time.sleep(self.generate_delay_s)
        self._reply(self.generate_status, b'{"error": "stub engine: generate fails"}')

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@contextlib.contextmanager
def _stub_engine(status: int, delay_s: float) -> Iterator[str]:
    handler = type("Handler", (_StubEngine,), {"generate_status": status, "generate_delay_s": delay_s})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _dry_run_cmd(run_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tools.dry_run",
        "--run-dir",
        str(run_dir),
        "--no-install",
        "--eval-workers",
        "1",
        "--timeout-s",
        "240",
        *extra,
    ]


def _dry_run(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], Path, dict[str, str]]:
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "TMUX"}
    env["TMUX_SOCKET"] = str(tmp_path / "tmux.sock")  # a private tmux server, removed with tmp_path
    cmd = _dry_run_cmd(run_dir, *extra)
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=420)
    return res, run_dir, env


def _run_processes(run_dir: Path) -> list[int]:
    run_id = next(
        line.split("=", 1)[1]
        for line in (run_dir / "run.env").read_text().splitlines()
        if line.startswith("export KRL_RUN_ID=")
    )
    found = []
    for proc in psutil.process_iter(["environ", "status"]):
        env = proc.info["environ"] or {}
        if env.get("KRL_RUN_ID") == run_id and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc.pid)
    return found


def _check_trajectories(run_dir: Path, n: int) -> None:
    lines = (run_dir / "trajectories.jsonl").read_text().splitlines()
    assert len(lines) == n
    for line in lines:
        rec = parse_record(json.loads(line))
        assert sum(rec.loss_mask) > 0  # the model sampled tokens, stored with their log-probs
        sampled = [lp for lp, m in zip(rec.rollout_log_probs, rec.loss_mask, strict=True) if m]
        assert all(math.isfinite(lp) and lp <= 0 for lp in sampled)
        assert 1 <= len(rec.turn_rewards) <= 2


def test_dry_run_with_the_embedded_engine(tmp_path: Path) -> None:
    res, run_dir, env = _dry_run(tmp_path, "--problems", "relu", "softmax", "--group-size", "2")
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    out = res.stdout
    assert "windows: engine eval buffer trainer status" in out
    assert "turn  episodes  code evaluated  compiled  correct  mean reward" in out
    assert "4 trajectories" in out
    assert f"trajectories: {run_dir / 'trajectories.jsonl'}" in out
    _check_trajectories(run_dir, 4)
    summary = json.loads((run_dir / "rollout_step.json").read_text())
    assert summary["records"] == 4 and summary["turns"][0]["episodes"] == 4
    for name in ("engine", "eval", "buffer", "trainer"):
        assert (run_dir / "logs" / f"{name}.log").stat().st_size > 0
    assert "tiny_engine serving" in (run_dir / "logs" / "engine.log").read_text()
    assert (run_dir / "stopped").is_file()
    assert _run_processes(run_dir) == []
    assert subprocess.run(["tmux", "-S", env["TMUX_SOCKET"], "has-session", "-t", "run"]).returncode != 0


def test_dry_run_with_an_external_scripted_engine(tmp_path: Path) -> None:
    """--engine-url with an external engine in SCRIPTED mode (the rules `--scripted` writes): the
    bundled correct candidate comes back for each turn, so the eval server path runs for real.
    With --keep the session stays up after the step (named, with how to attach and stop it) until
    scripts/stop.sh stops it."""
    from slime_ext.dev_engine.engine import load_engine
    from slime_ext.dev_engine.tiny_model import write_model_dir
    from tools.dry_run import write_scripted_rules

    rules = tmp_path / "scripted.jsonl"
    assert write_scripted_rules(rules, ["relu"]) == 1
    engine = load_engine(str(write_model_dir(tmp_path / "external_model")), seed=3, scripted=str(rules))
    url = engine.start()
    try:
        # Room for the whole candidate in one turn (what the dry run's --scripted sets too).
        res, run_dir, env = _dry_run(
            tmp_path,
            "--engine-url",
            url,
            "--problems",
            "relu",
            "--group-size",
            "1",
            "--max-new-tokens",
            "2048",
            "--keep",
        )
        assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
        socket = env["TMUX_SOCKET"]
        assert f"attach: tmux -S {socket} attach -t run" in res.stdout
        assert f"stop:   scripts/stop.sh {run_dir}" in res.stdout
        assert subprocess.run(["tmux", "-S", socket, "has-session", "-t", "run"]).returncode == 0
        assert _run_processes(run_dir), "--keep: the eval server and the buffer still run"
        shown = subprocess.run(
            [sys.executable, "-m", "tools.status", str(run_dir), "--once"],
            cwd=REPO, env={**env, "COLUMNS": "250"}, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        assert "exited (0)" in shown.stdout  # the trainer window (tools.rollout_step) finished
        assert re.search(r"\b[1-9]\d* evaluations \(", shown.stdout), shown.stdout
        assert "unreachable" not in shown.stdout
        subprocess.run(
            ["bash", "scripts/stop.sh", str(run_dir)], cwd=REPO, env=env, check=True, capture_output=True
        )
        assert subprocess.run(["tmux", "-S", socket, "has-session", "-t", "run"]).returncode != 0
    finally:
        engine.stop()
    assert "windows: eval buffer trainer status" in res.stdout  # no embedded engine window
    assert engine.served >= 1 and not (run_dir / "logs" / "engine.log").exists()
    _check_trajectories(run_dir, 1)
    summary = json.loads((run_dir / "rollout_step.json").read_text())
    first = summary["turns"][0]
    assert (first["evaluated"], first["compiled"], first["correct"]) == (1, 1, 1)
    assert first["mean_reward"] == pytest.approx(0.3)
    assert _run_processes(run_dir) == []


def test_dry_run_scripted_mix_gives_one_group_correct_and_wrong_turns(tmp_path: Path) -> None:
    """--scripted-mix 0.5 (labelled SCRIPTED MIX): one group of 3 episodes of relu. The engine's
    draws spread any 3 requests with the same ids over both kinds (slime_ext/dev_engine/scripted.py), so the
    first turn holds a correct and a not-correct answer, and the group's rewards are not all equal:
    the group GRPO would train on rather than drop."""
    res, run_dir, _ = _dry_run(tmp_path, "--problems", "relu", "--group-size", "3", "--scripted-mix", "0.5")
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    assert "SCRIPTED MIX run: the answers are bundled candidates, not the model's" in res.stdout
    assert "turn  episodes  code evaluated  compiled  correct  mean reward" in res.stdout
    assert "SCRIPTED MODE (mix)" in (run_dir / "logs" / "engine.log").read_text()
    _check_trajectories(run_dir, 3)
    records = [
        parse_record(json.loads(line)) for line in (run_dir / "trajectories.jsonl").read_text().splitlines()
    ]
    assert {r.instance_id for r in records} == {"sample_relu"}
    first = [bool((r.turn_eval_results[0] or {}).get("correct")) for r in records]
    assert set(first) == {True, False}
    assert {r.turn_rewards[0] for r in records} - {0.3}  # a wrong first turn: reward 0 or 0.1
    assert len({r.reward for r in records}) > 1  # a correct first turn gives >= 0.3, a wrong one <= 0.22
    summary = json.loads((run_dir / "rollout_step.json").read_text())
    assert summary["turns"][0]["episodes"] == 3 and 1 <= summary["turns"][0]["correct"] <= 2
    assert _run_processes(run_dir) == []


def test_sigterm_stops_the_dry_run_like_ctrl_c(tmp_path: Path) -> None:
    """`kill` during the rollout step: the dry run runs scripts/stop.sh of its run, so its tmux
    session and every process of the run end, and it exits 128+signal. SIGHUP (a closed terminal)
    takes the same handler (krl_common.shutdown; both signals: tests/unit/test_shutdown.py)."""
    sig = signal.SIGTERM
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "TMUX"}
    env["TMUX_SOCKET"] = str(tmp_path / "tmux.sock")
    with _stub_engine(200, 600.0) as url:  # up, but /generate hangs: the step is still running
        cmd = _dry_run_cmd(run_dir, "--engine-url", url, "--problems", "relu", "--group-size", "1")
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            assert proc.stdout is not None
            seen = []
            for line in proc.stdout:
                seen.append(line)
                if line.startswith("[4/4]"):
                    break
            assert seen and seen[-1].startswith("[4/4]"), "".join(seen) + proc.stderr.read()  # type: ignore[union-attr]
            assert _run_processes(run_dir)  # the windows are up
            time.sleep(2)
            proc.send_signal(sig)
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 128 + sig, err
    assert "dry run interrupted" in err
    assert (run_dir / "stopped").is_file()  # scripts/stop.sh ran to its end
    stop_log = (run_dir / "logs" / "stop.log").read_text()
    assert "SIGKILL" not in stop_log, stop_log  # every window ended on its SIGTERM (the buffer's
    # episode, waiting on the hung engine, is cancelled instead of holding the shutdown)
    assert _run_processes(run_dir) == []
    session = run_dir.name
    assert (
        subprocess.run(["tmux", "-S", env["TMUX_SOCKET"], "has-session", "-t", f"={session}"]).returncode != 0
    )


def test_a_dead_engine_url_fails_in_seconds_naming_url_and_flag(tmp_path: Path) -> None:
    """Nothing listens at --engine-url: one line naming the URL and the flag, before anything starts
    (it used to hang at the rollout step for its whole timeout, only buffer.log saying why)."""
    with socket.socket() as sock:  # a port that was free a moment ago and has no listener now
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    res, run_dir, _ = _dry_run(tmp_path, "--engine-url", url, "--problems", "relu")
    assert time.monotonic() - started < 30
    assert res.returncode == 1
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"dry run FAILED: --engine-url {url}: no engine answers")
    assert not run_dir.exists()  # nothing was started


def test_an_engine_outage_is_reported_on_the_console(tmp_path: Path) -> None:
    """The engine answers /health but every /generate fails: the dry run's console says so (from
    the buffer runner's outage counters) while the runner retries, not only buffer.log."""
    with _stub_engine(500, 0.0) as url:
        res, run_dir, _ = _dry_run(
            tmp_path,
            "--engine-url",
            url,
            "--problems",
            "relu",
            "--group-size",
            "1",
            "--outage-warn-s",
            "2",
            "--timeout-s",
            "15",
        )
    assert res.returncode == 1  # the step never gets a group
    assert f"WARNING: the engine {url} has been failing for" in res.stdout, res.stdout + res.stderr
    assert "aborted episode(s) in a row; last: generate error" in res.stdout
    assert _run_processes(run_dir) == []
