"""The agent runner end to end: the REAL buffer server process (`--recipe`), the REAL eval server
(CPU, Triton interpreter) and the SGLang TEST DOUBLE (tests/sglang_double.py, scripted mode,
serving the tiny local Qwen3 model and tokenizer).

One small epoch (3 prompts x 2 episodes x up to 2 turns, concurrency 1 so the scripted answers
arrive in a known order): POST /rollout/start, backpressure holds the runner after the first
group, POST /batches returns whole groups whose tokens, masks, log-probs, rewards and uids are
checked against what the double sampled; then the eval server is stopped mid-run: the episodes
end `aborted`, are counted and retried, the runner stays up, and once the eval server is back on
the same port the last group is written."""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from eval_server.samples import load_candidate, load_problem
from krl_common.service import ServiceProcess, free_port, start_service
from slime_ext.rollout.chat import ChatRenderer
from slime_ext.rollout.problems import PromptRecord, write_prompt_records
from slime_ext.rollout.prompts import PromptConfig, build_messages
from slime_ext.slime_plugins.rollout import runner_exhausted
from tests.sglang_double import SGLangDouble
from tests.tiny_qwen3 import tiny_model, tiny_tokenizer

pytestmark = pytest.mark.integration

F = "```"
NO_CODE = "I would write a kernel here."
WRONG = f"{F}python\n{load_candidate('relu__wrong_math')}\n{F}"
CORRECT = f"{F}python\n{load_candidate('relu__correct')}\n{F}"


def start_eval(workdir: Path, port: int) -> ServiceProcess:
    return start_service(
        "eval_server",
        ["--workdir", str(workdir / "eval"), "--devices", "cpu", "--cpu-workers", "1"],
        workdir,
        port=port,
        startup_timeout_s=180,
    )


def wait_stats(url: str, cond: Callable[[dict[str, Any]], bool], timeout_s: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        stats = httpx.get(f"{url}/stats", timeout=10).json()
        if cond(stats):
            return stats
        assert time.monotonic() < deadline, stats["runner"]
        time.sleep(0.1)


def test_small_epoch_end_to_end_with_an_eval_outage(tmp_path: Path) -> None:
    tok = tiny_tokenizer()
    tok_dir = tmp_path / "tokenizer"
    tok.save_pretrained(tok_dir)
    relu = load_problem("relu")
    prompts = tmp_path / "prompts.jsonl"
    write_prompt_records(
        prompts,
        [
            PromptRecord(instance_id="relu_a", level=1, problem_id="a", name="relu a", reference=relu),
            PromptRecord(instance_id="relu_b", level=1, problem_id="b", name="relu b", reference=relu),
            PromptRecord(instance_id="relu_c", level=2, problem_id="c", name="relu c", reference=relu),
        ],
    )
    double = SGLangDouble(tiny_model(), tok, seed=5)
    # sample 0 of a group: no code, then correct; sample 1: wrong, then correct. Group 3 (during
    # and after the outage) answers the correct kernel every time (one turn: early stop).
    double.scripted.extend([NO_CODE, CORRECT, WRONG, CORRECT] * 2 + [CORRECT] * 200)
    sglang_url = double.start()
    eval_port = free_port()
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "kernel_rl": {
                    "runner": {
                        "prompt_data": str(prompts),
                        "sglang_url": sglang_url,
                        "eval_urls": f"127.0.0.1:{eval_port}",
                        "tokenizer": str(tok_dir),
                        "concurrency": 1,
                        "max_ready_groups": 1,
                        "temperature": 1.0,
                        "max_context_tokens": 8192,
                        "max_new_tokens": 512,
                        "run_id": "it",
                        "max_episode_attempts": 100,
                        "backoff_s": 0.2,
                        "max_backoff_s": 1.0,
                        "eval_max_retries": 1,
                        "poll_s": 0.1,
                    },
                    "episode": {
                        "max_turns": 2,
                        "eval_options": {"correctness_trials": 1, "timeout_s": 60},
                        "reward": {"early_stop_min_speedup": None},  # stop on any correct turn
                    },
                    "curriculum": {"enabled": True, "levels": [1, 2], "window": 8, "advance_fast_1": None},
                }
            }
        )
    )
    with cf.ThreadPoolExecutor(2) as pool:  # both start at once (each takes seconds on CPU)
        eval_start = pool.submit(start_eval, tmp_path, eval_port)
        buffer_start = pool.submit(
            start_service,
            "buffer_server",
            ["--db", str(tmp_path / "b.sqlite"), "--group-size", "2", "--recipe", str(recipe)],
            tmp_path,
            startup_timeout_s=120,
        )
        evals, buffer = eval_start.result(), buffer_start.result()
    url = buffer.url
    try:
        assert httpx.post(f"{url}/policy_version", json={"version": 5}).status_code == 200
        before = httpx.get(f"{url}/stats").json()["runner"]
        assert before["configured"] and not before["running"] and before["prompts"] == 3
        assert httpx.post(f"{url}/rollout/start").json() == {"running": True, "started": True}
        assert httpx.post(f"{url}/rollout/start", json={}).json() == {"running": True, "started": False}

        # backpressure: one ready group is the limit, so the runner waits after the level-1 groups
        stats = wait_stats(
            url, lambda s: s["runner"]["backpressure"]["waiting"] and s["runner"]["groups"]["written"] == 2
        )
        assert stats["runner"]["groups"]["scheduled"] == 2 and stats["groups"]["ready"] == 2
        assert runner_exhausted(stats) is None
        evals.stop()  # the outage starts before the trainer takes the two groups

        reply = httpx.post(f"{url}/batches", json={"num_groups": 8, "timeout_s": 5}, timeout=30).json()
        assert sorted(g["instance_id"] for g in reply["groups"]) == ["relu_a", "relu_b"]
        assert httpx.post(f"{url}/batches/ack", json={"lease_id": reply["lease_id"]}).status_code == 200
        check_groups(reply["groups"], double, relu)

        # group 3 runs into the outage: aborted episodes are counted and retried, the runner lives
        stats = wait_stats(url, lambda s: s["runner"]["episodes"]["aborted"] >= 2)
        runner = stats["runner"]
        assert runner["running"] and runner["aborts_by_reason"].get("eval_unavailable", 0) >= 2
        assert "evaluation failed" in runner["last_abort_reason"] and runner["records"]["written"] == 4
        outage = runner["outage"]  # what the dry run's console reports
        assert outage["service"] == "eval" and outage["consecutive_aborts"] >= 2 and outage["failing_s"] > 0
        evals = start_eval(tmp_path, eval_port)  # back on the same port: the retries now succeed
        stats = wait_stats(url, lambda s: s["runner"]["finished"])
        runner = stats["runner"]
        assert runner["episodes"]["completed"] == 6 and runner["groups"]["written"] == 3
        assert runner["outage"] == {"consecutive_aborts": 0, "failing_s": 0.0, "service": None}
        assert (
            runner["episodes"]["retried"] == runner["episodes"]["aborted"]
            and runner["episodes"]["given_up"] == 0
        )
        # both group-3 episodes answered the correct kernel at once (early stop): equal rewards ->
        # the group is dropped, and counted
        assert stats["records"]["total"] == 6 and stats["dropped_groups"]["zero_variance"] == 1
        # the rollout function's test of "no group can come any more", on the real /stats
        assert runner_exhausted(stats) is not None and stats["records"]["stored"] == 0
        cur = runner["curriculum"]
        assert cur["enabled"] and cur["tier"] == 1 and cur["level"] == 2
        assert cur["rates"]["1"] == {
            "window_episodes": 4,
            "total_episodes": 4,
            "correct_rate": 1.0,
            "fast_1": 0.0,
        }
        assert runner["latency"]["eval_turn"]["count"] >= 6 and runner["epoch"] == 1
        assert "rollout_runner_episodes_total" in httpx.get(f"{url}/metrics").text
        assert httpx.post(f"{url}/rollout/stop").json() == {"running": False}
    finally:
        buffer.stop()
        evals.stop()
        double.stop()


