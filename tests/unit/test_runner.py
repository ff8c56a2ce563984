"""The agent runner's loop (buffer_server/runner/agent_runner.py) on a real BufferStore, with the episode
function replaced by a scripted one (the real run_episode against the real eval server and the
SGLang test double is exercised in tests/integration/test_agent_runner.py): scheduling of whole
groups, deterministic uids, policy version, retries of aborted episodes, give-up, backpressure,
resume after restart, per-turn records, clean stop, config errors."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from buffer_server.runner.agent_runner import AgentRunner
from buffer_server.runner.config import RunnerConfig, runner_config_from_dict, runner_settings
from buffer_server.runner.curriculum import CurriculumConfig
from buffer_server.store.buffer_store import BufferStore
from buffer_server.store.rules import GroupRules
from krl_common.validation import ValidationError
from slime_ext.clients.sglang_client import SGLangUnavailableError
from slime_ext.rollout.episode import Episode, EpisodeConfig, Turn
from slime_ext.rollout.problems import PromptRecord, write_prompt_records
from slime_ext.rollout.rewards import RewardConfig
from tests.tiny_qwen3 import tiny_tokenizer

pytestmark = pytest.mark.unit


def make_episode(rewards: list[float], *, credit: str = "trajectory", status: str = "completed") -> Episode:
    """A well-formed multi-turn episode: 2 sampled tokens per turn, 2 feedback tokens between turns."""
    ep = Episode(problem_id="p", messages=[], prompt_ids=[1, 2, 3], gamma=0.4, credit=credit)
    for t, reward in enumerate(rewards):
        if t:
            ep.response_ids += [7, 8]
            ep.loss_mask += [0, 0]
            ep.rollout_log_probs += [0.0, 0.0]
        start = len(ep.response_ids)
        ep.response_ids += [20 + t, 30 + t]
        ep.loss_mask += [1, 1]
        ep.rollout_log_probs += [-0.5, -0.25]
        correct = reward >= 0.3
        ep.turns.append(
            Turn(
                index=t,
                start=start,
                end=start + 2,
                finish_reason="stop",
                reward=reward,
                gen_s=0.01,
                eval_s=0.02,
                eval_result={"status": "ok" if correct else "incorrect", "correct": correct, "speedup": None},
            )
        )
    ep.status = status
    ep.check()
    return ep


class Script:
    """The episode function: `plan(instance_id, sample, call)` -> rewards list, "abort" or an exception."""

    def __init__(
        self, plan: Callable[[str, int, int], Any], *, credit: str = "trajectory", delay_s: float = 0.0
    ):
        self.plan = plan
        self.credit = credit
        self.delay_s = delay_s
        self.calls: dict[tuple[str, int], int] = {}
        self.lock = threading.Lock()
        self.gate: asyncio.Event | None = None  # set from the test to let episodes finish

    async def __call__(self, problem: PromptRecord, *, request_headers: dict[str, str], **_: Any) -> Episode:
        uid = request_headers["X-SMG-Routing-Key"]
        sample = int(uid.split(":")[2][1:])
        with self.lock:
            call = self.calls.get((problem.instance_id, sample), 0)
            self.calls[(problem.instance_id, sample)] = call + 1
        await asyncio.sleep(self.delay_s)
        what = self.plan(problem.instance_id, sample, call)
        if isinstance(what, Exception):
            raise what
        if what == "abort":
            ep = make_episode([], credit=self.credit, status="aborted")
            ep.abort_reason = "evaluation failed (EvalUnavailableError): no eval server accepted the request"
            return ep
        return make_episode(what, credit=self.credit)


def write_prompts(tmp_path: Path, n: int, levels: tuple[int, ...] = (1,)) -> Path:
    path = tmp_path / "prompts.jsonl"
    records = [
        PromptRecord(
            instance_id=f"p{i}",
            level=levels[i % len(levels)],
            problem_id=str(i),
            name=f"n{i}",
            reference=f"# {i}\n",
        )
        for i in range(n)
    ]
    records.append(
        PromptRecord(
            instance_id="held", level=1, problem_id="h", name="h", reference="# h\n", split="holdout"
        )
    )
    write_prompt_records(path, records)
    return path


def make_runner(
    tmp_path: Path,
    store: BufferStore,
    script: Script,
    *,
    n_prompts: int = 3,
    credit: str = "trajectory",
    curriculum: CurriculumConfig | None = None,
    **overrides: Any,
) -> AgentRunner:
    cfg = {
        "prompt_data": str(write_prompts(tmp_path, n_prompts, (1, 2) if curriculum else (1,))),
        "sglang_url": "http://127.0.0.1:9",  # never called: the scripted episode function replaces run_episode
        "eval_urls": "127.0.0.1:9",
        "tokenizer": "unused",
        "concurrency": 4,
        "backoff_s": 0.01,
        "max_backoff_s": 0.05,
        "poll_s": 0.02,
        "run_id": "t",
        **overrides,
    }
    episode = EpisodeConfig(reward=RewardConfig(credit=credit))
    return AgentRunner(
        store,
        runner_config_from_dict(cfg),
        episode,
        group_size=store.rules.group_size,
        curriculum=curriculum,
        tokenizer=tiny_tokenizer(),
        episode_fn=script,
    )


def wait_for(cond: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def run_to_end(runner: AgentRunner, store: BufferStore) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Start the runner and play the trainer (lease + ack every ready group) until it finishes;
    returns its stats and every record consumed."""
    assert runner.start() is True
    records: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30.0
    while runner.running or store.pending_groups()[0]:
        assert time.monotonic() < deadline, runner.stats()
        lease = store.lease(4096, timeout_s=0.05)
        if lease.lease_id:
            records += [r for g in lease.groups for r in g.decoded()]
            store.ack(lease.lease_id)
    stats = runner.stats()
    assert stats["finished"] and stats["last_error"] is None, stats
    return stats, records


