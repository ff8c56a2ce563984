"""One snapshot of a launcher run, from what the run already writes (no other instrumentation):

- windows: `RUN_DIR/cmd/NAME.sh` are the windows; `pids/NAME.rc` (written by scripts/lib/window.sh
  when the command ends) says one exited and with which code, `pids/NAME.pid` that it started;
  the last line of `logs/NAME.log` says what it did last;
- the trainer: slime's own log lines in `logs/trainer.log`, `step N: {...}` (train metrics: loss,
  grad norm, KL, ...) and `perf N: {...}` (rollout metrics, ours under `rollout/kernel/`);
- the eval server's and the buffer's `/stats` (ports from `RUN_DIR/run.env`);
- GPU use from `nvidia-smi`, where it exists.

`snapshot(run_dir)` gathers them; `append_history` keeps one line per trainer step in
`RUN_DIR/status.jsonl`, so a finished run can be plotted (tools/plot_run.py). tools/status.py
renders it.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import shutil
import subprocess
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DEVICE_RATE_PREFIX",
    "HISTORY_NAME",
    "WINDOW_RATE_KEY",
    "WindowState",
    "append_history",
    "exited_windows",
    "parse_slime_log",
    "read_run_env",
    "snapshot",
    "turn_index",
    "window_rates",
    "window_states",
]

HISTORY_NAME = "status.jsonl"
# window_rates' keys: evaluations/min between two snapshots, overall and per device
WINDOW_RATE_KEY = "eval/per_min_window"
DEVICE_RATE_PREFIX = "eval/per_min/"
_TURN_KEY = re.compile(r"(?:^|/)turn(\d+)/")
_LOG_LINE = re.compile(r"\b(step|perf) (\d+): (\{.*\})\s*$")
_TAIL_BYTES = 1 << 20  # the part of a log read for its last lines and metrics
_RECENT = ("mean_return", "correct_rate", "compile_rate")  # per step, for the last few steps
_RECENT_STEPS = 5


@dataclass(frozen=True)
class WindowState:
    name: str
    state: str  # "running" | "exited" | "not started"
    exit_code: int | None
    last_line: str


def read_run_env(run_dir: Path) -> dict[str, str]:
    """The `export NAME=value` lines of RUN_DIR/run.env (written by the launcher)."""
    env: dict[str, str] = {}
    path = run_dir / "run.env"
    if not path.is_file():
        return env
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("export ") and "=" in line:
            key, _, raw = line[len("export ") :].partition("=")
            try:
                parts = shlex.split(raw)
            except ValueError:
                continue
            env[key] = parts[0] if parts else ""
    return env


def _tail(path: Path, max_bytes: int = _TAIL_BYTES) -> str:
    if not path.is_file():
        return ""
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - max_bytes))
        return f.read().decode("utf-8", errors="replace")


def _last_line(path: Path) -> str:
    lines = [line for line in _tail(path, 16384).splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else ""


def window_states(run_dir: Path, skip: tuple[str, ...] = ("status",)) -> list[WindowState]:
    """Every window of the run (its cmd/NAME.sh), in start order where the pid files tell it."""
    names = sorted(p.stem for p in (run_dir / "cmd").glob("*.sh") if p.stem not in skip)
    states = []
    for name in names:
        rc_file = run_dir / "pids" / f"{name}.rc"
        if rc_file.is_file():
            try:
                code: int | None = int(rc_file.read_text().strip())
            except ValueError:
                code = None
            state = "exited"
        else:
            code = None
            state = "running" if (run_dir / "pids" / f"{name}.pid").is_file() else "not started"
        states.append(WindowState(name, state, code, _last_line(run_dir / "logs" / f"{name}.log")))
    return states


def exited_windows(states: list[WindowState]) -> list[WindowState]:
    return [w for w in states if w.state == "exited"]


def parse_slime_log(text: str) -> tuple[dict[int, dict[str, Any]], dict[int, dict[str, Any]]]:
    """slime's per-step dictionaries from its log: ({step: train metrics}, {step: rollout and
    timing metrics}, the `perf` lines of one step merged)."""
    train: dict[int, dict[str, Any]] = {}
    rollout: dict[int, dict[str, Any]] = {}
    for line in text.splitlines():
        m = _LOG_LINE.search(line)
        if not m:
            continue
        try:
            values = ast.literal_eval(m.group(3))
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
        if isinstance(values, dict):  # slime logs two `perf N` dicts per step (rollout, train timing)
            (train if m.group(1) == "step" else rollout).setdefault(int(m.group(2)), {}).update(values)
    return train, rollout


def turn_index(key: str) -> int | None:
    """t of a per-turn rollout metric (`rollout/kernel/turn{t}/...`, slime_plugins/metrics.py)."""
    m = _TURN_KEY.search(key)
    return int(m.group(1)) if m else None


def _get_json(url: str, timeout_s: float = 2.0) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            body = json.loads(resp.read().decode("utf-8"))
        return body if isinstance(body, dict) else None
    except (OSError, ValueError):
        return None


def _gpus() -> list[dict[str, Any]] | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [
                smi,
                "--query-gpu=index,utilization.gpu,memory.used,memory.total",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    gpus = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4 and all(p.replace(".", "").isdigit() for p in parts):
            gpus.append({"index": int(parts[0]), "util_pct": float(parts[1]), "mem_used_mib": float(parts[2]),
                         "mem_total_mib": float(parts[3])})  # fmt: skip
    return gpus


def _eval_section(stats: dict[str, Any] | None) -> dict[str, Any] | None:
    if stats is None:
        return None
    uptime = float(stats.get("uptime_s") or 0.0)
    evaluations = int(stats.get("evaluations") or 0)
    by_device: dict[str, int] = {}  # evaluations per GPU (or cpu): the workers' counts summed
    for w in stats.get("per_worker") or []:
        if isinstance(w, dict) and isinstance(w.get("evaluations"), int):
            label = str(w.get("device"))
            by_device[label] = by_device.get(label, 0) + w["evaluations"]
    return {
        "evaluations": evaluations,
        "by_device": by_device,
        "per_min": round(evaluations / uptime * 60.0, 2) if uptime > 0 else None,
        "in_flight": stats.get("in_flight"),
        "queued": stats.get("queued"),
        "by_status": stats.get("by_status") or {},
        "p50_s": (stats.get("latency_s") or {}).get("p50"),
        "workers_ready": stats.get("workers_ready"),
        "workers": stats.get("workers"),
    }


def _fleet_section(path: Path) -> dict[str, Any] | None:
    """A multi-node run's eval fleet (written by its eval window: slime_ext/cluster/eval_fleet.py)
    with each answering server's own /stats, and the cluster's nodes; None for a one-node run."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    servers = []
    for row in data.get("servers") or []:
        url = row.get("url") if row.get("alive") else None
        servers.append({**row, "stats": _eval_section(_get_json(f"{url}/stats")) if url else None})
    return {"time": data.get("time"), "servers": servers, "nodes": data.get("nodes") or []}


