"""The real eval server as a subprocess on loopback, driven over real HTTP (CPU interpreter mode)."""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from eval_server import samples
from eval_server.isolation import sandbox
from tests.conftest import running_eval_server

pytestmark = pytest.mark.integration

# Hang/crash cases get a short limit so the suite stays fast.
_FAST_LIMIT = {"relu__infinite_loop": 4.0}


def _post(url: str, payload: dict, timeout: float = 120.0) -> httpx.Response:
    return httpx.post(f"{url}/eval", json=payload, timeout=timeout)


def _sample_payload(case: samples.SampleCase) -> dict:
    options = {"correctness_trials": 3}
    if case.candidate in _FAST_LIMIT:
        options["timeout_s"] = _FAST_LIMIT[case.candidate]
    return {
        "reference": samples.load_problem(case.problem),
        "candidate": samples.load_candidate(case.candidate),
        "options": options,
        "problem_id": case.problem,
        "request_id": case.candidate,
    }


def test_every_sample_case_gets_its_expected_status(cpu_server: str) -> None:
    with cf.ThreadPoolExecutor(max_workers=4) as ex:
        futures = {ex.submit(_post, cpu_server, _sample_payload(c)): c for c in samples.SAMPLE_CASES}
        results = {futures[f].candidate: (futures[f], f.result()) for f in cf.as_completed(futures)}
    wrong = []
    for name, (case, resp) in sorted(results.items()):
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["request_id"] == name
        assert body["device"].startswith("cpu")
        assert body["feedback"].startswith(f"Status: {body['status']}.")
        if body["status"] != case.expected_status:
            wrong.append(
                f"{name}: expected {case.expected_status}, got {body['status']}: {body['feedback'][:300]}"
            )
    assert not wrong, "\n".join(wrong)

    ok = results["relu__correct"][1].json()
    assert ok["correct"] and ok["compiled"] and ok["kernel_launches"] >= 1
    assert ok["reference_timing"] is None and ok["speedup"] is None  # no timing on CPU
    assert len(ok["trials"]) == 3 and ok["max_abs_diff"] == 0.0

    wrong_math = results["relu__wrong_math"][1].json()
    assert wrong_math["compiled"] and not wrong_math["correct"]
    assert wrong_math["max_abs_diff"] > 0.1
    assert "max abs diff" in wrong_math["feedback"]

    syntax = results["relu__syntax_error"][1].json()
    assert syntax["error"]["type"] == "SyntaxError"
    assert "candidate.py" in syntax["feedback"] and "line" in syntax["feedback"]

    runtime = results["relu__runtime_error"][1].json()
    assert "Traceback" in runtime["feedback"] and "candidate.py" in runtime["feedback"]
    assert "eval_server" not in runtime["error"]["traceback"]  # evaluator frames are trimmed

    timeout = results["relu__infinite_loop"][1].json()
    assert "time limit of 4 s" in timeout["feedback"]

    segv = results["relu__segfault"][1].json()
    assert "SIGSEGV" in segv["feedback"]
    exited = results["relu__os_exit"][1].json()
    assert "exited with code 3" in exited["feedback"]

    not_launched = results["relu__kernel_unused"][1].json()
    assert {c["id"] for c in not_launched["checks"]} >= {"runtime.no_kernel_launch"}

    static = results["matmul__torch_matmul"][1].json()
    assert {c["id"] for c in static["checks"]} == {"static.torch_compute"}
    for early in (static, syntax):  # the judge's static verdict: no reference, no runner's first layer
        assert "judge_static" in early["phases"], early["phases"]
        assert not {"judge_reference", "judge_first_layer", "static"} & set(early["phases"]), early["phases"]
    assert "judge_static" not in ok["phases"] and "static" in ok["phases"]  # accepted: the runner's own


def test_a_source_the_parser_cannot_take_is_the_candidates_failure(cpu_server: str) -> None:
    """Deep nesting: Python's parser raises RecursionError or MemoryError, not SyntaxError. The judge
    parses every candidate first (its static verdict): never an evaluator failure."""
    for source in ("a" + "+a" * 20_000, "-" * 20_000 + "a"):
        payload = {"reference": samples.load_problem("relu"), "candidate": source}
        body = _post(cpu_server, payload).json()
        assert body["status"] not in ("server_error", "ok"), body["feedback"][:300]


