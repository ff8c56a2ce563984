"""tools/eval_model end to end against the REAL eval server (CPU, Triton interpreter), with
labelled test doubles for the policy endpoints: the OpenAI-compatible chat TEST DOUBLE
(tests/openai_double.py) answering canned candidates from eval_server/samples/candidates, and the
SGLang TEST DOUBLE (tests/sglang_double.py) in scripted mode. Covers an interrupted run (the chat
endpoint fails mid-run) resumed by re-running the same command, the metrics of the resulting
report, a run killed with SIGKILL and resumed, the train-split refusal (split field and split
manifest), --report-only, and tools/compare_runs on the two result files."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eval_server.samples import load_candidate, load_problem
from slime_ext.data.split import build_manifest, default_manifest_path, write_split_manifest
from slime_ext.reports.results import load_results
from slime_ext.rollout.problems import PromptRecord, load_prompt_records, write_prompt_records
from tests.openai_double import OpenAIChatDouble
from tests.processes import still_running
from tests.sglang_double import SGLangDouble
from tests.tiny_qwen3 import tiny_model, tiny_tokenizer
from tools import compare_runs, eval_model

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
F = "```"
NO_CODE = "I am not sure how to write this kernel."


def code(name: str) -> str:
    return f"Here is the kernel.\n\n{F}python\n{load_candidate(name)}\n{F}\n"


# problem -> sample -> the answer of each turn
SCRIPT: dict[str, list[list[str]]] = {
    "relu": [[code("relu__wrong_math"), code("relu__correct")], [code("relu__correct")]],
    "softmax": [
        [NO_CODE, code("softmax__wrong_shape")],
        [code("relu__syntax_error"), code("softmax__correct")],
    ],
    "sum_dim": [[code("sum_dim__correct")], [NO_CODE, NO_CODE]],
}
PROBLEMS = {
    "relu": (1, "holdout"),
    "softmax": (1, "holdout"),
    "sum_dim": (2, "holdout"),
    "matmul": (1, "train"),
}


def responder(messages: list[dict[str, str]], body: dict[str, Any]) -> str:
    """Which problem: the reference source in the first user message; which sample and turn: the
    seed the tool sends (base 0 + 1000 * sample + turn)."""
    user = next(m["content"] for m in messages if m["role"] == "user")
    name = next(n for n in SCRIPT if load_problem(n).strip() in user)
    sample, turn = divmod(body["seed"], 1000)
    assert turn == sum(m["role"] == "assistant" for m in messages)
    return SCRIPT[name][sample][turn]


def prompts_file(tmp: Path) -> Path:
    records = [
        PromptRecord(
            instance_id=f"kb_L{level}_{name}",
            level=level,
            problem_id=name,
            name=name,
            reference=load_problem(name),
            split=split,
        )
        for name, (level, split) in PROBLEMS.items()
    ]
    path = tmp / "prompts.jsonl"
    write_prompt_records(path, records)
    return path


def recipe_file(tmp: Path) -> Path:
    path = tmp / "recipe.yaml"
    # stop on any correct turn (CPU evaluation has no timing, so the speedup rule never fires)
    path.write_text("kernel_rl:\n  episode:\n    reward:\n      early_stop_min_speedup: null\n")
    return path


def base_args(prompts: Path, out: Path, eval_url: str) -> list[str]:
    return [
        "--prompts", str(prompts), "--out", str(out), "--eval-url", eval_url,
        "--eval-options", '{"correctness_trials": 1}', "--no-progress",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def chat_run(cpu_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The chat-backend run: first interrupted by an endpoint outage, then resumed."""
    tmp = tmp_path_factory.mktemp("eval_model")
    double = OpenAIChatDouble(responder)
    url = double.start()
    out = tmp / "chat"
    args = base_args(prompts_file(tmp), out, cpu_server) + [
        "--backend", "chat", "--url", url, "--model", "scripted-chat", "-k", "2", "--max-turns", "2",
        "--seed", "0", "--recipe", str(recipe_file(tmp)),
    ]  # fmt: skip
    try:
        double.fail_status, double.fail_after = 500, 3  # the endpoint dies after three answers
        first_rc = eval_model.main([*args, "--concurrency", "1"])
        first_lines = len(load_results(out / "results.jsonl"))
        first_requests = len(double.requests)
        double.fail_status = None
        second_rc = eval_model.main([*args, "--concurrency", "4"])
        yield {
            "out": out,
            "args": args,
            "first": (first_rc, first_lines, first_requests),
            "second": (second_rc, double.requests[first_requests:]),
            "double": double,
        }
    finally:
        double.stop()