def _buffer_section(stats: dict[str, Any] | None, now: float) -> dict[str, Any] | None:
    if stats is None:
        return None
    groups = stats.get("groups") or {}
    runner = stats.get("runner") or {}
    out: dict[str, Any] = {
        "groups_ready": groups.get("ready"),
        "groups_consumed": groups.get("consumed"),
        "records": (stats.get("records") or {}).get("total"),
        "policy_version": stats.get("policy_version"),
        "dropped_groups": stats.get("dropped_groups") or {},
        "stale_records_dropped": (stats.get("dropped_records") or {}).get("stale"),
        "max_staleness": (stats.get("rules") or {}).get("max_staleness"),
        "runner": None,
    }
    if runner.get("configured"):
        episodes = runner.get("episodes") or {}
        done = int(episodes.get("completed") or 0)  # truncated episodes are among the completed
        started = runner.get("started_at")
        expected = None
        if all(isinstance(runner.get(k), int) for k in ("prompts", "group_size", "epochs")):
            expected = runner["prompts"] * runner["group_size"] * runner["epochs"]
        out["runner"] = {
            "state": "finished"
            if runner.get("finished")
            else "running"
            if runner.get("running")
            else "stopped",
            "epoch": runner.get("epoch"),
            "episodes_done": done,
            "episodes_expected": expected,
            "in_flight": episodes.get("in_flight"),
            "aborted": episodes.get("aborted"),
            "episodes_per_s": round(done / (now - started), 3) if started and now > started else None,
            "outage_pause_s": runner.get("outage_pause_s"),
            "last_error": runner.get("last_error"),
        }
    return out