@pytest.fixture()
def store(tmp_path: Path) -> BufferStore:
    with BufferStore(tmp_path / "buffer.sqlite", GroupRules(group_size=2, drop_zero_variance=False)) as s:
        yield s


def test_runs_every_group_of_every_epoch_with_deterministic_uids(tmp_path: Path, store: BufferStore) -> None:
    store.set_policy_version(4)
    runner = make_runner(tmp_path, store, Script(lambda iid, k, call: [0.1 * (k + 1)]), epochs=2)
    stats, records = run_to_end(runner, store)
    assert stats["episodes"]["completed"] == 12 and stats["groups"]["written"] == 6
    assert stats["records"]["written"] == 12 and stats["episodes"]["aborted"] == 0
    uids = sorted(r["uid"] for r in records)
    assert uids == sorted(f"t:e{e}:s{k}:p{i}" for e in range(2) for k in range(2) for i in range(3))
    assert all(r["policy_version"] == 4 for r in records)  # "held" (holdout split) never runs
    r0 = next(r for r in records if r["uid"] == "t:e1:s1:p2")
    assert r0["reward"] == pytest.approx(0.2) and r0["response_token_ids"] == [20, 30]
    assert r0["metadata"]["epoch"] == 1 and r0["metadata"]["group_sample"] == 1 and r0["sample_index"] == 0
    assert stats["latency"]["generate_turn"]["count"] == 12 and stats["epoch"] == 2


def test_aborted_episodes_are_retried_never_written_and_given_up(tmp_path: Path, store: BufferStore) -> None:
    def plan(iid: str, k: int, call: int) -> Any:
        if iid == "p0" and k == 1:
            return "abort"  # always: given up after max_episode_attempts
        if iid == "p1" and call < 2:  # then succeeds on the third attempt
            return "abort" if call == 0 else SGLangUnavailableError("http://e:1/generate: could not connect")
        if iid == "p2" and k == 0 and call == 0:
            return RuntimeError("boom")
        return [0.1, 0.3]

    script = Script(plan)
    runner = make_runner(tmp_path, store, script, max_episode_attempts=3)
    stats, records = run_to_end(runner, store)
    ep = stats["episodes"]
    assert ep["given_up"] == 1 and ep["completed"] == 5
    assert ep["aborted"] == 3 + 2 * 2 + 1  # p0/s1 three times, p1's two samples twice each, p2/s0 once
    assert ep["retried"] == 2 + 2 * 2 + 1
    assert stats["aborts_by_reason"] == {"eval_unavailable": 5, "generate_error": 2, "error": 1}
    assert stats["last_error"] is None and stats["records"]["lost"] == 0
    assert stats["groups"] == {"scheduled": 3, "written": 3, "short": 1, "discarded": 0, "in_flight": 0}
    assert script.calls[("p0", 1)] == 3
    written = store.uids_with_prefix("t:")
    assert "t:e0:s1:p0" not in written and len(written) == 5
    # the short group waits in the store as a partial group (its timeout rule decides)
    assert {r["uid"] for r in records} == written - {"t:e0:s0:p0"}
    assert store.pending_groups() == ([], [("p0", 1)])
    # resume: the given-up sample is the only thing a new start runs (and it succeeds now)
    runner2 = make_runner(tmp_path, store, Script(lambda *a: [0.2]))
    stats2, records2 = run_to_end(runner2, store)
    assert stats2["episodes"]["started"] == 1 and stats2["sampler"]["queue"]["skipped_groups"] == 2
    assert sorted(r["uid"] for r in records2) == ["t:e0:s0:p0", "t:e0:s1:p0"]  # the group is whole now


