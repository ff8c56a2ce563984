"""Server side of the workers: spawn, talk to, supervise and replace them; a bounded queue.

Each WorkerHandle owns one `python -m eval_server.workers.worker` process in its own session (so the
whole tree can be killed), with a scrubbed environment, its own work/temp/Triton-cache dir and,
on GPUs, CUDA_VISIBLE_DEVICES set to exactly one physical device before anything touches CUDA.
The worker enforces the per-evaluation timeout itself; the handle adds an outer deadline and
replaces a worker that hangs or dies, so a request always gets a result.
"""

from __future__ import annotations

import json
import logging
import os
import select
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval_server.feedback import failure_result
from eval_server.isolation import sandbox
from eval_server.schema import STATUS_CRASHED, STATUS_SERVER_ERROR, EvalRequest, EvalResult
from krl_common.stats import percentile

log = logging.getLogger("eval_server.workers.pool")
_PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent)


class QueueFullError(RuntimeError):
    """All workers busy and `max_queue` requests already waiting."""


class WorkerUnavailableError(RuntimeError):
    """A worker could not be (re)started."""


@dataclass(frozen=True)
class DeviceSlot:
    """One worker's device: kind 'cpu' or 'cuda'; `index` is the physical GPU id for cuda."""

    kind: str
    index: int | None = None
    name: str = ""  # e.g. "NVIDIA H200", when known

    @property
    def label(self) -> str:
        if self.kind != "cuda":
            return "cpu (triton interpreter)"
        return f"cuda:{self.index} ({self.name})" if self.name else f"cuda:{self.index}"


@dataclass
class PoolConfig:
    slots: list[DeviceSlot]
    workdir: Path
    default_timeout_s: float
    max_timeout_s: float
    max_queue: int = 64
    mem_cap_mb: int = 0
    cpu_threads_per_worker: int = 1
    startup_timeout_s: float = 300.0
    outer_grace_s: float = 30.0  # beyond the eval timeout before the worker itself is declared hung
    ref_cache: Path | None = None  # persistent reference-timing cache (GPU workers)
    # overrides of hardening.Hardening's fields (the server's flags), handed to each worker as JSON
    hardening: dict[str, Any] = field(default_factory=dict)
    # environment of the MPS daemon's clients (isolation/mps.py), given to GPU workers
    mps_env: dict[str, str] = field(default_factory=dict)


@dataclass
class PoolStats:
    started_at: float = field(default_factory=time.time)
    evaluations: int = 0
    by_status: Counter[str] = field(default_factory=Counter)
    by_check: Counter[str] = field(default_factory=Counter)
    worker_restarts: int = 0
    rejected_queue_full: int = 0
    latency_sum_s: float = 0.0
    latencies: list[float] = field(default_factory=list)  # bounded ring of recent latencies