def test_malformed_requests_get_clear_4xx(cpu_server: str) -> None:
    good = {"reference": samples.load_problem("relu"), "candidate": samples.load_candidate("relu__correct")}
    cases = [
        (b"{not json", 400, "not valid JSON"),
        (b"", 400, "empty body"),
        (b"[1, 2]", 400, "body: expected dict"),
        (httpx.Request("POST", "/", json={**good, "extra": 1}).content, 400, "unknown field(s) ['extra']"),
        (
            httpx.Request("POST", "/", json={"candidate": "x"}).content,
            400,
            "missing required field 'reference'",
        ),
        (
            httpx.Request("POST", "/", json={**good, "reference": 3}).content,
            400,
            "reference: expected str, got int",
        ),
        (
            httpx.Request("POST", "/", json={**good, "options": {"correctness_trials": True}}).content,
            400,
            "options.correctness_trials: expected int, got bool",
        ),
        (
            httpx.Request("POST", "/", json={**good, "options": {"tolerance": "loose"}}).content,
            400,
            "options.tolerance: unknown profile 'loose'",
        ),
        (
            httpx.Request("POST", "/", json={**good, "options": {"speed": 1}}).content,
            400,
            "options: unknown field(s)",
        ),
        (b"x" * (2 << 20), 413, "request body too large"),
    ]
    before = httpx.get(f"{cpu_server}/stats", timeout=10).json()["rejected_requests"]
    for body, code, fragment in cases:
        resp = httpx.post(
            f"{cpu_server}/eval", content=body, headers={"content-type": "application/json"}, timeout=30
        )
        assert resp.status_code == code, (body[:60], resp.text)
        assert fragment in resp.json()["error"], (fragment, resp.json())
    after = httpx.get(f"{cpu_server}/stats", timeout=10).json()["rejected_requests"]
    assert after["400"] - before["400"] == len(cases) - 1 and after["413"] - before["413"] == 1
    assert httpx.get(f"{cpu_server}/eval", timeout=10).status_code == 405
    assert httpx.get(f"{cpu_server}/nope", timeout=10).json()["error"].startswith("Not Found")


def test_stats_and_metrics_reflect_traffic(cpu_server: str, tmp_path: Path) -> None:
    payload = _sample_payload(samples.SampleCase("relu", "relu__correct", "ok", ""))
    assert _post(cpu_server, payload).json()["status"] == "ok"
    stats = httpx.get(f"{cpu_server}/stats", timeout=10).json()
    assert stats["workers"] == 2 and stats["mode"] == "cpu-interpreter"
    # --runner-read-only auto: on wherever this machine's kernel grants the namespaces
    granted = not sandbox.confinement_refused([str(tmp_path)])
    assert stats["isolation"] == {"ptrace_guard": True, "runner_read_only": granted, "mps": False}
    assert stats["by_status"]["ok"] >= 1
    assert stats["latency_s"]["p50"] is not None
    assert all(w["versions"]["triton_interpret"] for w in stats["per_worker"])
    metrics = httpx.get(f"{cpu_server}/metrics", timeout=10).text
    assert 'kernel_eval_evaluations_total{status="ok"}' in metrics
    assert "kernel_eval_workers_ready 2" in metrics


def test_worker_environment_is_scrubbed_and_private(tmp_path) -> None:
    """A candidate that prints its environment sees no secrets and a private HOME/TMPDIR."""
    spy = samples.load_candidate("relu__correct").replace(
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n",
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
        "        import os\n"
        "        print('SPY', os.environ.get('MY_SERVICE_API_KEY'), os.environ.get('HF_TOKEN'),\n"
        "              os.environ.get('HOME'), os.environ.get('TMPDIR'), os.environ.get('TRITON_CACHE_DIR'))\n",
    )
    env = {"MY_SERVICE_API_KEY": "sk-leak", "HF_TOKEN": "hf-leak"}
    with running_eval_server(tmp_path, "--devices", "cpu", "--cpu-workers", "1", env=env) as url:
        body = _post(url, {"reference": samples.load_problem("relu"), "candidate": spy}).json()
    assert body["status"] == "ok", body["feedback"]
    line = next(ln for ln in body["stdout_tail"].splitlines() if ln.startswith("SPY"))
    assert "leak" not in line
    _, api_key, hf, home, tmp, cache = line.split()
    assert api_key == "None" and hf == "None"
    assert home.endswith("worker-0") and str(tmp_path) in home
    assert "/evals/eval-" in tmp  # per-evaluation private temp dir
    assert cache.startswith(home)


