"""The agent runner: drives multi-turn episodes against SGLang and the eval server(s) and writes
their trajectories into the buffer's store, inside the buffer server process.

One background thread runs one asyncio event loop. The loop takes groups from the
`PromptSampler` (epochs, seeded shuffle, resume, curriculum) and runs each group's
`group_size` episodes with `slime_ext.rollout.episode.run_episode`, at most `concurrency` episodes at
once. A new group starts only when every started episode holds a slot (no queue builds up) and
fewer than `max_ready_groups` complete groups wait in the store unconsumed (backpressure).

Writes. A group's records are written in ONE store transaction when its last episode ends, so
the store never sees half a group (in `per_turn` credit a group has more records than
episodes, and the store counts records). Uids are deterministic,
`{run_id}:e{epoch}:s{sample}[:t{turn}]:{instance_id}`, so a rerun never duplicates and a
restarted runner skips what is already written. Episodes finished but not yet written when the
process dies are simply run again.

Failures. An episode that ends `aborted` (the engine aborted, the eval server is unreachable or
too slow, an evaluator-side status, an SGLang error, any unexpected exception) wrote nothing
trainable and is never written: as in slime, where a group with an aborted member goes back to
the data source to be generated again, the runner retries that sample index after a jittered
exponential backoff (`backoff_delay`), up to `max_episode_attempts` times; meanwhile no new group
starts (an outage pauses the runner instead of burning the dataset). A sample that runs out of
attempts is given up (counted); its group is written short and the store's group rules
(`--group-timeout-s`, `--min-group-size`) decide whether it is handed out or dropped.

Each record carries the policy version read from the store when its episode started (the oldest
weights that sampled it), the version the trainer reported with `POST /policy_version`.

Stop. In-flight episodes finish (up to `stop_timeout_s`) and the groups write what finished,
except when the store keeps only the current policy version's records (`max_staleness` 0, the
on-policy loop): then everything that was sampled before the stop is dropped at the next version,
so a stop cancels in-flight episodes at once and writes no unfinished group (its samples run
again, whole, at the next start). On an H100 the drain was 8-17 s of each 30-47 s step of the
on-policy GRPO loop (docs/GPU_TESTS.md, 2026-11-27), episodes of the next groups that the
trainer would never use.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from buffer_server.runner.config import RunnerConfig
from buffer_server.runner.curriculum import CurriculumConfig, PromptSampler, episode_outcome
from buffer_server.runner.metrics import LatencyWindow, RunnerCounters, abort_category, outage_summary
from buffer_server.runner.scheduler import GroupTask, instance_key, record_uid, written_samples
from buffer_server.store.buffer_store import BufferStore
from krl_common.backoff import backoff_delay
from krl_common.fileio import missing_local_dir
from krl_common.validation import ValidationError
from slime_ext.clients.eval_client import EvalClient
from slime_ext.clients.sglang_client import SGLangClient, SGLangError
from slime_ext.rollout.chat import ChatRenderer
from slime_ext.rollout.episode import Episode, EpisodeConfig, episode_to_samples_per_turn, run_episode
from slime_ext.rollout.problems import PromptRecord, load_prompt_records
from slime_ext.rollout.rewards import per_turn_samples
from slime_ext.trajectory.record import STATUS_ABORTED, STATUS_COMPLETED, TrajectoryRecord

__all__ = ["AgentRunner", "EpisodeFn", "RunnerError", "episode_records", "load_tokenizer"]

log = logging.getLogger("buffer_server.runner.agent_runner")

CURRICULUM_META_KEY = "runner.curriculum"
WRITE_ATTEMPTS = 8

# run_episode's signature, as the runner calls it (tests pass their own episode function).
EpisodeFn = Callable[..., Awaitable[Episode]]


class RunnerError(RuntimeError):
    """The runner cannot be configured or started (message names the setting)."""


def load_tokenizer(name_or_path: str, *, trust_remote_code: bool = False) -> Any:
    """The policy's Hugging Face tokenizer (with its chat template)."""
    from transformers import AutoTokenizer

    if (why := missing_local_dir(name_or_path, "runner.tokenizer")) is not None:
        raise RunnerError(why)
    try:
        return AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise RunnerError(f"runner.tokenizer: cannot load {name_or_path!r}: {exc}") from None