class WorkerHandle:
    """One worker process plus the pipe protocol to it. Not thread-safe: the pool lends it out."""

    def __init__(self, worker_id: int, slot: DeviceSlot, config: PoolConfig) -> None:
        self.worker_id = worker_id
        self.slot = slot
        self.config = config
        self.dir = config.workdir / f"worker-{worker_id}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.info: dict[str, Any] = {}
        self.evaluations = 0
        self.restarts = 0
        self.spare_pid: int | None = None  # reported by the worker after each evaluation
        self._buf = b""

    # -------------------------------------------------------------- lifecycle
    def start(self) -> None:
        if self.dir.exists():
            shutil.rmtree(self.dir, ignore_errors=True)
        (self.dir / "tmp").mkdir(parents=True)
        overrides = {
            "HOME": str(self.dir),
            "TMPDIR": str(self.dir / "tmp"),
            "TRITON_CACHE_DIR": str(self.dir / "triton-cache"),
            "TRITON_HOME": str(self.dir),
            "PYTHONPATH": os.pathsep.join(
                p for p in (_PACKAGE_PARENT, os.environ.get("PYTHONPATH", "")) if p
            ),
            "PYTHONUNBUFFERED": "1",
        }
        if self.slot.kind == "cuda":
            overrides["CUDA_VISIBLE_DEVICES"] = str(self.slot.index)
            overrides["TRITON_INTERPRET"] = "0"
            overrides.update(self.config.mps_env)
        else:
            overrides["CUDA_VISIBLE_DEVICES"] = ""
            overrides["TRITON_INTERPRET"] = "1"
            overrides["OMP_NUM_THREADS"] = str(self.config.cpu_threads_per_worker)
        env = sandbox.scrubbed_env(os.environ, overrides)
        cmd = [
            sys.executable,
            "-m",
            "eval_server.workers.worker",
            "--worker-id",
            str(self.worker_id),
            "--device",
            self.slot.kind,
            "--device-label",
            self.slot.label,
            "--workdir",
            str(self.dir),
            "--mem-cap-mb",
            str(self.config.mem_cap_mb),
            "--threads",
            str(self.config.cpu_threads_per_worker if self.slot.kind == "cpu" else 1),
            "--ref-cache",
            str(self.config.ref_cache or ""),
            "--gpu-lock",
            str(self.config.workdir / f"gpu-{self.slot.index}.lock") if self.slot.kind == "cuda" else "",
            "--hardening",
            json.dumps(self.config.hardening),
        ]
        log_path = self.config.workdir / f"worker-{self.worker_id}.log"
        with open(log_path, "ab") as log_file:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log_file,
                env=env,
                cwd=str(self.dir),
                start_new_session=True,
            )
        self._buf = b""
        msg = self._read_message(time.monotonic() + self.config.startup_timeout_s)
        if msg is None or not msg.get("ready"):
            tail = _tail(log_path)
            self.kill()
            raise WorkerUnavailableError(
                f"worker {self.worker_id} on {self.slot.label} failed to start:\n{tail}"
            )
        self.info = msg
        log.info("worker %d ready on %s (pid %s)", self.worker_id, self.slot.label, msg.get("pid"))

    def kill(self) -> None:
        if self.proc is None:
            return
        sandbox.kill_tree(self.proc.pid)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log.error("worker %d (pid %d) did not exit after SIGKILL", self.worker_id, self.proc.pid)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        self.proc = None

    def restart(self) -> None:
        self.kill()
        self.restarts += 1
        self.start()

    def shutdown(self) -> None:
        if self.proc is not None and self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write(b'{"shutdown": true}\n')
                self.proc.stdin.flush()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # -------------------------------------------------------------- protocol
    def _read_message(self, deadline: float) -> dict[str, Any] | None:
        """Next JSON line from the worker, or None on EOF / deadline."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], min(remaining, 1.0))
            if not ready:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return None
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return json.loads(line)

    def evaluate(self, request: EvalRequest, timeout_s: float) -> EvalResult:
        """Send one request; always returns a result, replacing the worker if it misbehaves."""
        if not self.alive:
            self.restart()
        assert self.proc is not None and self.proc.stdin is not None
        self.evaluations += 1
        msg: dict[str, Any] | None
        try:
            self.proc.stdin.write(
                json.dumps({"request": request.to_json(), "timeout_s": timeout_s}).encode() + b"\n"
            )
            self.proc.stdin.flush()
            msg = self._read_message(time.monotonic() + timeout_s + self.config.outer_grace_s)
        except (OSError, ValueError) as exc:
            log.warning("worker %d protocol error: %s", self.worker_id, exc)
            msg = None
        if msg is not None and "result" in msg:
            self.spare_pid = msg.get("spare_pid")
            return EvalResult.from_json(msg["result"])
        detail = msg.get("error") if msg else None
        log.error("worker %d lost during evaluation (%s); replacing it", self.worker_id, detail or "no reply")
        self.restart()
        return failure_result(
            request,
            STATUS_SERVER_ERROR if detail else STATUS_CRASHED,
            f"The evaluation worker failed ({detail or 'it died or stopped answering'}) and was replaced.",
            device=self.slot.label,
        )


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


class WorkerPool:
    """N workers, at most N evaluations at once, at most `max_queue` more waiting (else QueueFullError)."""

    def __init__(self, config: PoolConfig) -> None:
        self.config = config
        config.workdir.mkdir(parents=True, exist_ok=True)
        self.workers = [WorkerHandle(i, slot, config) for i, slot in enumerate(config.slots)]
        self._idle: list[WorkerHandle] = []
        self._cond = threading.Condition()
        self._waiting = 0
        self._in_flight = 0
        self._ready = 0
        self._start_errors: list[str] = []
        self.stats = PoolStats()
        self._closed = False

    # -------------------------------------------------------------- lifecycle
    def start(self, block: bool = False) -> None:
        """Start every worker in parallel; each joins the idle set as soon as it is ready."""
        threads = [threading.Thread(target=self._start_one, args=(w,), daemon=True) for w in self.workers]
        for t in threads:
            t.start()
        if block:
            for t in threads:
                t.join()

    def _start_one(self, worker: WorkerHandle) -> None:
        try:
            worker.start()
        except Exception as exc:  # noqa: BLE001 - reported through /health
            log.error("%s", exc)
            with self._cond:
                self._start_errors.append(str(exc))
            return
        with self._cond:
            self._ready += 1
            self._idle.append(worker)
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for w in self.workers:
            w.shutdown()

    # -------------------------------------------------------------- evaluation
    def clamp_timeout(self, requested: float | None) -> float:
        if requested is None:
            return self.config.default_timeout_s
        return min(requested, self.config.max_timeout_s)

    def evaluate(self, request: EvalRequest) -> EvalResult:
        timeout_s = self.clamp_timeout(request.options.timeout_s)
        arrived = time.perf_counter()
        with self._cond:
            if self._closed:
                raise WorkerUnavailableError("the pool is shutting down")
            if not self._idle and self._waiting >= self.config.max_queue:
                self.stats.rejected_queue_full += 1
                raise QueueFullError(
                    f"all {len(self.workers)} workers are busy and {self._waiting} requests are queued"
                )
            self._waiting += 1
            try:
                while not self._idle:
                    if self._closed:
                        raise WorkerUnavailableError("the pool is shutting down")
                    if (
                        self._start_errors
                        and self._ready == 0
                        and len(self._start_errors) == len(self.workers)
                    ):
                        raise WorkerUnavailableError(
                            "no worker could be started: " + self._start_errors[-1][-500:]
                        )
                    self._cond.wait(timeout=1.0)
                worker = self._idle.pop()
            finally:
                self._waiting -= 1
            self._in_flight += 1
        t0 = time.perf_counter()
        restarts_before = worker.restarts
        try:
            result = worker.evaluate(request, timeout_s)
            result.worker = worker.worker_id
            result.phases["queue_wait"] = round(t0 - arrived, 6)  # waiting for an idle worker
        finally:
            with self._cond:
                self._in_flight -= 1
                self._idle.append(worker)
                self._cond.notify()
        self._record(result, time.perf_counter() - t0, worker.restarts - restarts_before)
        return result

    def _record(self, result: EvalResult, latency: float, restarts: int) -> None:
        with self._cond:
            s = self.stats
            s.evaluations += 1
            s.by_status[result.status] += 1
            for c in result.checks:
                s.by_check[c.id] += 1
            s.worker_restarts += restarts
            s.latency_sum_s += latency
            s.latencies.append(latency)
            if len(s.latencies) > 2048:
                del s.latencies[: len(s.latencies) - 2048]

    # -------------------------------------------------------------- introspection
    def snapshot(self) -> dict[str, Any]:
        with self._cond:
            lat = sorted(self.stats.latencies)
            return {
                "workers": len(self.workers),
                "workers_ready": self._ready,
                "worker_start_errors": list(self._start_errors),
                "in_flight": self._in_flight,
                "queued": self._waiting,
                "max_queue": self.config.max_queue,
                "evaluations": self.stats.evaluations,
                "by_status": dict(self.stats.by_status),
                "by_check": dict(self.stats.by_check),
                "worker_restarts": self.stats.worker_restarts,
                "rejected_queue_full": self.stats.rejected_queue_full,
                "latency_s": {
                    "mean": self.stats.latency_sum_s / self.stats.evaluations
                    if self.stats.evaluations
                    else None,
                    "p50": percentile(lat, 0.5),
                    "p95": percentile(lat, 0.95),
                },
                "per_worker": [
                    {
                        "id": w.worker_id,
                        "device": w.slot.label,
                        "alive": w.alive,
                        "pid": w.proc.pid if w.proc else None,
                        "spare_pid": w.spare_pid,  # its child prepared for the next evaluation
                        "evaluations": w.evaluations,
                        "restarts": w.restarts,
                        "versions": w.info.get("versions", {}),
                    }
                    for w in self.workers
                ],
                "uptime_s": round(time.time() - self.stats.started_at, 3),
            }
