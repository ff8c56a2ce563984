"""The evaluation run: choose problems (split-safe), run k episodes per problem with a policy
backend, append one result line per finished sample, resume where a previous run stopped.

Policy backends (both return an episode that `results.sample_result_from_episode` reads):
- `SGLangPolicy`: SGLang `/generate`, token in / token out, through `slime_ext.rollout.episode.run_episode`
  (exactly the training episode; needs the model's tokenizer).
- `ChatPolicy`: an OpenAI-compatible `/v1/chat/completions` endpoint through
  `chat_policy.run_chat_episode` (text level; any served model).

Failures: a sample whose episode is `aborted` (eval outage, engine abort) is written as such and
evaluated again by the next run. An exception from the policy (endpoint down after retries, bad
request) stops the run: samples in flight finish and are written, nothing new starts, and the
outcome lists the errors; re-running the same command resumes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from slime_ext.clients.eval_client import EvalClient
from slime_ext.clients.sglang_client import SGLangClient
from slime_ext.reports.chat_policy import ChatClient, run_chat_episode
from slime_ext.reports.results import EpisodeLike, ResultsFile, SampleResult, sample_result_from_episode
from slime_ext.rollout.chat import ChatRenderer
from slime_ext.rollout.episode import EpisodeConfig, run_episode
from slime_ext.rollout.problems import SPLITS, PromptRecord

__all__ = [
    "SPLIT_ALL",
    "ChatPolicy",
    "Policy",
    "RunOutcome",
    "SGLangPolicy",
    "TrainSplitError",
    "check_splits",
    "config_fingerprint",
    "run_evaluation",
    "select_problems",
]

SPLIT_ALL = "all"


class TrainSplitError(ValueError):
    """Reporting on training problems was asked for without `allow_train`."""


def _refuse_train(what: str) -> TrainSplitError:
    return TrainSplitError(
        f"{what}: refusing to report on problems of the train split (the model was trained on them); "
        "evaluate the holdout split, or pass allow_train (--allow-train) to do it knowingly"
    )


def select_problems(
    records: Sequence[PromptRecord],
    *,
    split: str = "holdout",
    levels: Iterable[int] | None = None,
    ids: Iterable[str] | None = None,
    limit_per_level: int | None = None,
    allow_train: bool = False,
) -> list[PromptRecord]:
    """The problems to evaluate, ordered by (level, instance_id).

    `split`: `holdout`, `train` or `all`; anything touching `train` needs `allow_train`.
    `ids`: instance_ids or problem_ids (each must match a record). `limit_per_level`: the first N
    per level after ordering. An empty selection is an error that says what was available.
    """
    if split not in (*SPLITS, SPLIT_ALL):
        raise ValueError(f"split must be one of {', '.join((*SPLITS, SPLIT_ALL))}, got {split!r}")
    if split != "holdout" and not allow_train:
        raise _refuse_train(f"split {split!r}")
    chosen = [r for r in records if split == SPLIT_ALL or r.split == split]
    if levels is not None:
        wanted_levels = set(levels)
        chosen = [r for r in chosen if r.level in wanted_levels]
    if ids is not None:
        wanted = list(dict.fromkeys(ids))
        known = {r.instance_id for r in records} | {r.problem_id for r in records}
        unknown = [i for i in wanted if i not in known]
        if unknown:
            raise ValueError(
                f"unknown problem id(s) {unknown} (not an instance_id or problem_id of the prompt data)"
            )
        chosen = [r for r in chosen if r.instance_id in wanted or r.problem_id in wanted]
    chosen.sort(key=lambda r: (r.level, r.instance_id))
    if limit_per_level is not None:
        per_level: dict[int, int] = {}
        kept = []
        for r in chosen:
            per_level[r.level] = per_level.get(r.level, 0) + 1
            if per_level[r.level] <= limit_per_level:
                kept.append(r)
        chosen = kept
    if not chosen:
        have = sorted({(r.split, r.level) for r in records})
        raise ValueError(
            f"no problem matches split={split!r}, levels={None if levels is None else sorted(set(levels))}, "
            f"ids={None if ids is None else list(ids)}; the prompt data has (split, level): {have}"
        )
    return chosen


def check_splits(samples: Iterable[SampleResult], *, allow_train: bool) -> None:
    """Refuse results that include train problems unless allowed (reports built from a file)."""
    train = sorted({s.instance_id for s in samples if s.split == "train"})
    if train and not allow_train:
        shown = ", ".join(train[:5]) + (" ..." if len(train) > 5 else "")
        raise _refuse_train(f"{len(train)} train problem(s) in the results ({shown})")


def config_fingerprint(settings: Mapping[str, Any]) -> str:
    """A short stable id of the settings (canonical JSON, sha256)."""
    canonical = json.dumps(settings, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def episode_settings(config: EpisodeConfig) -> dict[str, Any]:
    """The episode config as plain JSON (part of the fingerprint and of the report)."""
    return json.loads(json.dumps(dataclasses.asdict(config), default=str))


# ---------------------------------------------------------------------------- policies


class Policy(Protocol):
    async def run(self, record: PromptRecord, sample: int) -> EpisodeLike: ...


class SGLangPolicy:
    """The training episode against SGLang `/generate` (one renderer shared by all episodes)."""

    def __init__(
        self, sglang: SGLangClient, tokenizer: Any, evaluator: EvalClient, config: EpisodeConfig
    ) -> None:
        self.sglang, self.tokenizer, self.evaluator, self.config = sglang, tokenizer, evaluator, config
        self.renderer = ChatRenderer(
            tokenizer,
            enable_thinking=config.enable_thinking,
            end_of_turn=config.end_of_turn,
            chat_template_kwargs=config.chat_template_kwargs,
        )

    async def run(self, record: PromptRecord, sample: int) -> EpisodeLike:
        return await run_episode(
            record,
            tokenizer=self.tokenizer,
            sglang=self.sglang,
            evaluator=self.evaluator,
            config=self.config,
            renderer=self.renderer,
        )


class ChatPolicy:
    """The text-level episode against an OpenAI-compatible chat endpoint. With `seed`, sample s
    of a problem sends seed + 1000 * s + turn (servers that honour `seed` repeat a run)."""

    def __init__(
        self, chat: ChatClient, evaluator: EvalClient, config: EpisodeConfig, seed: int | None = None
    ) -> None:
        self.chat, self.evaluator, self.config, self.seed = chat, evaluator, config, seed

    async def run(self, record: PromptRecord, sample: int) -> EpisodeLike:
        seed = None if self.seed is None else self.seed + 1000 * sample
        return await run_chat_episode(
            record, chat=self.chat, evaluator=self.evaluator, config=self.config, seed=seed
        )


# ---------------------------------------------------------------------------- the run


@dataclass
class RunOutcome:
    planned: int = 0  # samples this run had to do (not done before)
    skipped: int = 0  # samples already in the results file
    finished: int = 0  # written by this run (aborted ones included)
    aborted: int = 0
    errors: list[str] = field(default_factory=list)  # policy exceptions that stopped the run

    @property
    def complete(self) -> bool:
        return not self.errors and self.finished == self.planned and self.aborted == 0


async def run_evaluation(
    problems: Sequence[PromptRecord],
    samples_per_problem: int,
    policy: Policy,
    results: ResultsFile,
    *,
    model: str,
    concurrency: int = 8,
    keep_chat: bool = False,
    progress: bool = True,
) -> RunOutcome:
    """Run every (problem, sample) pair not yet done, `concurrency` at a time, appending results."""
    if samples_per_problem < 1 or concurrency < 1:
        raise ValueError("samples_per_problem and concurrency must be >= 1")
    done = results.done()
    pairs = [(r, s) for r in problems for s in range(samples_per_problem)]
    todo = [(r, s) for r, s in pairs if (r.instance_id, s) not in done]
    outcome = RunOutcome(planned=len(todo), skipped=len(pairs) - len(todo))
    queue: asyncio.Queue[tuple[PromptRecord, int]] = asyncio.Queue()
    for item in todo:
        queue.put_nowait(item)
    bar = _progress_bar(len(todo), enabled=progress, desc=model)
    correct = 0

    async def worker() -> None:
        nonlocal correct
        while not outcome.errors:
            try:
                record, sample = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            try:
                episode = await policy.run(record, sample)
            except Exception as exc:  # the policy failed: stop the run, keep what is done
                outcome.errors.append(f"{record.instance_id} sample {sample}: {type(exc).__name__}: {exc}")
                return
            result = sample_result_from_episode(
                record, sample, episode, model=model, config_id=results.config_id, keep_chat=keep_chat
            )
            results.append(result)
            outcome.finished += 1
            outcome.aborted += result.aborted
            correct += any(t.correct for t in result.turns)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(correct=correct, aborted=outcome.aborted)

    try:
        await asyncio.gather(*(worker() for _ in range(min(concurrency, max(len(todo), 1)))))
    finally:
        if bar is not None:
            bar.close()
    return outcome


def _progress_bar(total: int, *, enabled: bool, desc: str) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="sample", dynamic_ncols=True)