def test_interrupted_run_resumes(chat_run: dict[str, Any]) -> None:
    first_rc, first_lines, first_requests = chat_run["first"]
    # relu/0 (2 turns) and relu/1 (1 turn, correct: stop) were written; softmax/0 hit the outage
    assert (first_rc, first_lines, first_requests) == (eval_model.EXIT_INCOMPLETE, 2, 4)
    second_rc, requests = chat_run["second"]
    assert second_rc == 0
    # only what was missing was asked for: softmax 2+2 turns, sum_dim 1+2 turns, no relu
    assert len(requests) == 7
    assert not any(load_problem("relu").strip() in r["messages"][1]["content"] for r in requests)
    records = load_results(chat_run["out"] / "results.jsonl")
    assert sorted((r.instance_id, r.sample) for r in records) == sorted(
        (f"kb_L{PROBLEMS[n][0]}_{n}", s) for n in SCRIPT for s in (0, 1)
    )
    by_key = {(r.problem_id, r.sample): r for r in records}
    assert [t.status for t in by_key["relu", 0].turns] == ["incorrect", "ok"]
    assert by_key["relu", 0].turns[1].candidate == load_candidate("relu__correct").strip("\n")
    assert by_key["relu", 0].turns[1].reward == pytest.approx(0.3) and by_key["relu", 0].early_stopped
    assert [t.status for t in by_key["softmax", 0].turns] == ["no_code", "incorrect"]
    assert [t.status for t in by_key["softmax", 1].turns] == ["compile_error", "ok"]
    assert [t.status for t in by_key["sum_dim", 0].turns] == ["ok"]
    assert [t.status for t in by_key["sum_dim", 1].turns] == ["no_code", "no_code"]
    assert all(r.split == "holdout" and r.status == "completed" for r in records)