def test_backpressure_waits_for_the_trainer(tmp_path: Path, store: BufferStore) -> None:
    runner = make_runner(
        tmp_path,
        store,
        Script(lambda *a: [0.1, 0.3], delay_s=0.05),
        max_ready_groups=1,
        n_prompts=5,
        concurrency=2,
    )
    assert runner.start()
    # groups already started when the first one became ready still finish; then nothing starts
    wait_for(
        lambda: runner.stats()["backpressure"]["waits"] > 3 and runner.stats()["groups"]["in_flight"] == 0
    )
    scheduled = runner.stats()["groups"]["scheduled"]
    time.sleep(0.3)
    stats = runner.stats()
    assert stats["groups"]["written"] == stats["groups"]["scheduled"] == scheduled <= 3 and runner.running
    assert stats["backpressure"]["waiting"] and stats["backpressure"]["ready_groups"] == scheduled
    while runner.running or store.pending_groups()[0]:
        lease = store.lease(1, timeout_s=1.0)
        if lease.lease_id:
            store.ack(lease.lease_id)
    stats = runner.stats()
    assert stats["groups"]["written"] == 5 and stats["finished"]


def test_per_turn_credit_writes_one_record_per_turn(tmp_path: Path, store: BufferStore) -> None:
    runner = make_runner(
        tmp_path,
        store,
        Script(lambda iid, k, c: [0.1, 0.3 * k], credit="per_turn"),
        credit="per_turn",
        n_prompts=1,
    )
    _, consumed = run_to_end(runner, store)
    records = {r["uid"]: r for r in consumed}
    assert sorted(records) == ["t:e0:s0:t0:p0", "t:e0:s0:t1:p0", "t:e0:s1:t0:p0", "t:e0:s1:t1:p0"]
    t0, t1 = records["t:e0:s1:t0:p0"], records["t:e0:s1:t1:p0"]
    assert t0["reward"] == pytest.approx(0.1 + 0.4 * 0.3) and t1["reward"] == pytest.approx(0.3)
    assert (t0["sample_index"], t1["sample_index"]) == (0, 1)
    assert t0["response_token_ids"] == [20, 30] and t0["prompt_token_ids"] == [1, 2, 3]
    assert t1["prompt_token_ids"] == [1, 2, 3, 20, 30, 7, 8] and t1["loss_mask"] == [1, 1]


def test_stop_lets_in_flight_episodes_finish_and_start_resumes(tmp_path: Path, store: BufferStore) -> None:
    script = Script(lambda *a: [0.1, 0.3], delay_s=0.3)
    runner = make_runner(tmp_path, store, script, n_prompts=6, concurrency=2)
    assert runner.start() and not runner.start()  # idempotent
    wait_for(lambda: runner.stats()["episodes"]["in_flight"] == 2)
    runner.stop()
    stats = runner.stats()
    assert not stats["running"] and not stats["finished"]
    assert stats["episodes"]["started"] == stats["episodes"]["completed"] >= 2
    assert stats["records"]["written"] == stats["episodes"]["completed"]  # nothing finished is lost
    runner.stop()  # idempotent
    stats, _ = run_to_end(runner, store)
    assert len(store.uids_with_prefix("t:")) == 12 and stats["records"]["written"] == 12


