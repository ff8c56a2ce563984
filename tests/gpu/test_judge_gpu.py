"""The judge on a GPU, against a runner whose first layer is compromised (it says `ok` whatever
its model does): only outputs and time decide. Each case in a fresh interpreter
(tests/gpu/judge_harness.py) under this test's own MPS daemon (eval_server/isolation/mps.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from eval_server.isolation import mps

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mps_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    with mps.client_env(tmp_path_factory.mktemp("mps")) as env:
        yield env


def _judge(case: str, n: int, env: dict[str, str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "tests.gpu.judge_harness", case, str(n)],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("n", [1 << 16, 1 << 24])
def test_the_reference_against_itself_scores_one(mps_env: dict[str, str], n: int) -> None:
    r = _judge("honest", n, mps_env)
    assert r["status"] == "ok", r["feedback"]
    assert 0.97 <= r["speedup"] <= 1.03, (r["speedup"], r["reference_timing"], r["candidate_timing"])


def test_outputs_in_memory_freed_and_reallocated_are_read_where_they_are_now(mps_env: dict[str, str]) -> None:
    """The first layer frees the reference's output segments; the candidate's outputs then get
    new allocations, often at the same addresses: the judge must map the new ones (a handle
    remembered by address named the freed memory: every honest candidate was `incorrect`)."""
    r = _judge("freed_between", 1 << 24, mps_env)
    assert r["status"] == "ok", r["feedback"]
    assert 0.97 <= r["speedup"] <= 1.03, r["speedup"]


def test_a_forged_reference_timing_in_the_cache_is_remeasured_not_believed(mps_env: dict[str, str]) -> None:
    """The reference cache is a file the candidate's user can write (native code in a runner):
    a cached reference 100x slower than the truth must not reach the speedup."""
    r = _judge("poisoned_cache", 1 << 24, mps_env)
    assert r["status"] == "ok", r["feedback"]
    assert r["reference_timing_source"].startswith("remeasured"), r["reference_timing_source"]
    assert 0.97 <= r["speedup"] <= 1.03, r["speedup"]


def test_escaped_work_on_a_side_stream_gets_no_reward(mps_env: dict[str, str]) -> None:
    r = _judge("side_stream", 1 << 24, mps_env)
    assert r["status"] in ("incorrect", "rejected"), r["feedback"]


def test_a_forward_that_synchronizes_is_refused_with_a_reason(mps_env: dict[str, str]) -> None:
    r = _judge("host_sync", 1 << 20, mps_env)
    assert r["status"] == "rejected" and [c["id"] for c in r["checks"]] == ["judge.host_sync"], r["feedback"]


def test_an_output_finished_after_done_gets_no_reward(mps_env: dict[str, str]) -> None:
    """The work is queued when the runner describes its outputs, after "done": the judge's
    snapshot, queued behind "done", holds what was there before."""
    r = _judge("lazy_output", 1 << 24, mps_env)
    assert r["status"] in ("incorrect", "rejected"), r["feedback"]


def test_a_done_said_before_the_work_gets_no_reward(mps_env: dict[str, str]) -> None:
    """The go/done words are judge memory the runner maps and can write: a runner that writes done
    before its work ends the window early, but the snapshot queued behind done then holds what
    existed (the previous window's outputs) or the work shows as escaped; never a speedup."""
    r = _judge("early_done", 1 << 20, mps_env)
    assert r["status"] in ("incorrect", "rejected") or r["speedup"] <= 1.03, (
        r["status"],
        r["speedup"],
        r["feedback"],
    )


def test_outputs_described_as_judge_memory_get_no_reward(mps_env: dict[str, str]) -> None:
    """The judge maps a window's outputs from the runner's description before it queues the
    window: a runner naming the judge's own input slot as its output must not be scored (the
    mapping fails, or the slot's values are not the ReLU)."""
    r = _judge("judge_memory_output", 1 << 20, mps_env)
    assert r["status"] in ("crashed", "incorrect", "rejected"), (r["status"], r["feedback"])


def test_half_the_calls_skipped_is_incorrect(mps_env: dict[str, str]) -> None:
    r = _judge("every_other", 1 << 24, mps_env)
    assert r["status"] == "incorrect", r["feedback"]


def test_a_content_keyed_cache_never_hits_fresh_values(mps_env: dict[str, str]) -> None:
    r = _judge("sampled_memo", 1 << 24, mps_env)
    assert r["status"] in ("ok", "rejected"), r["feedback"]
    if r["status"] == "ok":
        assert r["speedup"] <= 1.02
