"""The warm worker: one long-lived process per device slot that forks one child per evaluation.

The worker imports torch, triton and the evaluator once (seconds) but never initialises CUDA;
each evaluation runs in a freshly forked child (sub-second start), so whatever a candidate does
to its process (patched functions, globals, allocator contents, a poisoned CUDA context, a
segfault) dies with that child and never reaches the next evaluation. The worker enforces the
hard wall-clock timeout and the memory cap on the child's whole process tree.

The child is forked one evaluation ahead (the *spare*): while an evaluation runs, the next
child starts its CUDA context (~0.25 s), launches a trivial Triton kernel (the first launch in a
process costs ~0.45 s, a candidate's first launch after it ~2 ms; triton_warmup.py) and starts
the CUDA activity profiler once and loads the output comparison's kernel (a few small kernels
of GPU work, without the GPU lock), then waits for its request. It has run only evaluator code
when the request arrives, and it serves exactly one evaluation, so isolation is unchanged.

Protocol with the server (pool.py): JSON lines on stdin (requests) and on the original stdout
(replies); fd 1 is pointed at stderr after start-up so stray prints cannot corrupt the protocol.
  -> {"ready": true, "pid": ..., "device": ..., "versions": {...}}        once, after warm-up
  <- {"request": <EvalRequest json>, "timeout_s": 60.0}
  -> {"result": <EvalResult json>, "spare_pid": <pid of the child prepared for the next one>}
  <- {"shutdown": true}
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import select
import shutil
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval_server.feedback import build_feedback, failure_result
from eval_server.isolation import audit, gpu_lock, sandbox
from eval_server.isolation.hardening import Hardening
from eval_server.judge.known import Handoff, KnownReference, KnownStore
from eval_server.schema import (
    STATUS_CRASHED,
    STATUS_REFERENCE_ERROR,
    STATUS_REJECTED,
    STATUS_RUNTIME_ERROR,
    STATUS_SERVER_ERROR,
    STATUS_TIMEOUT,
    Check,
    EvalRequest,
    EvalResult,
    parse_request,
    problem_hash,
)

_POLL_S = 0.02
# the part of an evaluation's limit its runner's reported waits for the GPU lock may add: an
# honest runner waits only behind another evaluation's timing (seconds); a claimed wait is free
_RUNNER_WAIT_CAP = 0.25
_EXIT_POLL_S = 0.001  # after the child closed its result pipe: it is exiting, poll its exit closely
_REAP_GRACE_S = 10.0  # at most this long for a killed evaluation's processes to finish dying (a GPU context can take seconds)
_STDOUT_TAIL_CHARS = 2000
# the tail of a failed judge's traceback kept in its server_error result (where the evaluator failed)
JUDGE_TRACEBACK_CHARS = 4000
_ALONE_REMEMBERED = 256  # problems whose judge ran out of its share: their evaluations run alone


@dataclass
class _Spare:
    """A forked child waiting for its request (see the module docstring)."""

    pid: int
    request_fd: int  # the worker writes the request here, then closes it
    result_fd: int  # the child writes its result here
    evaldir: Path
    # where the judge and the runner report their waits for the GPU lock (gpu_lock.WaitLedger)
    wait_fds: tuple[int, int]


def _read_all(fd: int) -> bytes:
    chunks = []
    while data := os.read(fd, 1 << 20):
        chunks.append(data)
    os.close(fd)
    return b"".join(chunks)


def _signal_name(signum: int) -> str:
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    return {
        "SIGSEGV": "SIGSEGV (segmentation fault)",
        "SIGABRT": "SIGABRT (abort)",
        "SIGBUS": "SIGBUS (bus error)",
        "SIGKILL": "SIGKILL",
        "SIGFPE": "SIGFPE (arithmetic error)",
    }.get(name, name)


_ERROR_LINE = re.compile(r"error|what\(\)|assert|illegal|exception|fault|abort", re.IGNORECASE)


def crash_summary(output: str, max_lines: int = 12) -> str:
    """The informative lines of a dying process's output: error lines first, then the last lines,
    without C++ stack frame dumps ("frame #12: ...")."""
    lines = [ln for ln in output.strip().splitlines() if ln.strip() and not ln.lstrip().startswith("frame #")]
    errors = [ln for ln in lines if _ERROR_LINE.search(ln)][:6]
    tail = [ln for ln in lines[-(max_lines - len(errors)) :] if ln not in errors]
    return "\n".join(ln[:300] for ln in errors + tail)


def request_header(sent_at: float, alone: bool = False, known: list[Any] | None = None) -> bytes:
    """The first line the worker writes to a child before the request: the CLOCK_MONOTONIC send
    time, whether the evaluation runs alone on its GPU (see MemoryShare), and the reference
    timings the worker knows for the problem (judge/known.py)."""
    return json.dumps({"sent_at": sent_at, "alone": alone, "known": known or []}).encode() + b"\n"


def parse_request_header(line: bytes) -> tuple[float, bool, list[Any]]:
    """(sent_at, alone, known) from request_header's line, without its newline."""
    header = json.loads(line)
    known = header.get("known")
    return float(header["sent_at"]), header.get("alone") is True, known if isinstance(known, list) else []