def snapshot(run_dir: Path, *, now: float | None = None) -> dict[str, Any]:
    """Everything the status window shows, as plain data."""
    now = time.time() if now is None else now
    env = read_run_env(run_dir)
    train, rollout = parse_slime_log(_tail(run_dir / "logs" / "trainer.log"))
    eval_port, buffer_port = env.get("EVAL_PORT"), env.get("BUFFER_PORT")
    last_train = max(train) if train else None
    last_rollout = max(rollout) if rollout else None
    return {
        "time": now,
        "run": env.get("RUN_NAME", run_dir.name),
        "session": env.get("TMUX_SESSION"),
        "windows": [asdict(w) for w in window_states(run_dir)],
        "train_step": last_train,
        "train": train.get(last_train, {}) if last_train is not None else {},
        "rollout_step": last_rollout,
        "rollout": rollout.get(last_rollout, {}) if last_rollout is not None else {},
        "recent_rollouts": [
            {"step": step, **{k: rollout[step].get(f"rollout/kernel/{k}") for k in _RECENT}}
            for step in sorted(rollout)[-_RECENT_STEPS:]
        ],
        "eval": _eval_section(_get_json(f"http://127.0.0.1:{eval_port}/stats")) if eval_port else None,
        "buffer": _buffer_section(_get_json(f"http://127.0.0.1:{buffer_port}/stats"), now)
        if buffer_port
        else None,
        "gpus": _gpus(),
        "fleet": _fleet_section(run_dir / "fleet.json"),
        # scripts/stop.sh's mark (UTC time): a service that does not answer is stopped, not lost
        "stopped": _last_line(run_dir / "stopped") or None,
    }


def window_rates(prev: dict[str, Any], row: dict[str, Any]) -> dict[str, float]:
    """Evaluations per minute between two snapshots (or status-history rows: the same `time` and
    `eval`), overall (WINDOW_RATE_KEY) and per device (DEVICE_RATE_PREFIX + device); {} when
    either lacks the counts or no time passed."""
    minutes = (float(row.get("time") or 0.0) - float(prev.get("time") or 0.0)) / 60.0
    before, now = prev.get("eval") or {}, row.get("eval") or {}
    if (
        minutes <= 0
        or not isinstance(now.get("evaluations"), int)
        or not isinstance(before.get("evaluations"), int)
    ):
        return {}
    rates = {WINDOW_RATE_KEY: (now["evaluations"] - before["evaluations"]) / minutes}
    old = before.get("by_device") or {}
    for device, n in (now.get("by_device") or {}).items():
        if isinstance(n, int) and isinstance(old.get(device, 0), int):
            rates[f"{DEVICE_RATE_PREFIX}{device}"] = (n - old.get(device, 0)) / minutes
    return rates


def append_history(run_dir: Path, snap: dict[str, Any]) -> bool:
    """Append `snap` to RUN_DIR/status.jsonl when its trainer or rollout step is new; True if it did."""
    key = (snap.get("train_step"), snap.get("rollout_step"))
    if key == (None, None):
        return False
    path = run_dir / HISTORY_NAME
    last = None
    if path.is_file():
        lines = [line for line in _tail(path, 1 << 16).splitlines() if line.strip()]
        if lines:
            try:
                prev = json.loads(lines[-1])
                last = (prev.get("train_step"), prev.get("rollout_step"))
            except ValueError:
                last = None
    if last == key:
        return False
    row = {k: snap[k] for k in ("time", "train_step", "train", "rollout_step", "rollout", "eval", "buffer")}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")
    return True