class HoldSample1:
    """Episodes of sample 0 finish at once; sample 1's wait until `release` is set (a slow episode)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls: dict[int, int] = {0: 0, 1: 0}

    async def __call__(self, problem: PromptRecord, *, request_headers: dict[str, str], **_: Any) -> Episode:
        sample = int(request_headers["X-SMG-Routing-Key"].split(":")[2][1:])
        self.calls[sample] += 1
        while sample == 1 and not self.release.is_set():
            await asyncio.sleep(0.01)
        return make_episode([0.1, 0.3])


@pytest.mark.parametrize("max_staleness", [0, 1])
def test_an_on_policy_stop_cancels_at_once_and_writes_no_unfinished_group(
    tmp_path: Path, max_staleness: int
) -> None:
    """max_staleness 0: what a stop would drain is dropped at the next policy version anyway, so
    the stop cancels and the unfinished group writes nothing, not even its finished sample (which
    runs again, with the group, at the next start). Otherwise the group is written short, as before."""
    rules = GroupRules(group_size=2, drop_zero_variance=False, max_staleness=max_staleness)
    with BufferStore(tmp_path / "buffer.sqlite", rules) as store:
        script = HoldSample1()
        runner = make_runner(tmp_path, store, script, n_prompts=1, concurrency=2, stop_timeout_s=0.2)
        assert runner.start()
        wait_for(lambda: runner.stats()["episodes"]["completed"] == 1 and script.calls[1] == 1)
        runner.stop()
        stats = runner.stats()
        assert stats["episodes"]["cancelled"] == 1
        written = store.uids_with_prefix("t:")
        if max_staleness == 0:
            assert not written and stats["groups"]["discarded"] == 1 and stats["groups"]["written"] == 0
        else:
            assert written == {"t:e0:s0:p0"} and stats["groups"]["short"] == 1
        script.release.set()
        stats, consumed = run_to_end(runner, store)
        uids = sorted(r["uid"] for r in consumed)
        if max_staleness == 0:  # the whole group, sample 0 run again
            assert uids == ["t:e0:s0:p0", "t:e0:s1:p0"] and script.calls == {0: 2, 1: 2}
        else:  # the given-up sample 1 forms its own small group at the next start
            assert "t:e0:s1:p0" in uids and script.calls[0] == 1


def test_a_stop_with_a_shorter_wait_cancels_after_it_not_after_the_configured_one(tmp_path: Path) -> None:
    """The server's shutdown on a signal stops the runner with a short wait (buffer_server
    SHUTDOWN_STOP_S, under scripts/stop.sh's kill): the loop must cancel after that wait, not after
    the configured stop_timeout_s (an episode on a hung engine held a stopping server until it
    was killed)."""
    rules = GroupRules(group_size=2, drop_zero_variance=False, max_staleness=1)
    with BufferStore(tmp_path / "buffer.sqlite", rules) as store:
        script = HoldSample1()
        runner = make_runner(tmp_path, store, script, n_prompts=1, concurrency=2, stop_timeout_s=3600.0)
        assert runner.start()
        wait_for(lambda: runner.stats()["episodes"]["completed"] == 1 and script.calls[1] == 1)
        runner.stop(timeout_s=0.2)
        assert not runner.running
        assert runner.stats()["episodes"]["cancelled"] == 1
        assert store.uids_with_prefix("t:") == {"t:e0:s0:p0"}  # what finished is written
        script.release.set()


class AbortTogether:
    """The first attempt of every episode waits until `n` are in flight, then all end aborted by
    the engine at once (what a weight update does to the generations it interrupts); later
    attempts complete."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.arrived = 0

    async def __call__(self, problem: PromptRecord, *, request_headers: dict[str, str], **_: Any) -> Episode:
        if self.arrived >= self.n:
            return make_episode([0.1, 0.3])
        self.arrived += 1
        while self.arrived < self.n:
            await asyncio.sleep(0.01)
        ep = make_episode([], status="aborted")
        ep.abort_reason = "generation aborted by the engine"
        return ep