def result_payload(result: EvalResult, learned: KnownReference | None = None) -> bytes:
    """What a judge writes to its worker: the result, and the reference timing it measured."""
    return json.dumps({"result": result.to_json(), "known": learned.to_json() if learned else None}).encode()


def _ended_from_outside(status: int | None) -> bool:
    """The child's exit was not its own clean `os._exit(0)` (None: not observed, e.g. reaped by
    an earlier evaluation's clean-up; then what it wrote is judged on its content alone)."""
    if status is None:
        return False
    return not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0)


def _exit_words(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"was killed by {_signal_name(os.WTERMSIG(status))}"
    return f"exited with code {os.WEXITSTATUS(status)}"


# statuses a process out of its memory share ends with: the judge's own (its reference or the
# evaluator failing) and the candidate's process's (its forward, or the evaluator's code running
# in it, e.g. the float64 reference of its first layer: `crashed`)
_JUDGE_OUT_OF_SHARE = (STATUS_SERVER_ERROR, STATUS_REFERENCE_ERROR)
_RUNNER_OUT_OF_SHARE = (STATUS_RUNTIME_ERROR, STATUS_CRASHED)


def out_of_memory(result: EvalResult) -> bool:
    """The evaluation ended because a process ran out of its share of the GPU's memory: the judge
    (`server_error`, `reference_error`) or the candidate's process (`runtime_error`, `crashed`,
    which a candidate can also fake: it buys one retry, never a verdict)."""
    if result.status not in _JUDGE_OUT_OF_SHARE + _RUNNER_OUT_OF_SHARE:
        return False
    error = result.error or {}
    text = f"{error.get('type', '')} {error.get('message', '')} {result.feedback}"
    return "OutOfMemoryError" in text or "CUDA out of memory" in text


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.worker_id: int = args.worker_id
        self.device_kind: str = args.device  # "cpu" or "cuda"
        self.device_label: str = args.device_label
        self.workdir = Path(args.workdir)
        self.mem_cap_bytes = int(args.mem_cap_mb) * 1024 * 1024 if args.mem_cap_mb else 0
        self.threads: int = args.threads
        self.ref_cache_path: str | None = args.ref_cache or None
        self.gpu_lock_path: str | None = args.gpu_lock or None
        self.hardening = Hardening(**json.loads(args.hardening))
        self.versions: dict[str, Any] = {}
        self.evals = 0
        self._spare: _Spare | None = None
        self.shares_gpu = (
            self.device_kind == "cuda"
            and bool(self.gpu_lock_path)
            and self.hardening.gpu_memory_fraction < 1.0
        )
        self._alone: dict[str, None] = {}  # problem hashes, oldest first
        # what the candidate's process may write under runner_read_only (runner_writable): set at
        # warm-up, where the worker proves the confinement works, and inherited by every runner
        self._writable: list[str] = []
        self.known = KnownStore()  # reference timings its judges measured (judge/known.py)

    # ------------------------------------------------------------------ warm-up (parent)
    def warm_up(self) -> dict[str, Any]:
        import torch
        import triton

        from eval_server.checks import compare
        from eval_server.pipeline import evaluate as _evaluate  # noqa: F401  (imports compare, timing, checks)
        from eval_server.pipeline.context import LAUNCHES, THREADS

        # every evaluation process forked from here (judge and runner) compares with torch ops: the
        # fused kernel's binary would come from the Triton cache this worker's candidates can write
        compare.disable_fused()
        LAUNCHES.install()
        THREADS.install()
        torch.set_num_threads(max(1, self.threads))
        if self.device_kind != "cuda":  # the interpreter's lazy imports, once before any fork
            from eval_server.workers import triton_warmup

            try:
                triton_warmup.warm_up(torch.device("cpu"))
            except Exception as exc:  # noqa: BLE001 - best effort: each evaluation then imports them
                print(f"worker: Triton warm-up failed ({type(exc).__name__}: {exc})", file=sys.stderr)
        if self.hardening.runner_read_only:
            self._writable = self.runner_writable()
            refused = sandbox.confinement_refused(self._writable)
            if refused:  # stop here, saying why, rather than fail (or run unconfined) every evaluation
                raise RuntimeError(
                    f"--runner-read-only: the candidate's process cannot be confined here ({refused})"
                )
        self.versions = {
            "torch": torch.__version__,
            "triton": triton.__version__,
            "python": sys.version.split()[0],
            "triton_interpret": os.environ.get("TRITON_INTERPRET", "0") == "1",
        }
        return self.versions

    # ------------------------------------------------------------------ one evaluation
    def run_one(self, request_json: dict[str, Any], timeout_s: float) -> EvalResult:
        """One evaluation; on a GPU shared with other workers, one that ran out of its memory
        share is run again alone (the GPU's memory as with one worker per GPU) in the time left, and a
        problem whose judge ran out runs alone from then on."""
        request = parse_request(request_json)
        self.evals += 1
        t0 = time.perf_counter()
        key = problem_hash(request.reference)
        alone = key in self._alone
        result = self._attempt(request, timeout_s, alone)
        if self.shares_gpu and not alone and out_of_memory(result):
            if result.status in _JUDGE_OUT_OF_SHARE:  # the judge's need: every evaluation's
                self._alone[key] = None
                while len(self._alone) > _ALONE_REMEMBERED:
                    del self._alone[next(iter(self._alone))]
            spent = time.perf_counter() - t0
            result = self._attempt(request, max(timeout_s - spent, 1.0), alone=True)
            result.phases["out_of_share_attempt"] = round(spent, 6)
        result.elapsed_s = round(time.perf_counter() - t0, 6)
        return result

    def _attempt(self, request: EvalRequest, timeout_s: float, alone: bool) -> EvalResult:
        spare = self._take_spare()
        t0 = time.perf_counter()
        try:
            self._send_request(spare, request, alone)
            self._spare = self._start_spare()  # the next one gets ready while this one runs
            result = self._wait(spare, request, timeout_s)
        finally:
            log = spare.evaldir / "output.log"
            output = ""
            if log.exists():
                with open(log, "rb") as fh:
                    fh.seek(max(0, log.stat().st_size - (64 << 10)))
                    output = fh.read().decode(errors="replace")
            shutil.rmtree(spare.evaldir, ignore_errors=True)
        result.stdout_tail = output[-_STDOUT_TAIL_CHARS:]
        if result.status == STATUS_CRASHED and output.strip() and result.error is not None:
            # What the dying process printed (e.g. "CUDA error: an illegal memory access was
            # encountered" before an abort) is the most useful evidence the model can get.
            result.error["message"] += f"\nWhat the process printed:\n{crash_summary(output)}"
            result.feedback = build_feedback(result)
        result.worker = self.worker_id
        result.elapsed_s = round(time.perf_counter() - t0, 6)
        return result

    # ------------------------------------------------------------------ the spare child
    def _start_spare(self) -> _Spare:
        evaldir = Path(tempfile.mkdtemp(prefix=f"eval-{self.evals + 1}-", dir=self.workdir / "evals"))
        request_r, request_w = os.pipe()
        result_r, result_w = os.pipe()
        # one pipe per process: the runner's own, so nothing it does to its pipe stops the judge's
        waits = [os.pipe2(os.O_NONBLOCK) for _ in range(2)]
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # child: never returns
            os.close(request_w)
            os.close(result_r)
            for r, _ in waits:
                os.close(r)
            self._child_main(evaldir, request_r, result_w, (waits[0][1], waits[1][1]))
        os.close(request_r)
        os.close(result_w)
        for _, w in waits:
            os.close(w)
        try:
            os.setpgid(pid, pid)  # also done by the child; whichever runs first wins
        except (PermissionError, ProcessLookupError):
            pass
        return _Spare(pid, request_w, result_r, evaldir, (waits[0][0], waits[1][0]))

    def _take_spare(self) -> _Spare:
        """The prepared child, or a new one if there is none or it died meanwhile."""
        spare, self._spare = self._spare, None
        if spare is not None:
            try:
                alive = os.waitid(os.P_PID, spare.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
            except ChildProcessError:  # already reaped
                alive = False
            if alive:
                return spare
            self._discard(spare)
        return self._start_spare()

    def _discard(self, spare: _Spare) -> None:
        sandbox.kill_tree(spare.pid)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(spare.pid, 0)
        for fd in (spare.request_fd, spare.result_fd, *spare.wait_fds):
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(spare.evaldir, ignore_errors=True)

    @property
    def spare_pid(self) -> int | None:
        """The child prepared for the next evaluation (the worker's only child between them)."""
        return self._spare.pid if self._spare is not None else None

    def close(self) -> None:
        if self._spare is not None:
            self._discard(self._spare)
            self._spare = None

    def _send_request(self, spare: _Spare, request: EvalRequest, alone: bool) -> None:
        """A first line with the send time (CLOCK_MONOTONIC, system-wide), `alone` and the known
        reference timings, then the request: the child reports how long the request waited for its
        preparation (spare_wait)."""
        known = self.known.entries(problem_hash(request.reference))
        header = request_header(time.monotonic(), alone, known)
        payload = memoryview(header + json.dumps(request.to_json()).encode())
        try:
            while payload:
                payload = payload[os.write(spare.request_fd, payload) :]
        except BrokenPipeError:  # the child died just now: _wait reports how it ended
            pass
        finally:
            os.close(spare.request_fd)

    def _wait(self, spare: _Spare, request: EvalRequest, timeout_s: float) -> EvalResult:
        """The child's result, or its end: `timeout_s` counts the time the evaluation did not
        spend waiting for the GPU lock (another evaluation's hold): the judge's waits up to
        `timeout_s` more, the runner's (which it could claim without waiting) up to a quarter."""
        pid, read_fd = spare.pid, spare.result_fd
        chunks: list[bytes] = []
        deadline = time.monotonic() + timeout_s
        judge_fd, runner_fd = spare.wait_fds
        waits = gpu_lock.WaitLedger({judge_fd: timeout_s, runner_fd: timeout_s * _RUNNER_WAIT_CAP})
        wait_fds = set(spare.wait_fds)
        verdict: tuple[str, str] | None = None
        exit_status: int | None = None
        next_mem_check = 0.0
        eof_at: float | None = None  # the child closed its result pipe (result complete, or dying)
        child_exit_s: float | None = None  # that EOF -> the child reaped
        try:
            while True:
                watched = ([read_fd] if eof_at is None else []) + sorted(wait_fds)
                ready, _, _ = select.select(watched, [], [], _POLL_S if eof_at is None else _EXIT_POLL_S)
                for fd in ready:
                    data = os.read(fd, 1 << 20)
                    if fd == read_fd:
                        if data:
                            chunks.append(data)
                        else:
                            eof_at = time.perf_counter()
                    elif data:
                        waits.feed(fd, data, time.monotonic())
                    else:  # that process is gone (or closed it): it waits no more
                        waits.feed(fd, gpu_lock.GOT, time.monotonic())
                        wait_fds.discard(fd)
                try:
                    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                except ChildProcessError:  # reaped already (reap_all after an earlier evaluation)
                    break
                if info is not None:
                    break
                now = time.monotonic()
                if now > deadline + waits.credit(now):
                    waited = waits.credit(now)
                    verdict = (
                        STATUS_TIMEOUT,
                        f"The evaluation exceeded the time limit of {timeout_s:g} s and was killed"
                        + (f" (not counting {waited:.1f} s it waited for the GPU)." if waited >= 0.05 else "."),
                    )
                    break
                if self.mem_cap_bytes and now >= next_mem_check:
                    next_mem_check = now + 0.1
                    rss = sandbox.tree_rss_bytes(pid)
                    if rss > self.mem_cap_bytes:
                        verdict = (
                            STATUS_CRASHED,
                            f"The evaluation used {rss / 2**30:.1f} GiB of host memory, over the cap of "
                            f"{self.mem_cap_bytes / 2**30:.1f} GiB, and was killed.",
                        )
                        break
        finally:
            sandbox.kill_tree(pid)
            try:
                _, status = os.waitpid(pid, 0)
                exit_status = status
            except ChildProcessError:
                pass
            sandbox.reap_group(pid, _REAP_GRACE_S)  # its runner and their children, killed above
            if eof_at is not None:
                child_exit_s = time.perf_counter() - eof_at
            # not the spare: its exit status is read when it is taken
            keep = self._spare.pid if self._spare is not None else None
            sandbox.kill_strays(keep=keep)  # a candidate's process that escaped its group
            sandbox.reap_all(keep=keep)
            # Drain what the child wrote before it exited.
            while eof_at is None:
                ready, _, _ = select.select([read_fd], [], [], 0)
                if not ready:
                    break
                data = os.read(read_fd, 1 << 20)
                if not data:
                    break
                chunks.append(data)
            for fd in (read_fd, *spare.wait_fds):
                os.close(fd)

        result: EvalResult | None = None
        refused = self._audit_refusal(exit_status, spare.evaldir)
        if refused is not None:  # whatever the process wrote before: its exit decides
            result = failure_result(request, STATUS_REJECTED, refused, device=self.device_label)
            result.checks.append(Check(audit.CHECK_ID, refused))
            result.feedback = build_feedback(result)
        elif verdict is None:
            payload = b"".join(chunks)
            if payload and _ended_from_outside(exit_status):
                # A judge writes its result, then exits 0 (_child_main). What reached the pipe of
                # a judge that died of a signal, or exited otherwise, is not known to be its own:
                # a candidate's native code that kills its judge and writes a result into the
                # judge's pipe (through /proc, as the same user) gets no verdict from it.
                assert exit_status is not None
                verdict = (
                    STATUS_CRASHED,
                    f"The evaluation's judge process {_exit_words(exit_status)} instead of ending its "
                    "evaluation; what reached its result pipe is not taken as a result.",
                )
            elif payload:
                learned = None
                try:
                    envelope = json.loads(payload)
                    result = EvalResult.from_json(envelope["result"])
                    learned = envelope.get("known")
                except (ValueError, TypeError, KeyError, AttributeError) as exc:
                    verdict = (
                        STATUS_CRASHED,
                        f"The evaluation process reported an unreadable result ({exc}).",
                    )
                # Defence in depth behind static.file_access: a result the evaluator wrote names
                # the problem it evaluated, which candidate code cannot read.
                if result is not None and result.problem_hash != problem_hash(request.reference):
                    result = None
                    verdict = (
                        STATUS_CRASHED,
                        "The evaluation process reported a result for another problem (not written by "
                        "the evaluator).",
                    )
                elif result is not None and learned is not None:
                    self.known.learn(result.problem_hash, learned)
            else:
                verdict = (STATUS_CRASHED, self._describe_exit(exit_status))
        if result is None:
            assert verdict is not None
            result = failure_result(request, *verdict, device=self.device_label)
        if child_exit_s is not None:
            result.phases["child_exit"] = round(child_exit_s, 6)
        waited = waits.credit(time.monotonic())
        if waited > 0:  # not counted against the limit: another evaluation held the GPU
            result.phases["gpu_wait_credit"] = round(waited, 6)
        return result

    @staticmethod
    def _audit_refusal(status: int | None, evaldir: Path) -> str | None:
        """The message of an evaluation ended by the audit hook (exit status AUDIT_EXIT), else None."""
        if status is None or not os.WIFEXITED(status) or os.WEXITSTATUS(status) != audit.AUDIT_EXIT:
            return None
        output = ""
        log = evaldir / "output.log"
        with contextlib.suppress(OSError):
            output = log.read_bytes()[-(64 << 10) :].decode(errors="replace")
        what = audit.refusal_reason(output) or "an operation the evaluator refuses"
        return (
            f"The candidate's code was stopped by the evaluator: {what}. Tracing, profiling or "
            "inspecting the interpreter, reaching the garbage collector, native memory (ctypes), "
            "processes, signals, code objects or files outside the evaluation directory is not "
            "allowed; write the kernel and call it."
        )

    @staticmethod
    def _describe_exit(status: int | None) -> str:
        if status is None:
            return "The evaluation process disappeared without a result."
        why = "" if os.WIFSIGNALED(status) else " (os._exit, sys.exit or a fatal error in the candidate)"
        return f"The evaluation process {_exit_words(status)} before reporting a result{why}."

    def _child_main(self, evaldir: Path, request_fd: int, write_fd: int, wait_fds: tuple[int, int]) -> None:
        """The judge: runs in the forked child; always ends with os._exit so no parent state is
        unwound. It forks the candidate's runner first (neither has touched CUDA yet).
        `wait_fds`: where the judge and the runner report their waits for the GPU lock."""
        try:
            os.setpgid(0, 0)
        except OSError:
            pass
        from eval_server.isolation import gpu_lock
        from eval_server.judge.pair import fork_runner

        judge_waits, runner_waits = wait_fds
        runner_pid, sock = fork_runner(
            lambda s: self._runner_main(s, evaldir, request_fd, write_fd, wait_fds)
        )
        os.close(runner_waits)
        gpu_lock.report_waits_to(judge_waits)
        if self.hardening.ptrace_guard:
            sandbox.become_undumpable()  # before any request: the runner imports no candidate yet
        request: EvalRequest | None = None
        payload = b""
        try:
            os.close(_PROTO_FD)
            _quiet(evaldir)
            started_at = time.monotonic()
            self._child_prepare(judge=True)
            prepared_at = time.monotonic()
            raw = _read_all(request_fd)
            if not raw:  # the worker went away without a request
                os._exit(0)
            header, _, raw = raw.partition(b"\n")
            sent_at, alone, known = parse_request_header(header)
            spare_wait = max(0.0, prepared_at - sent_at)
            request = parse_request(json.loads(raw))
            handoff = Handoff(given=known)
            result = self._judge(request, evaldir, sock, runner_pid, alone, handoff)
            result.phases["spare_wait"] = round(spare_wait, 6)
            result.phases["spare_prepare"] = round(prepared_at - started_at, 6)
            payload = result_payload(result, handoff.learned)
        except BaseException as exc:  # noqa: BLE001 - must report whatever happened
            if request is not None:
                res = failure_result(
                    request,
                    STATUS_SERVER_ERROR,
                    f"Evaluator failure: {type(exc).__name__}: {exc}",
                    device=self.device_label,
                    traceback=traceback.format_exc()[-JUDGE_TRACEBACK_CHARS:],
                )
                payload = result_payload(res)
        try:
            view = memoryview(payload)
            while view:
                n = os.write(write_fd, view)
                view = view[n:]
            os.close(write_fd)  # EOF now: the worker sees the result complete while this process exits
            with contextlib.suppress(ProcessLookupError):
                os.kill(runner_pid, signal.SIGKILL)  # the worker reaps it (same group, subreaper)
        finally:
            os._exit(0)

    def _runner_main(
        self, sock: Any, evaldir: Path, request_fd: int, write_fd: int, wait_fds: tuple[int, int]
    ) -> None:
        """The candidate's process (eval_server/runner): prepared like the judge, then serves it."""
        import torch

        from eval_server.isolation import gpu_lock
        from eval_server.runner.serve import serve

        judge_waits, runner_waits = wait_fds
        # the worker's pipes are the judge's alone
        for fd in (_PROTO_FD, request_fd, write_fd, judge_waits):
            with contextlib.suppress(OSError):
                os.close(fd)
        gpu_lock.report_waits_to(runner_waits)
        _quiet(evaldir)
        if self.hardening.runner_read_only:  # before CUDA, threads and capabilities (warm_up proved it)
            left = sandbox.confine_writes(self._writable)
            if left:
                print(f"runner: mounts left writable: {left}", file=sys.stderr)
        if self.hardening.ptrace_guard and not sandbox.drop_privileges():
            print(f"runner: capabilities not dropped: {sandbox.privileges()}", file=sys.stderr)
        self._child_prepare()
        device = torch.device("cuda", 0) if self.device_kind == "cuda" else torch.device("cpu")
        serve(
            sock,
            device,
            str(evaldir),
            lambda req, share, facts: self._first_layer(req, share, evaldir, facts),
        )

    def runner_writable(self) -> list[str]:
        """What the candidate's process may write under `runner_read_only`: its worker's directory
        (its evaluation's, the Triton and CUDA build caches, HOME, TMPDIR), the GPU lock files
        (each created here first: only what exists is bound) and the MPS pipes. Not the reference
        cache: the judge alone reads and writes it."""
        paths = [str(self.workdir)]
        if self.gpu_lock_path:
            for lock in (
                self.gpu_lock_path,
                f"{self.gpu_lock_path}.turnstile",
                f"{self.gpu_lock_path}.memory",
            ):
                os.close(os.open(lock, os.O_RDWR | os.O_CREAT, 0o600))
                paths.append(lock)
        pipes = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
        if pipes:
            paths.append(pipes)
        return paths

    def _first_layer(
        self, request_json: dict[str, Any], share: float | None, evaldir: Path, facts: dict[str, Any] | None
    ) -> tuple[dict[str, Any], Any]:
        """In the runner: the pipeline's checks on the candidate, with its prints in the log, in
        the memory share the judge named (larger than the worker's only when it runs alone), on
        the reference's facts the judge gave."""
        from eval_server.pipeline import compile_pause
        from eval_server.pipeline.evaluate import first_layer

        request = parse_request(request_json)
        log_fd = os.open(evaldir / "output.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        ctx = self._context(evaldir, timing=False, share=share, ref_cache=False)
        ctx.given_facts = facts
        if ctx.gpu_lock is not None and ctx.hardening.compile_unlocked:
            compile_pause.install(ctx.gpu_lock)  # other evaluations may time while this one compiles
        # Irreversible, and after every import of the evaluator's own: the candidate comes next.
        audit.install(evaldir)
        result, model = first_layer(request, ctx)
        return result.to_json(), model

    def _judge(
        self,
        request: EvalRequest,
        evaldir: Path,
        sock: Any,
        runner_pid: int,
        alone: bool = False,
        handoff: Handoff | None = None,
    ) -> EvalResult:
        from eval_server.isolation.gpu_lock import MemoryShare
        from eval_server.judge.channel import Channel, RunnerFailed
        from eval_server.judge.evaluate import evaluate, static_verdict

        ctx = self._context(evaldir, timing=True, share=1.0 if alone else None)
        early = static_verdict(request, ctx)  # before the memory share and the GPU lock
        if early is not None:
            return early
        channel = Channel(sock, deadline=float("inf"))
        share = MemoryShare(self.gpu_lock_path) if self.shares_gpu else None
        try:
            with share.hold(alone) if share is not None else contextlib.nullcontext():
                return evaluate(request, ctx, channel, handoff)
        except RunnerFailed as exc:
            status = _end_runner(runner_pid)
            if not channel.candidate_asked:  # no candidate code had run: not the candidate's doing
                raise RuntimeError(f"the runner failed before the candidate was loaded ({exc})") from None
            refused = self._audit_refusal(status, evaldir)
            if refused is not None:
                result = failure_result(request, STATUS_REJECTED, refused, device=self.device_label)
                result.checks.append(Check(audit.CHECK_ID, refused))
                result.feedback = build_feedback(result)
                return result
            if status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
                message = f"The candidate's process stopped answering the evaluator ({exc})."
            else:
                message = self._describe_exit(status)
            return failure_result(request, STATUS_CRASHED, message, device=self.device_label)

    def _child_prepare(self, judge: bool = False) -> None:
        """Trusted set-up before the request arrives: the CUDA context and, in the runner,
        Triton's first launch, the profiler's first start and the output comparison's kernels.
        The judge takes the context alone: it launches no Triton kernel, so it loads nothing from
        the Triton cache that this worker's candidates can write. Without the GPU lock: its GPU
        work is a few kernels on 16-4096 elements, and waiting for the lock's shared mode made the
        running evaluation's timing wait ~0.4 s for it (measured). Best effort: whatever fails
        here is done (and reported) by the evaluation itself."""
        if self.device_kind != "cuda":
            return
        try:
            import torch

            from eval_server.workers import child_prep

            device = torch.device("cuda", 0)
            if judge:
                child_prep.create_context(device)
            else:
                child_prep.prepare(device)
        except Exception:  # noqa: BLE001, S110 - see the docstring
            pass

    def _context(
        self, evaldir: Path, timing: bool, share: float | None = None, ref_cache: bool = True
    ) -> Any:
        """The evaluation's context in this process (judge: timing; runner: none); `share`: the
        evaluation's share of the GPU's memory when not the worker's (half of it per process);
        `ref_cache`: whether it opens the reference cache (never the candidate's process)."""
        import torch

        from eval_server.isolation.gpu_lock import GpuLock
        from eval_server.pipeline.context import EvalContext
        from eval_server.pipeline.ref_cache import RefTimingCache

        hardening = self.hardening
        if share is not None and 0 < share <= 1:
            hardening = dataclasses.replace(hardening, gpu_memory_fraction=share)
        if self.device_kind == "cuda":
            # CUDA_VISIBLE_DEVICES pins the physical GPU. CUDA initialises lazily on first use,
            # so statically rejected candidates never pay for a context.
            device = torch.device("cuda", 0)
            if hardening.gpu_memory_fraction < 1.0:  # a GPU shared with other workers
                torch.cuda.set_per_process_memory_fraction(hardening.gpu_memory_fraction / 2, device)
        else:
            device = torch.device("cpu")
            timing = False
        # reference timings (GPU) and the reference's facts (any device: reference._Facts)
        cache = RefTimingCache(self.ref_cache_path) if self.ref_cache_path and ref_cache else None
        return EvalContext(
            device=device,
            device_label=self.device_label,
            workdir=evaldir,
            timing_enabled=timing,
            ref_cache=cache,
            hardening=hardening,
            versions={k: str(v) for k, v in self.versions.items()},
            gpu_lock=GpuLock(self.gpu_lock_path)
            if (self.device_kind == "cuda" and self.gpu_lock_path)
            else None,
            build_cache=self.workdir / "cuda-ext",  # outlives evaluations; removed with the worker dir
        )


def _quiet(evaldir: Path) -> None:
    """Preparation prints to /dev/null; the evaluation's own directory and temp dir."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # nothing of the preparation reaches the candidate's output log
        os.dup2(devnull, fd)
    os.chdir(evaldir)
    os.environ["TMPDIR"] = str(evaldir)
    tempfile.tempdir = str(evaldir)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _end_runner(pid: int, grace_s: float = 2.0) -> int | None:
    """The runner's exit status: waited for up to `grace_s` (it may be exiting on its own), then
    killed. None if it was reaped already."""
    deadline = time.monotonic() + grace_s
    try:
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status
            time.sleep(0.005)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:
        return None


_PROTO_FD = -1


def main(argv: list[str] | None = None) -> None:
    global _PROTO_FD
    parser = argparse.ArgumentParser(description="eval_server worker (started by the server, not by hand)")
    parser.add_argument("--worker-id", type=int, required=True)
    parser.add_argument("--device", choices=["cpu", "cuda"], required=True)
    parser.add_argument("--device-label", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--mem-cap-mb", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--ref-cache", default="", help="SQLite file of cached reference timings ('' = none)")
    parser.add_argument("--gpu-lock", default="", help="lock file shared by the evaluations of this GPU")
    parser.add_argument(
        "--hardening", default="{}", help="JSON object of hardening.Hardening field overrides"
    )
    args = parser.parse_args(argv)

    # Keep the protocol channel private; anything printed later goes to the log (stderr).
    _PROTO_FD = os.dup(1)
    os.dup2(2, 1)
    proto = os.fdopen(_PROTO_FD, "w", buffering=1)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    (Path(args.workdir) / "evals").mkdir(parents=True, exist_ok=True)
    sandbox.become_subreaper()
    worker = Worker(args)
    versions = worker.warm_up()
    proto.write(
        json.dumps({"ready": True, "pid": os.getpid(), "device": args.device_label, "versions": versions})
        + "\n"
    )
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            msg = json.loads(line)
            if msg.get("shutdown"):
                break
            try:
                result = worker.run_one(msg["request"], float(msg["timeout_s"]))
                reply = {"result": result.to_json(), "spare_pid": worker.spare_pid}
            except Exception as exc:  # noqa: BLE001 - the worker must keep serving
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            proto.write(json.dumps(reply) + "\n")
    finally:
        worker.close()


if __name__ == "__main__":
    main()