def episode_records(
    ep: Episode, task: GroupTask, sample: int, *, run_id: str, policy_version: int, extra: Mapping[str, Any]
) -> list[TrajectoryRecord]:
    """The trajectory records of one finished (not aborted) episode, validated.

    `trajectory` credit: one record, reward = the discounted return R. `per_turn` credit: one
    record per turn (`episode_to_samples_per_turn`), `sample_index` = the turn, reward = G_t, the
    turn's own reward and eval result; the last turn carries the episode's status, earlier
    turns `completed`."""
    iid = task.instance_id
    turns = ep.turns
    meta = {
        "run_id": run_id,
        "epoch": task.epoch,
        "group_sample": sample,
        "level": task.prompt.level,
        "problem_id": task.prompt.problem_id,
        "problem_hash": task.prompt.problem_hash,
        "credit": ep.credit,
        "num_turns": len(turns),
        "early_stopped": ep.early_stopped,
        "finish_reasons": [t.finish_reason for t in turns],
        "roles": [t.role for t in turns],
        "eval_errors": [t.eval_error for t in turns],
        "gen_s": [round(t.gen_s, 4) for t in turns],
        "eval_s": [round(t.eval_s, 4) for t in turns],
        "timing": {k: round(v, 4) for k, v in ep.timing.items()},
        **extra,
    }
    if not per_turn_samples(ep.credit):
        record = TrajectoryRecord(
            uid=record_uid(run_id, task.epoch, iid, sample, None),
            instance_id=iid,
            policy_version=policy_version,
            prompt_token_ids=list(ep.prompt_ids),
            response_token_ids=list(ep.response_ids),
            loss_mask=list(ep.loss_mask),
            rollout_log_probs=list(ep.rollout_log_probs),
            turn_rewards=ep.rewards,
            turn_eval_results=[t.eval_result for t in turns],
            reward=ep.reward,
            status=ep.status,
            metadata=meta,
        )
        return [record.validate()]
    records = []
    for s in episode_to_samples_per_turn(ep):
        last = s.turn == len(turns) - 1
        records.append(
            TrajectoryRecord(
                uid=record_uid(run_id, task.epoch, iid, sample, s.turn),
                instance_id=iid,
                policy_version=policy_version,
                prompt_token_ids=s.prompt_ids,
                response_token_ids=s.response_ids,
                loss_mask=s.loss_mask,
                rollout_log_probs=s.rollout_log_probs,
                turn_rewards=[turns[s.turn].reward],
                turn_eval_results=[turns[s.turn].eval_result],
                reward=s.ret,
                status=ep.status if last else STATUS_COMPLETED,
                metadata=meta,
                sample_index=s.turn,
            ).validate()
        )
    return records