def test_worker_survives_hang_and_crash_and_leaves_no_zombies(tmp_path) -> None:
    """One worker: timeout, segfault and os._exit in a row, then a correct request is still served."""
    reference = samples.load_problem("relu")
    with running_eval_server(tmp_path, "--devices", "cpu", "--cpu-workers", "1") as url:
        pid_before = httpx.get(f"{url}/stats", timeout=10).json()["per_worker"][0]["pid"]
        for name, status in [
            ("relu__infinite_loop", "timeout"),
            ("relu__segfault", "crashed"),
            ("relu__os_exit", "crashed"),
        ]:
            body = _post(
                url,
                {
                    "reference": reference,
                    "candidate": samples.load_candidate(name),
                    "options": {"timeout_s": 3},
                },
            ).json()
            assert body["status"] == status, body["feedback"]
        t0 = time.monotonic()
        ok = _post(url, {"reference": reference, "candidate": samples.load_candidate("relu__correct")}).json()
        assert ok["status"] == "ok" and ok["correct"]
        assert time.monotonic() - t0 < 30
        stats = httpx.get(f"{url}/stats", timeout=10).json()
        worker = stats["per_worker"][0]
        # The warm worker itself never died: the candidates only killed their forked children.
        assert worker["pid"] == pid_before and worker["alive"] and stats["worker_restarts"] == 0
        children = psutil.Process(worker["pid"]).children(recursive=True)
        assert [c for c in children if c.status() == psutil.STATUS_ZOMBIE] == []
        # Only the judge forked ahead for the next evaluation (worker.py) and its runner, nothing
        # of the candidates.
        assert worker["spare_pid"] is not None
        spare = psutil.Process(worker["spare_pid"])
        assert {c.pid for c in children} == {spare.pid} | {c.pid for c in spare.children()}
        assert len(children) == 2


def test_a_dead_spare_child_is_replaced_and_its_prints_never_reach_the_candidate(tmp_path) -> None:
    """The child forked ahead (worker.py) is killed between evaluations: the next request is
    served by a fresh child, and each result's stdout_tail holds only what its candidate printed."""
    reference = samples.load_problem("relu")
    candidate = samples.load_candidate("relu__correct").replace(
        "        return out\n", "        print('candidate says hi')\n        return out\n", 1
    )
    assert "candidate says hi" in candidate
    with running_eval_server(tmp_path, "--devices", "cpu", "--cpu-workers", "1") as url:
        first = _post(url, {"reference": reference, "candidate": candidate}).json()
        assert first["status"] == "ok", first["feedback"]
        spare = httpx.get(f"{url}/stats", timeout=10).json()["per_worker"][0]["spare_pid"]
        assert spare is not None and psutil.pid_exists(spare)
        os.kill(spare, signal.SIGKILL)
        second = _post(url, {"reference": reference, "candidate": candidate}).json()
        assert second["status"] == "ok", second["feedback"]
        for body in (first, second):
            lines = body["stdout_tail"].strip().splitlines()
            assert lines and set(lines) == {"candidate says hi"}, body["stdout_tail"]
        worker = httpx.get(f"{url}/stats", timeout=10).json()["per_worker"][0]
        assert worker["spare_pid"] not in (None, spare) and worker["restarts"] == 0


def test_queue_full_answers_503_with_retry_after(tmp_path) -> None:
    reference = samples.load_problem("relu")
    hang = {
        "reference": reference,
        "candidate": samples.load_candidate("relu__infinite_loop"),
        "options": {"timeout_s": 4},
    }
    with running_eval_server(tmp_path, "--devices", "cpu", "--cpu-workers", "1", "--max-queue", "0") as url:
        holder: dict[str, httpx.Response] = {}
        t = threading.Thread(target=lambda: holder.setdefault("r", _post(url, hang)))
        t.start()
        deadline = time.monotonic() + 10
        while httpx.get(f"{url}/stats", timeout=5).json()["in_flight"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        busy = _post(url, {"reference": reference, "candidate": samples.load_candidate("relu__correct")})
        t.join()
        assert busy.status_code == 503
        assert busy.headers["Retry-After"] == "5"
        assert "queue full" in busy.json()["error"]
        assert holder["r"].json()["status"] == "timeout"
        assert httpx.get(f"{url}/stats", timeout=5).json()["rejected_queue_full"] == 1
