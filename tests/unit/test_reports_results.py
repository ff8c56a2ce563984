"""The per-sample result record: from an episode, JSON round trip, validation, the append-only
resumable file (interrupted last line, other settings, aborted samples redone)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from eval_server.schema import Check, EvalResult
from krl_common.validation import ValidationError
from slime_ext.reports.results import (
    ResultsFile,
    latest_results,
    load_results,
    parse_sample_result,
    sample_result_from_episode,
)
from slime_ext.rollout.problems import PromptRecord
from tests.reports_fixtures import sample

pytestmark = pytest.mark.unit


@dataclass
class FakeTurn:
    index: int
    candidate: str | None = None
    eval_result: dict[str, Any] | None = None
    eval_error: str | None = None
    finish_reason: str = "stop"
    reward: float = 0.0
    gen_s: float = 0.5
    eval_s: float = 0.25
    role: str = "generator"


@dataclass
class FakeEpisode:
    turns: list[FakeTurn]
    status: str = "completed"
    abort_reason: str | None = None
    early_stopped: bool = False
    timing: dict[str, float] = field(default_factory=lambda: {"total_s": 1.0})
    messages: list[dict[str, str]] = field(default_factory=lambda: [{"role": "user", "content": "hi"}])


RECORD = PromptRecord(
    instance_id="kb_L1_1", level=1, problem_id="1_ReLU", name="ReLU", reference="x = 1", split="holdout"
)


def test_turn_statuses_from_an_episode() -> None:
    ok_but_rejected = EvalResult(
        status="ok", compiled=True, correct=True, checks=[Check(id="runtime.torch_compute", message="m")]
    )
    ep = FakeEpisode(
        turns=[
            FakeTurn(0),  # no code
            FakeTurn(1, candidate="c1", eval_error="candidate: longer than 200000 characters"),
            FakeTurn(2, candidate="c2", eval_result=ok_but_rejected.to_json()),
            FakeTurn(
                3,
                candidate="c3",
                eval_result=EvalResult(
                    status="runtime_error", compiled=True, error={"type": "TypeError", "message": "bad arg"}
                ).to_json(),
                reward=0.1,
            ),
            FakeTurn(
                4,
                candidate="c4",
                eval_result=EvalResult(
                    status="ok",
                    compiled=True,
                    correct=True,
                    speedup=1.7,
                    checks=[Check(id="runtime.excessive_speedup", message="m", severity="warn")],
                ).to_json(),
                reward=1.0,
            ),
            FakeTurn(5, candidate="c5"),  # evaluation failed (aborted episode)
        ],
        status="aborted",
        abort_reason="evaluation failed",
    )
    r = sample_result_from_episode(RECORD, 3, ep, model="m", config_id="cfg", keep_chat=True)
    assert [t.status for t in r.turns] == [
        "no_code",
        "eval_refused",
        "rejected",
        "runtime_error",
        "ok",
        "not_evaluated",
    ]
    assert [t.correct for t in r.turns] == [False, False, False, False, True, False]
    assert r.turns[1].error.startswith("candidate: longer")
    assert r.turns[2].checks == ("runtime.torch_compute",)
    assert r.turns[3].error == "TypeError: bad arg" and r.turns[3].compiled and r.turns[3].reward == 0.1
    assert r.turns[4].speedup == 1.7 and r.turns[4].checks == ("runtime.excessive_speedup",)
    assert r.aborted and r.key == ("kb_L1_1", 3) and r.problem_hash == RECORD.problem_hash
    assert r.chat == ({"role": "user", "content": "hi"},)
    assert sample_result_from_episode(RECORD, 0, ep, model="m", config_id="c").chat is None
    # JSON round trip
    again = parse_sample_result(json.loads(json.dumps(r.to_json())))
    assert again == r


def good_json() -> dict[str, Any]:
    return sample("p", 0, [("incorrect", None), ("ok", 1.5)]).to_json()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("sample"), "result.sample: missing"),
        (lambda d: d.update(extra=1), "unknown field"),
        (lambda d: d.update(status="done"), "result.status"),
        (lambda d: d.update(level=True), "result.level: expected int, got bool"),
        (lambda d: d.update(v=2), "format version"),
        (lambda d: d["turns"][0].update(status="weird"), r"result.turns\[0\].status"),
        (lambda d: d["turns"][0].update(correct=True), r"result.turns\[0\].correct"),
        (lambda d: d["turns"][1].update(turn=5), "turn indices"),
        (lambda d: d["turns"][1].update(speedup="fast"), r"result.turns\[1\].speedup"),
        (lambda d: d["turns"][1].update(checks=[1]), r"checks\[0\]"),
    ],
)
def test_validation_names_the_field(edit, message) -> None:
    data = good_json()
    edit(data)
    with pytest.raises(ValidationError, match=message):
        parse_sample_result(data)


def test_results_file_append_reopen_resume(tmp_path: Path) -> None:
    path = tmp_path / "out" / "results.jsonl"
    f = ResultsFile(path, "cfg")
    f.append(sample("a", 0, [("ok", 1.0)]))
    f.append(sample("a", 1, [("ok", 1.0)], status="aborted"))
    f.append(sample("b", 0, [("incorrect", None)]))
    reopened = ResultsFile(path, "cfg")
    assert reopened.done() == {("a", 0), ("b", 0)}  # aborted samples are redone
    reopened.append(sample("a", 1, [("compile_error", None)]))
    assert ResultsFile(path, "cfg").done() == {("a", 0), ("a", 1), ("b", 0)}
    latest = latest_results(load_results(path))
    assert [(s.instance_id, s.sample, s.status) for s in latest] == [
        ("a", 0, "completed"),
        ("a", 1, "completed"),  # the newer line wins
        ("b", 0, "completed"),
    ]
    with pytest.raises(ValueError, match="config_id"):
        reopened.append(sample("c", 0, [], config_id="other"))


def test_interrupted_last_line_is_cut_off(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    f = ResultsFile(path, "cfg")
    f.append(sample("a", 0, [("ok", 1.0)]))
    whole = path.read_bytes()
    line = json.dumps(sample("a", 1, [("ok", 1.0)]).to_json()).encode()
    path.write_bytes(whole + line[: len(line) // 2])  # a write killed half-way
    assert len(load_results(path)) == 1
    again = ResultsFile(path, "cfg")
    assert again.dropped_partial_line and path.read_bytes() == whole
    again.append(sample("a", 1, [("ok", 1.0)]))
    assert [s.sample for s in load_results(path)] == [0, 1]


def test_bad_lines_and_other_settings_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    ResultsFile(path, "cfg").append(sample("a", 0, [("ok", 1.0)]))
    with pytest.raises(ValidationError, match="other settings"):
        ResultsFile(path, "cfg2")
    before = path.read_bytes()
    path.write_bytes(before + b"{not json\n" + before)
    with pytest.raises(ValidationError, match=r"results.jsonl:2: not valid JSON"):
        ResultsFile(path, "cfg")
    path.write_bytes(before + json.dumps({**good_json(), "status": "x"}).encode() + b"\n")
    with pytest.raises(ValidationError, match=r"results.jsonl:2: result.status"):
        load_results(path)
    with pytest.raises(FileNotFoundError):
        load_results(tmp_path / "missing.jsonl")