def test_report_metrics(chat_run: dict[str, Any]) -> None:
    out = chat_run["out"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["run"]["model"] == "scripted-chat" and summary["run"]["max_turns"] == 2
    assert summary["run"]["kernel_backend"] == "triton"
    m = summary["metrics"]
    level1, level2, overall = m["1"], m["2"], m["all"]
    assert (level1["problems"], level1["samples"], level2["problems"]) == (2, 4, 1)
    # level 1: relu 2/2 correct, softmax 1/2 -> 0.75; after turn 1 only relu/1 -> (0.5 + 0) / 2
    assert level1["final"]["correct_rate"] == pytest.approx(0.75)
    assert [t["correct_rate"] for t in level1["per_turn"]] == pytest.approx([0.25, 0.75])
    assert level1["pass_at_k"] == {"1": pytest.approx(0.75), "2": pytest.approx(1.0)}
    assert level1["final"]["status"] == {"incorrect": 1, "ok": 3}
    assert level1["attempt_status_per_turn"][0] == {"compile_error": 1, "incorrect": 1, "no_code": 1, "ok": 1}
    assert level1["final"]["fast_p"]["1"] == 0.0 and level1["final"]["untimed_correct"] == 3  # CPU: no timing
    assert level2["final"]["correct_rate"] == 0.5 and level2["final"]["status"] == {"no_code": 1, "ok": 1}
    assert overall["final"]["correct_rate"] == pytest.approx((1.0 + 0.5 + 0.5) / 3)
    md = (out / "report.md").read_text()
    assert "# Evaluation: scripted-chat" in md and "| L1 | 2 | 4 | 75.0% |" in md
    assert "Settings: kernel_backend triton, backend chat" in md
    for png in ("fast_p.png", "turns.png"):
        assert (out / png).read_bytes().startswith(b"\x89PNG")


def test_train_split_refused_and_report_only(
    chat_run: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    args = chat_run["args"]
    assert eval_model.main([*args, "--split", "all"]) == 2
    assert "train split" in capsys.readouterr().err
    (chat_run["out"] / "report.md").unlink()
    assert eval_model.main(["--out", str(chat_run["out"]), "--report-only", "--no-plots"]) == 0
    assert (chat_run["out"] / "report.md").is_file()
    # other settings, same folder: refused, nothing appended
    before = (chat_run["out"] / "results.jsonl").read_bytes()
    assert eval_model.main([*args, "--temperature", "0.2"]) == 2
    assert "other settings" in capsys.readouterr().err
    assert (chat_run["out"] / "results.jsonl").read_bytes() == before


def test_split_manifest_must_agree(
    chat_run: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = chat_run["args"]
    prompts = Path(args[args.index("--prompts") + 1])
    records = load_prompt_records(prompts)
    manifest = default_manifest_path(prompts)
    try:
        # a manifest that says relu was trained on: refused although the record says holdout
        relabelled = [dataclasses.replace(r, split="train") if r.problem_id == "relu" else r for r in records]
        write_split_manifest(manifest, build_manifest(relabelled, seed=0, holdout_ratio=0.5))
        assert eval_model.main(args) == 2
        assert "refusing to report: 1 train problem(s) ['kb_L1_relu']" in capsys.readouterr().err
        # the matching manifest: accepted; everything is done already, so nothing is asked and
        # no eval server is reached or started
        write_split_manifest(manifest, build_manifest(records, seed=0, holdout_ratio=0.5))
        before = len(chat_run["double"].requests)

        def no_server(*_a: Any, **_k: Any) -> Any:
            raise AssertionError("an eval server was set up for a finished evaluation")

        monkeypatch.setattr(eval_model, "eval_server_urls", no_server)
        assert eval_model.main(args) == 0
        assert len(chat_run["double"].requests) == before
        assert "6 skipped" in capsys.readouterr().err
    finally:
        manifest.unlink(missing_ok=True)


def test_sglang_backend_and_compare(
    cpu_server: str, chat_run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tok_dir = tmp_path / "tokenizer"
    tok = tiny_tokenizer()
    tok.save_pretrained(tok_dir)
    double = SGLangDouble(tiny_model(), tok, seed=1)
    url = double.start()
    double.scripted.extend([code("relu__wrong_math"), code("relu__correct")])
    out = tmp_path / "sglang"
    args = base_args(prompts_file(tmp_path), out, cpu_server) + [
        "--backend", "sglang", "--url", url, "--tokenizer", str(tok_dir), "--model", "scripted-sglang",
        "--problems", "kb_L1_relu", "-k", "1", "--max-turns", "2", "--temperature", "1.0",
    ]  # fmt: skip
    try:
        assert eval_model.main(args) == 0
    finally:
        double.stop()
    (record,) = load_results(out / "results.jsonl")
    assert [t.status for t in record.turns] == ["incorrect", "ok"]
    assert [t.reward for t in record.turns] == pytest.approx([0.1, 0.3])
    assert len(double.requests) == 2 and record.model == "scripted-sglang"
    # the second request carried the first turn's tokens and the eval feedback
    assert len(double.requests[1]["input_ids"]) > len(double.requests[0]["input_ids"])

    cmp_md = tmp_path / "cmp.md"
    rc = compare_runs.main(
        [str(out), str(chat_run["out"] / "results.jsonl"), "--out", str(cmp_md), "--resamples", "500"]
    )
    assert rc == 0
    text = cmp_md.read_text()
    assert "# scripted-chat (B) vs scripted-sglang (A)" in text
    assert "Paired problems: 1 (only in A: 0, only in B: 2)" in text
    assert "| all | correct | 1 | 100.0% | 100.0% | +0.0 pp |" in text


def test_killed_run_resumes(tmp_path: Path) -> None:
    """SIGKILL the tool mid-run (a real process, killed by its PID); the same command resumes:
    every sample ends up in the file exactly once and only the missing ones are asked for.
    The script answers without code, so no evaluation is needed (the eval URL is never called)."""

    def slow_no_code(messages: list[dict[str, str]], body: dict[str, Any]) -> str:
        time.sleep(0.3)  # slow enough that the kill lands mid-run
        return NO_CODE

    double = OpenAIChatDouble(slow_no_code)
    url = double.start()
    out = tmp_path / "killed"
    # Something must listen at --eval-url (the tool refuses an unreachable one before it starts);
    # nothing answers there, and nothing needs to.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    eval_url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    args = [
        "--prompts", str(prompts_file(tmp_path)), "--out", str(out), "--eval-url", eval_url,
        "--backend", "chat", "--url", url, "--model", "no-code", "-k", "4", "--max-turns", "1",
        "--concurrency", "2", "--no-plots", "--no-progress",
    ]  # fmt: skip
    results = out / "results.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "tools.eval_model", *args], cwd=REPO_ROOT, env=env)
    try:
        deadline = time.monotonic() + 60
        while not (results.is_file() and results.read_bytes().count(b"\n") >= 3):
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended before it was killed"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        double.wait_idle()  # a request the killed run sent may still be in the double's hands
        written = len(load_results(results))
        asked = len(double.requests)
        assert 3 <= written < 12
        assert eval_model.main(args) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        double.stop()
        listener.close()
    records = load_results(results)
    keys = [(r.instance_id, r.sample) for r in records]
    assert len(keys) == len(set(keys)) == 12  # nothing lost, nothing twice
    # the resumed run asked for the missing samples only (in-flight ones at the kill are redone)
    assert len(double.requests) - asked == 12 - written


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_stops_the_embedded_eval_server_like_ctrl_c(sig: signal.Signals, tmp_path: Path) -> None:
    """SIGTERM/SIGHUP mid-run (no --eval-url: the tool started its own eval server): the Ctrl-C
    path runs (report of what is done, "re-run to resume"), exit 128+signal, and the eval server
    and its workers (tracked by PID) are gone."""
    import psutil

    def slow_no_code(messages: list[dict[str, str]], body: dict[str, Any]) -> str:
        time.sleep(0.3)
        return NO_CODE

    double = OpenAIChatDouble(slow_no_code)
    url = double.start()
    out = tmp_path / "term"
    args = [
        "--prompts", str(prompts_file(tmp_path)), "--out", str(out), "--eval-devices", "cpu",
        "--eval-workers", "1", "--backend", "chat", "--url", url, "--model", "no-code", "-k", "4",
        "--max-turns", "1", "--concurrency", "1", "--no-plots", "--no-progress",
    ]  # fmt: skip
    results = out / "results.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.eval_model", *args],
        cwd=REPO_ROOT,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not (results.is_file() and results.read_bytes().count(b"\n") >= 1):
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended before the signal"
            time.sleep(0.05)
        children = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        assert len(children) >= 2  # the eval server and its worker
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        double.stop()
    assert proc.returncode == 128 + sig, err
    assert "interrupted: re-run the same command to resume" in err
    assert still_running(children) == []


def test_report_only_keeps_the_runs_allow_train(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A folder evaluated with --allow-train (the train split included, knowingly) is re-reported
    with --report-only alone: the run's setting stands, the flag need not be repeated."""
    double = OpenAIChatDouble(lambda messages, body: NO_CODE)  # no code: no evaluation needed
    url = double.start()
    listener = socket.socket()  # --eval-url must be reachable; it is never called
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    out = tmp_path / "out"
    args = [
        "--prompts", str(prompts_file(tmp_path)), "--out", str(out), "--backend", "chat", "--url", url,
        "--model", "m", "--split", "all", "--allow-train", "--max-turns", "1", "--no-plots", "--no-progress",
        "--eval-url", f"http://127.0.0.1:{listener.getsockname()[1]}",
    ]  # fmt: skip
    try:
        assert eval_model.main(args) == 0
    finally:
        double.stop()
        listener.close()
    (out / "report.md").unlink()
    assert eval_model.main(["--out", str(out), "--report-only", "--no-plots"]) == 0, capsys.readouterr().err
    assert (out / "report.md").is_file()


def test_run_stopped_before_any_sample_finished(
    cpu_server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The endpoint refuses the very first request (as SGLang answers 400 when max_new_tokens
    exceeds its context): the run says why it stopped and exits 'incomplete', instead of failing
    on the report's missing results file."""
    double = OpenAIChatDouble(responder)
    url = double.start()
    out = tmp_path / "out"
    try:
        double.fail_status, double.fail_after = 400, 0
        rc = eval_model.main(
            base_args(prompts_file(tmp_path), out, cpu_server)
            + ["--backend", "chat", "--url", url, "--model", "m", "--problems", "relu"]
        )
    finally:
        double.stop()
    err = capsys.readouterr().err
    assert rc == eval_model.EXIT_INCOMPLETE, err
    assert "no sample finished: no report written" in err and "stopped: " in err and "400" in err
    assert not (out / "results.jsonl").exists()