def check_groups(groups: list[dict[str, Any]], double: SGLangDouble, reference: str) -> None:
    """Records of the first two groups against what the double sampled (requests 0-7, in order)."""
    renderer = ChatRenderer(tiny_tokenizer())
    prompt_ids = renderer.prompt_ids(build_messages(reference, PromptConfig()))
    expected_spans = sorted((tuple(double.outputs[i]), tuple(double.outputs[i + 1])) for i in range(0, 8, 2))
    spans = []
    for group in groups:
        records = sorted(group["records"], key=lambda r: r["uid"])
        iid = group["instance_id"]
        assert [r["uid"] for r in records] == [f"it:e0:s0:{iid}", f"it:e0:s1:{iid}"]
        for k, r in enumerate(records):
            assert r["policy_version"] == 5 and r["status"] == "completed" and r["instance_id"] == iid
            assert r["prompt_token_ids"] == prompt_ids
            mask, resp, lps = r["loss_mask"], r["response_token_ids"], r["rollout_log_probs"]
            assert len(mask) == len(resp) == len(lps)
            # two sampled spans (mask 1) around the untrained feedback turn (mask 0, log-prob 0)
            first_end = mask.index(0)
            second_start = first_end + mask[first_end:].index(1)
            assert set(mask[second_start:]) == {1} and set(lps[first_end:second_start]) == {0.0}
            assert all(lp < 0 for lp in lps[:first_end] + lps[second_start:])
            spans.append((tuple(resp[:first_end]), tuple(resp[second_start:])))
            feedback = renderer.decode(resp[first_end:second_start])
            statuses = [e and e["status"] for e in r["turn_eval_results"]]
            if k == 0:
                assert statuses == [None, "ok"] and "no fenced" in feedback
                assert r["turn_rewards"] == [0.0, 0.3] and r["reward"] == pytest.approx(0.4 * 0.3)
            else:
                assert statuses == ["incorrect", "ok"] and "Fix the problem" in feedback
                assert r["turn_rewards"] == [0.1, 0.3] and r["reward"] == pytest.approx(0.1 + 0.4 * 0.3)
            assert r["metadata"]["level"] == 1 and r["metadata"]["group_sample"] == k
    assert sorted(spans) == expected_spans