class AgentRunner:
    """Runs episodes in a background thread; `start`/`stop` are called from HTTP threads."""

    def __init__(
        self,
        store: BufferStore,
        config: RunnerConfig,
        episode_config: EpisodeConfig,
        *,
        group_size: int,
        curriculum: CurriculumConfig | None = None,
        tokenizer: Any = None,
        episode_fn: EpisodeFn = run_episode,
    ) -> None:
        self.store = store
        self.config = config
        self.episode_config = episode_config
        self.group_size = group_size
        self.curriculum_config = curriculum
        self._episode_fn = episode_fn
        try:
            prompts = load_prompt_records(config.prompt_data)
        except (OSError, ValidationError) as exc:
            raise RunnerError(f"runner.prompt_data: {exc}") from None
        self.prompts: list[PromptRecord] = [
            p for p in prompts if config.split is None or p.split == config.split
        ]
        if not self.prompts:
            raise RunnerError(
                f"runner.prompt_data: {config.prompt_data} has no prompts of split {config.split!r} "
                f"({len(prompts)} records in all)"
            )
        self.tokenizer = tokenizer or load_tokenizer(
            config.tokenizer, trust_remote_code=config.trust_remote_code
        )
        self._control = threading.Lock()  # serialises start/stop
        self._lock = threading.Lock()  # guards the counters, latencies and sampler vs. stats()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stopping = threading.Event()
        self._stop_wait_s = config.stop_timeout_s  # how long the current stop lets episodes finish
        self._finished = False
        self._last_error: str | None = None
        self._last_abort: str | None = None
        self._sampler: PromptSampler | None = None
        self.counters = RunnerCounters()
        self._gen_s = LatencyWindow()
        self._eval_s = LatencyWindow()
        self._episode_s = LatencyWindow()
        # loop state
        self._active: dict[str, GroupTask] = {}  # instance_id -> running group
        self._in_flight = 0  # episodes holding a slot
        self._writing = 0  # groups being written
        self._queued = 0  # episodes waiting for a slot
        self._waiting_retry = 0
        self._pause_until = 0.0  # monotonic; set by aborts (outage backoff)
        self._consecutive_aborts = 0  # aborted episodes since the last completed one (reported)
        # The outage backoff grows with escalations, not with aborts: episodes that were already in
        # flight when an abort was seen fail from the same event (e.g. 8 generations aborted at
        # once by a weight update) and say nothing new; counting each of them took the pause to
        # 71 s in the 2-GPU loop (H200, 2026-11-27)
        self._backoff_level = 0
        self._escalated_at = -math.inf  # monotonic time of the last escalation
        self._outage_since: float | None = None  # monotonic; first abort of the current streak
        self._last_abort_category: str | None = None
        self._ready_groups = 0
        self._backpressure = False
        self._episode_tasks: set[asyncio.Task[Any]] = set()
        self._discard_unfinished = False  # a stop without drain: unfinished groups write nothing
        self.started_at: float | None = None

    # ------------------------------------------------------------------ control (any thread)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> bool:
        """Start the loop; False if it is already running (idempotent)."""
        with self._control:
            if self.running:
                return False
            self._stopping.clear()
            self._discard_unfinished = False
            self._finished = False
            self._last_error = None
            self._thread = threading.Thread(target=self._thread_main, name="agent-runner", daemon=True)
            self._thread.start()
            self.started_at = time.time()
            return True

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop starting episodes, let in-flight ones finish (up to stop_timeout_s, then cancel
        them), write what finished, and return once the loop has exited. Idempotent."""
        timeout_s = self.config.stop_timeout_s if timeout_s is None else timeout_s
        with self._control:
            thread = self._thread
            if thread is None or not thread.is_alive():
                return
            self._stop_wait_s = timeout_s
            self._stopping.set()
            self._poke()
            thread.join(timeout_s + 30.0)
            if thread.is_alive():
                log.error("agent runner did not exit within %.0f s of the stop request", timeout_s + 30.0)

    def _poke(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                loop.call_soon_threadsafe(wake.set)

    # ------------------------------------------------------------------ the loop

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception as exc:  # a bug: keep the server up, report it in /stats
            self._last_error = f"{type(exc).__name__}: {exc}"
            log.exception("agent runner crashed")
        finally:
            self._loop = self._wake = None

    def _build_sampler(self) -> PromptSampler:
        cfg = self.config
        done = written_samples(cfg.run_id, self.store.uids_with_prefix(f"{cfg.run_id}:"))
        state = self.store.get_meta(CURRICULUM_META_KEY)
        return PromptSampler(
            self.prompts,
            group_size=self.group_size,
            epochs=cfg.epochs,
            seed=cfg.shuffle_seed,
            done=lambda epoch, key: done.get((epoch, key), set()),
            curriculum=self.curriculum_config,
            state_json=state,
        )

    async def _main(self) -> None:
        cfg = self.config
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        sampler = await asyncio.to_thread(self._build_sampler)
        with self._lock:
            self._sampler = sampler
        renderer = ChatRenderer(
            self.tokenizer,
            enable_thinking=self.episode_config.enable_thinking,
            end_of_turn=self.episode_config.end_of_turn,
            chat_template_kwargs=self.episode_config.chat_template_kwargs,
        )
        sem = asyncio.Semaphore(cfg.concurrency)
        groups: set[asyncio.Task[None]] = set()
        log.info(
            "agent runner started: %d prompts, group size %d, %s", len(self.prompts), self.group_size, cfg
        )
        async with (
            SGLangClient(
                cfg.sglang_url,
                temperature=cfg.temperature,
                max_context_len=cfg.max_context_tokens,
                default_max_new_tokens=cfg.max_new_tokens,
                sampling_params=cfg.sampling_params,
                timeout_s=cfg.generate_timeout_s,
                max_retries=cfg.generate_max_retries,
                backoff_s=min(cfg.backoff_s, 1.0),
                max_backoff_s=cfg.max_backoff_s,
            ) as sglang,
            EvalClient(
                cfg.eval_urls,
                timeout_s=cfg.eval_timeout_s,
                max_retries=cfg.eval_max_retries,
                backoff_s=min(cfg.backoff_s, 0.5),
                max_backoff_s=cfg.max_backoff_s,
                max_in_flight_per_url=cfg.max_in_flight_per_eval_url,
                discovered=cfg.eval_fleet is not None,
            ) as evaluator,
        ):
            clients = (sglang, evaluator, renderer, sem)
            discovery = (
                asyncio.create_task(self._discover_eval_servers(evaluator))
                if cfg.eval_fleet is not None
                else None
            )
            while not self._stopping.is_set():
                now = time.monotonic()
                if now < self._pause_until:
                    await self._idle(self._pause_until - now)
                    continue
                if self._queued > 0:  # started episodes still wait for a slot: no new group yet
                    await self._idle(cfg.poll_s)
                    continue
                if sampler.finished:
                    if not groups:
                        self._finished = True
                        log.info("agent runner finished: every group of every epoch is written")
                        break
                    await self._idle(cfg.poll_s)
                    continue
                ready, _partial = await asyncio.to_thread(self.store.pending_groups)
                # groups whose episodes are done but whose write is under way count as ready
                self._ready_groups = len(ready) + self._writing
                self._backpressure = self._ready_groups >= cfg.max_ready_groups
                if self._backpressure:
                    self.counters.backpressure_waits += 1
                    await self._idle(cfg.poll_s)
                    continue
                blocked = set(self._active) | {iid for iid, _ in ready}
                with self._lock:
                    task = sampler.next(blocked)
                if task is None:
                    await self._idle(cfg.poll_s)
                    continue
                self._active[task.instance_id] = task
                self._queued += len(task.samples)
                self.counters.groups_scheduled += 1
                group = asyncio.create_task(self._run_group(task, sampler, clients))
                groups.add(group)
                group.add_done_callback(groups.discard)
                group.add_done_callback(self._group_done)
                await asyncio.sleep(0)  # let the group's episodes take their slots
            await self._drain(groups)
            if discovery is not None:
                discovery.cancel()
        await asyncio.to_thread(self._save_curriculum, sampler)
        log.info("agent runner stopped (%s)", "finished" if self._finished else "stop requested")

    async def _discover_eval_servers(self, evaluator: EvalClient) -> None:
        """Multi-node: keep the eval client's URLs those of the run's eval servers that Ray placed
        and that answer (servers of a lost node leave, restarted or new ones join)."""
        from slime_ext.cluster import eval_fleet

        cfg = self.config
        assert cfg.eval_fleet is not None
        while True:
            try:
                await asyncio.to_thread(eval_fleet.connect, cfg.ray_address, cfg.eval_fleet)
                urls = await asyncio.to_thread(eval_fleet.fleet_urls, cfg.eval_fleet)
                if urls != evaluator.urls:
                    log.info("eval servers of fleet %s: %s", cfg.eval_fleet, ", ".join(urls) or "none yet")
                    evaluator.set_urls(urls)
            except Exception as exc:  # noqa: BLE001 - Ray unreachable for now: keep the last list
                self._last_error = f"eval fleet discovery: {type(exc).__name__}: {exc}"
                log.warning("eval fleet discovery failed: %s", exc)
            await asyncio.sleep(cfg.eval_fleet_refresh_s)

    def _group_done(self, group: asyncio.Task[None]) -> None:
        """A group task that raised is a bug: report it (the runner goes on with other groups)."""
        if not group.cancelled() and group.exception() is not None:
            exc = group.exception()
            self._last_error = f"group failed: {type(exc).__name__}: {exc}"
            log.error("group task failed", exc_info=exc)

    async def _idle(self, timeout_s: float) -> None:
        """Sleep until something happens (an episode ends, a stop request) or the timeout."""
        assert self._wake is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=max(0.0, timeout_s))
        self._wake.clear()

    async def _drain(self, groups: set[asyncio.Task[None]]) -> None:
        """Stop: wait for in-flight episodes (bounded), then cancel the rest; groups write what
        finished. On-policy (the store's max_staleness 0) nothing unfinished is worth finishing:
        cancel at once and write no unfinished group (module doc)."""
        if not groups:
            return
        self._poke_local()
        if self.store.rules.max_staleness == 0:
            pending = set(groups)
            self._discard_unfinished = True
            log.info(
                "stop: cancelling %d in-flight episode(s) of %d group(s): the store keeps only the "
                "current policy version's records (max_staleness 0)",
                len(self._episode_tasks),
                len(pending),
            )
        else:
            _, pending = await asyncio.wait(set(groups), timeout=self._stop_wait_s)
            if pending:
                log.warning(
                    "stop: %d episode(s) still running after %.0f s: cancelling them",
                    len(self._episode_tasks),
                    self._stop_wait_s,
                )
        if pending:
            for t in list(self._episode_tasks):
                t.cancel()
            await asyncio.wait(pending, timeout=60.0)

    def _poke_local(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # ------------------------------------------------------------------ groups and episodes

    async def _run_group(self, task: GroupTask, sampler: PromptSampler, clients: tuple[Any, ...]) -> None:
        results: dict[int, list[TrajectoryRecord]] = {}
        try:
            await asyncio.gather(
                *(self._run_sample(task, k, sampler, clients, results) for k in task.samples)
            )
            records = [r for k in sorted(results) for r in results[k]]
            if self._discard_unfinished and len(results) < len(task.samples):
                self.counters.groups_discarded += 1
                return
            if records:
                self._writing += 1
                try:
                    await self._write(records)
                finally:
                    self._writing -= 1
            self.counters.groups_written += 1
            if len(results) < len(task.samples):
                self.counters.groups_short += 1
        finally:
            self._active.pop(task.instance_id, None)
            self._poke_local()

    async def _run_sample(
        self,
        task: GroupTask,
        k: int,
        sampler: PromptSampler,
        clients: tuple[Any, ...],
        results: dict[int, list[TrajectoryRecord]],
    ) -> None:
        """Run sample k of a group until it finishes (not aborted), runs out of attempts, or the runner stops."""
        cfg = self.config
        for attempt in range(1, cfg.max_episode_attempts + 1):
            if attempt > 1:
                if not await self._wait_retry(attempt - 1):
                    return
                self.counters.episodes_retried += 1
                self._queued += 1  # the first attempt was counted when the group started
            outcome = await self._attempt(task, k, attempt, clients)
            if outcome is None:  # cancelled by a stop that timed out
                return
            if outcome:
                results[k] = outcome
                self._record_outcome(task, outcome, sampler)
                await asyncio.to_thread(self._save_curriculum, sampler)
                return
            if self._stopping.is_set():
                return
        self.counters.episodes_given_up += 1
        log.warning(
            "giving up %s epoch %d sample %d after %d aborted attempts (last: %s)",
            task.instance_id,
            task.epoch,
            k,
            cfg.max_episode_attempts,
            self._last_abort,
        )

    async def _wait_retry(self, failures: int) -> bool:
        """Back off before retrying an aborted sample; False if the runner is stopping."""
        cfg = self.config
        self._waiting_retry += 1
        try:
            delay = backoff_delay(failures - 1, cfg.backoff_s, cfg.max_backoff_s)
            deadline = max(time.monotonic() + delay, self._pause_until)
            while not self._stopping.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return True
                await asyncio.sleep(min(left, cfg.poll_s))
            return False
        finally:
            self._waiting_retry -= 1

    async def _attempt(
        self, task: GroupTask, k: int, attempt: int, clients: tuple[Any, ...]
    ) -> list[TrajectoryRecord] | bool | None:
        """One episode: its records (finished), False (aborted) or None (cancelled)."""
        sglang, evaluator, renderer, sem = clients
        cfg = self.config
        uid = record_uid(cfg.run_id, task.epoch, task.instance_id, k, None)
        try:
            await sem.acquire()
        finally:
            self._queued -= 1  # counted as queued until it holds a slot (or gives up waiting)
        if self._discard_unfinished:  # an on-policy stop: no new episode for an unfinished group
            sem.release()
            return None
        try:
            self._in_flight += 1
            self.counters.episodes_started += 1
            version = self.store.policy_version
            started = time.monotonic()
            headers = {"X-SMG-Routing-Key": uid} if cfg.routing_key else None
            inner = asyncio.ensure_future(
                self._episode_fn(
                    task.prompt,
                    tokenizer=self.tokenizer,
                    sglang=sglang,
                    evaluator=evaluator,
                    config=self.episode_config,
                    renderer=renderer,
                    request_headers=headers,
                )
            )
            self._episode_tasks.add(inner)
            reason: str | None = None
            ep: Episode | None = None
            try:
                ep = await inner
                if ep.status == STATUS_ABORTED:
                    reason = ep.abort_reason or "aborted (no reason given)"
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
                self.counters.episodes_cancelled += 1
                return None
            except SGLangError as exc:
                reason = f"generate error ({type(exc).__name__}): {exc}"
            except Exception as exc:  # an unexpected failure must not kill the runner
                log.exception("episode %s failed", uid)
                reason = f"unexpected error ({type(exc).__name__}): {exc}"
            finally:
                self._episode_tasks.discard(inner)
        finally:
            self._in_flight -= 1
            sem.release()
            self._poke_local()
        if reason is not None or ep is None:
            self._on_abort(uid, attempt, reason or "no episode", started)
            return False
        self._consecutive_aborts = 0
        self._backoff_level = 0
        self._outage_since = None
        extra = {
            "attempt": attempt,
            "policy_version_at_end": self.store.policy_version,
            "episode_uid": uid,
            "instance_key": instance_key(task.instance_id),
        }
        try:
            records = episode_records(ep, task, k, run_id=cfg.run_id, policy_version=version, extra=extra)
        except ValidationError as exc:  # a bug in episode bookkeeping: never store such a record
            log.error("episode %s produced an invalid record: %s", uid, exc)
            self._on_abort(uid, attempt, f"invalid record: {exc}", started)
            return False
        with self._lock:
            self.counters.episodes_completed += 1
            if ep.status != STATUS_COMPLETED:
                self.counters.episodes_truncated += 1
            self._gen_s.extend(t.gen_s for t in ep.turns if t.gen_s > 0)
            self._eval_s.extend(t.eval_s for t in ep.turns if t.eval_s > 0)
            self._episode_s.add(time.monotonic() - started)
        return records

    def _on_abort(self, uid: str, attempt: int, reason: str, started: float) -> None:
        """Count an aborted episode; pause new work longer only if the episode started after the
        last escalation (fresh evidence that the outage persists), else keep the pause as is."""
        cfg = self.config
        category = abort_category(reason)
        with self._lock:
            self.counters.episodes_aborted += 1
            self.counters.aborts_by_reason[category] = self.counters.aborts_by_reason.get(category, 0) + 1
        self._last_abort = reason
        self._last_abort_category = category
        now = time.monotonic()
        if self._consecutive_aborts == 0:
            self._outage_since = now
        self._consecutive_aborts += 1
        if started < self._escalated_at:
            log.warning(
                "episode %s attempt %d aborted (%s): in flight when the outage was seen, pause unchanged "
                "(%.1f s left)", uid, attempt, reason, max(0.0, self._pause_until - now),
            )  # fmt: skip
            return
        delay = backoff_delay(self._backoff_level, cfg.backoff_s, cfg.max_backoff_s)
        self._backoff_level += 1
        self._escalated_at = now
        self._pause_until = max(self._pause_until, now + delay)
        log.warning(
            "episode %s attempt %d aborted (%s): pausing new work for %.1f s", uid, attempt, reason, delay
        )

    def _record_outcome(
        self, task: GroupTask, records: list[TrajectoryRecord], sampler: PromptSampler
    ) -> None:
        results = [r for rec in records for r in rec.turn_eval_results]
        correct, fast = episode_outcome(results)
        with self._lock:
            if sampler.record(task.prompt.level, correct, fast):
                self.counters.curriculum_advances += 1

    def _save_curriculum(self, sampler: PromptSampler) -> None:
        if sampler.curriculum is None:
            return
        with self._lock:
            state = sampler.curriculum.to_json()
        try:
            self.store.set_meta(CURRICULUM_META_KEY, state)
        except sqlite3.Error as exc:
            log.error("could not persist the curriculum state: %s", exc)

    async def _write(self, records: list[TrajectoryRecord]) -> None:
        cfg = self.config
        for attempt in range(WRITE_ATTEMPTS):
            try:
                result = await asyncio.to_thread(self.store.put, records)
            except sqlite3.Error as exc:
                self.counters.write_errors += 1
                delay = backoff_delay(attempt, cfg.backoff_s, cfg.max_backoff_s)
                log.error(
                    "store write of %d record(s) failed (%s); retry in %.1f s", len(records), exc, delay
                )
                await asyncio.sleep(delay)
                continue
            self.counters.records_written += result.accepted
            self.counters.records_duplicate += result.duplicates
            return
        self.counters.records_lost += len(records)
        log.error(
            "giving up writing %d record(s) (%s ...): they run again at the next start",
            len(records),
            records[0].uid,
        )

    # ------------------------------------------------------------------ observability

    def stats(self) -> dict[str, Any]:
        """The `runner` section of GET /stats."""
        c = self.counters
        with self._lock:
            sampler = self._sampler.stats() if self._sampler is not None else None
            latency = {
                "generate_turn": self._gen_s.summary(),
                "eval_turn": self._eval_s.summary(),
                "episode": self._episode_s.summary(),
            }
            counters = dataclasses.asdict(c)
        now = time.monotonic()
        curriculum = (
            sampler.pop("curriculum")
            if sampler
            else {"enabled": bool(self.curriculum_config and self.curriculum_config.enabled)}
        )
        return {
            "configured": True,
            "running": self.running,
            "stopping": self.running and self._stopping.is_set(),
            "finished": self._finished,
            "started_at": self.started_at,
            "last_error": self._last_error,
            "run_id": self.config.run_id,
            "prompts": len(self.prompts),
            "group_size": self.group_size,
            "concurrency": self.config.concurrency,
            "epochs": self.config.epochs,
            "epoch": sampler["epoch"] if sampler else None,
            "policy_version": self.store.policy_version,
            "episodes": {
                "started": counters["episodes_started"],
                "completed": counters["episodes_completed"],
                "truncated": counters["episodes_truncated"],
                "aborted": counters["episodes_aborted"],
                "retried": counters["episodes_retried"],
                "given_up": counters["episodes_given_up"],
                "cancelled": counters["episodes_cancelled"],
                "in_flight": self._in_flight,
                "queued": self._queued,
                "waiting_retry": self._waiting_retry,
            },
            "aborts_by_reason": counters["aborts_by_reason"],
            "last_abort_reason": self._last_abort,
            "outage_pause_s": round(max(0.0, self._pause_until - now), 3),
            "outage": outage_summary(
                self._consecutive_aborts, self._outage_since, self._last_abort_category, now
            ),
            "groups": {
                "scheduled": counters["groups_scheduled"],
                "written": counters["groups_written"],
                "short": counters["groups_short"],
                "discarded": counters["groups_discarded"],
                "in_flight": len(self._active),
            },
            "records": {
                "written": counters["records_written"],
                "duplicates": counters["records_duplicate"],
                "write_errors": counters["write_errors"],
                "lost": counters["records_lost"],
            },
            "backpressure": {
                "waiting": self._backpressure,
                "waits": counters["backpressure_waits"],
                "ready_groups": self._ready_groups,
                "max_ready_groups": self.config.max_ready_groups,
            },
            "latency": latency,
            "sampler": sampler,
            "curriculum": {**curriculum, "advances": counters["curriculum_advances"]},
        }