def test_aborts_of_one_event_pause_once(
    tmp_path: Path, store: BufferStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Four episodes aborted by one engine event escalate the outage backoff once: the other three
    were in flight when it was seen and keep the pause as it is (each escalating took the 2-GPU
    loop's pause to 71 s)."""
    runner = make_runner(tmp_path, store, AbortTogether(4), n_prompts=2, concurrency=4)
    with caplog.at_level(logging.WARNING, logger="buffer_server.runner.agent_runner"):
        stats, records = run_to_end(runner, store)
    assert stats["episodes"]["aborted"] == 4 and len(records) == 4
    messages = [r.getMessage() for r in caplog.records]
    assert sum("pausing new work" in m for m in messages) == 1, messages
    assert sum("pause unchanged" in m for m in messages) == 3, messages


def test_curriculum_state_is_reported_and_persisted(tmp_path: Path, store: BufferStore) -> None:
    cur = CurriculumConfig(enabled=True, window=2, advance_correct_rate=0.5, advance_fast_1=None)
    runner = make_runner(tmp_path, store, Script(lambda *a: [0.3]), curriculum=cur, n_prompts=4)
    stats, _ = run_to_end(runner, store)
    c = stats["curriculum"]
    assert c["enabled"] and c["tier"] == 1 and c["level"] == 2 and c["advances"] == 1
    assert c["rates"]["1"]["correct_rate"] == 1.0
    saved = json.loads(store.get_meta("runner.curriculum"))
    assert saved["tier"] == 1


def test_config_errors_name_the_setting(tmp_path: Path) -> None:
    base = {
        "prompt_data": "x.jsonl",
        "sglang_url": "http://h:1",
        "eval_urls": ["h:2", "h:3"],
        "tokenizer": "t",
    }
    cfg = runner_config_from_dict(base)
    assert isinstance(cfg, RunnerConfig) and cfg.eval_urls == ("http://h:2", "http://h:3")
    for bad, match in (
        ({"concurrency": 0}, "concurrency: must be >= 1"),
        ({"concurency": 3}, "unknown field"),
        ({"temperature": "hot"}, "temperature: expected"),
        ({"eval_urls": "ftp://x"}, "eval_urls"),
        ({"run_id": "a b"}, "run_id"),
        ({"split": "test"}, "split"),
        ({"sampling_params": {"temperature": 0.5}}, "runner.temperature"),
    ):
        with pytest.raises(ValidationError, match=match):
            runner_config_from_dict({**base, **bad})
    with pytest.raises(ValidationError, match=r"missing required setting\(s\) \['tokenizer'\]"):
        runner_config_from_dict({k: v for k, v in base.items() if k != "tokenizer"})
    # multi-node: the eval servers come from the run's Ray fleet, so the URL list may be empty
    fleet = runner_config_from_dict({**base, "eval_urls": [], "eval_fleet": "run-1"})
    assert fleet.eval_urls == () and fleet.eval_fleet == "run-1"
    with pytest.raises(ValidationError, match="eval_urls: must not be empty"):
        runner_config_from_dict({**base, "eval_urls": []})


def test_settings_from_the_recipe_and_the_flags_in_one_call() -> None:
    """What `python -m buffer_server --recipe ... --flags` reads: the runner, episode and
    curriculum sections typed in one call, a flag (not None) winning over the recipe's key."""
    assert runner_settings(None, {"concurrency": None}) is None  # no recipe, no runner flag: no runner
    recipe = {
        "runner": {"prompt_data": "x.jsonl", "sglang_url": "h:1", "eval_urls": "h:2", "tokenizer": "t"},
        "episode": {"max_turns": 2, "reward": {"credit": "per_turn"}},
        "curriculum": {"enabled": True, "levels": [1, 2]},
    }
    settings = runner_settings(recipe, {"concurrency": 3, "epochs": None, "eval_urls": "h:4,h:5"})
    assert settings is not None
    assert settings.runner.concurrency == 3 and settings.runner.epochs == 1
    assert settings.runner.eval_urls == ("http://h:4", "http://h:5")
    assert settings.episode.max_turns == 2 and settings.episode.reward.credit == "per_turn"
    assert settings.curriculum.enabled and settings.curriculum.levels == (1, 2)
    only_flags = runner_settings(
        None, {"prompt_data": "p", "sglang_url": "s", "eval_urls": "e", "tokenizer": "t"}
    )
    assert only_flags is not None and only_flags.episode.max_turns == 3 and not only_flags.curriculum.enabled
    for section, bad, match in (
        ("curriculum", {"window": "8"}, r"kernel_rl\.curriculum\.window: expected int, got str"),
        ("curriculum", {"levels": [1, "2"]}, r"kernel_rl\.curriculum\.levels\[1\]: expected int, got str"),
        (
            "episode",
            {"reward": {"gamma": "0.4"}},
            r"kernel_rl\.episode\.reward\.gamma: expected int or float",
        ),
        ("runner", {"autostart": 1}, r"kernel_rl\.runner\.autostart: expected bool, got int"),
    ):
        broken = {**recipe, section: {**recipe[section], **bad}}
        with pytest.raises(ValidationError, match=match):
            runner_settings(broken, {})
