"""Problem selection (split safety), the settings fingerprint, and the run loop: resume, aborted
samples redone, a failing policy stops the run without losing finished samples."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from slime_ext.reports.chat_policy import ChatEpisode, ChatTurn
from slime_ext.reports.results import ResultsFile, load_results
from slime_ext.reports.runner import (
    TrainSplitError,
    check_splits,
    config_fingerprint,
    run_evaluation,
    select_problems,
)
from slime_ext.rollout.problems import PromptRecord
from tests.reports_fixtures import sample

pytestmark = pytest.mark.unit


def rec(iid: str, level: int, split: str) -> PromptRecord:
    return PromptRecord(
        instance_id=iid, level=level, problem_id=f"p_{iid}", name=iid, reference=f"# {iid}", split=split
    )


RECORDS = [rec("h2", 1, "holdout"), rec("h1", 1, "holdout"), rec("t1", 1, "train"), rec("h3", 2, "holdout")]


def ids(records) -> list[str]:
    return [r.instance_id for r in records]


def test_select_problems() -> None:
    assert ids(select_problems(RECORDS)) == ["h1", "h2", "h3"]
    assert ids(select_problems(RECORDS, levels=[2])) == ["h3"]
    assert ids(select_problems(RECORDS, ids=["p_h2", "h3"])) == ["h2", "h3"]
    assert ids(select_problems(RECORDS, limit_per_level=1)) == ["h1", "h3"]
    assert ids(select_problems(RECORDS, split="all", allow_train=True)) == ["h1", "h2", "t1", "h3"]
    assert ids(select_problems(RECORDS, split="train", allow_train=True)) == ["t1"]


def test_select_problems_refusals() -> None:
    for split in ("train", "all"):
        with pytest.raises(TrainSplitError, match="train split"):
            select_problems(RECORDS, split=split)
    with pytest.raises(ValueError, match="unknown problem id"):
        select_problems(RECORDS, ids=["nope"])
    with pytest.raises(ValueError, match=r"no problem matches .*\('holdout', 1\)"):
        select_problems(RECORDS, levels=[4])
    # a train problem named explicitly is still not reported from the holdout split
    with pytest.raises(ValueError, match="no problem matches"):
        select_problems(RECORDS, ids=["t1"])
    with pytest.raises(ValueError, match="split must be"):
        select_problems(RECORDS, split="test")


def test_check_splits() -> None:
    check_splits([sample("a", 0, [])], allow_train=False)
    with pytest.raises(TrainSplitError, match="1 train problem"):
        check_splits([sample("a", 0, []), sample("t", 0, [], split="train")], allow_train=False)
    check_splits([sample("t", 0, [], split="train")], allow_train=True)


def test_fingerprint_is_stable_and_sensitive() -> None:
    a = {"model": "m", "episode": {"max_turns": 3, "reward": {"gamma": 0.4}}}
    b = {"episode": {"reward": {"gamma": 0.4}, "max_turns": 3}, "model": "m"}
    assert config_fingerprint(a) == config_fingerprint(b)
    assert config_fingerprint(a) != config_fingerprint({**a, "model": "n"})


class ScriptedPolicy:
    """Episodes by script: instance_id -> status; 'raise' raises. Records the calls."""

    def __init__(self, script: dict[str, str]) -> None:
        self.script = script
        self.calls: list[tuple[str, int]] = []

    async def run(self, record: PromptRecord, sample: int) -> ChatEpisode:
        self.calls.append((record.instance_id, sample))
        await asyncio.sleep(0)
        what = self.script.get(record.instance_id, "completed")
        if what == "raise":
            raise RuntimeError("endpoint down")
        turn = ChatTurn(index=0, finish_reason="stop", text="no code")
        return ChatEpisode(problem_id=record.problem_id, messages=[], turns=[turn], status=what)


def run(policy, results, problems, k=2, concurrency=2):
    return asyncio.run(
        run_evaluation(problems, k, policy, results, model="m", concurrency=concurrency, progress=False)
    )


def test_resume_and_aborted_redo(tmp_path: Path) -> None:
    problems = select_problems(RECORDS)
    path = tmp_path / "results.jsonl"
    policy = ScriptedPolicy({"h2": "aborted"})
    out = run(policy, ResultsFile(path, "cfg"), problems)
    assert (out.planned, out.skipped, out.finished, out.aborted, out.complete) == (6, 0, 6, 2, False)
    assert sorted(policy.calls) == [(i, s) for i in ("h1", "h2", "h3") for s in (0, 1)]
    policy = ScriptedPolicy({})
    out = run(policy, ResultsFile(path, "cfg"), problems, k=3)  # h2 redone, a third sample added
    assert sorted(policy.calls) == [("h1", 2), ("h2", 0), ("h2", 1), ("h2", 2), ("h3", 2)]
    assert (out.planned, out.skipped, out.complete) == (5, 4, True)
    assert len(load_results(path)) == 11


def test_policy_failure_stops_the_run_and_keeps_finished_samples(tmp_path: Path) -> None:
    problems = select_problems(RECORDS)
    path = tmp_path / "results.jsonl"
    out = run(ScriptedPolicy({"h2": "raise"}), ResultsFile(path, "cfg"), problems, concurrency=1)
    assert out.errors == ["h2 sample 0: RuntimeError: endpoint down"] and not out.complete
    assert [(r.instance_id, r.sample) for r in load_results(path)] == [("h1", 0), ("h1", 1)]
    policy = ScriptedPolicy({})
    out = run(policy, ResultsFile(path, "cfg"), problems)
    assert out.complete and sorted(policy.calls) == [("h2", 0), ("h2", 1), ("h3", 0), ("h3", 1)]
    with pytest.raises(ValueError):
        run(policy, ResultsFile(path, "cfg"), problems, k=0)
