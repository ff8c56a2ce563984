"""The reference's facts through the real server (one CPU worker, real HTTP): the judge measures
them and hands them to the candidate's process, which never runs the float64 pass (no
`reference_precision` phase) nor reads them from the reference cache file (which candidates'
processes could write: tests/integration/test_reference_facts_from_judge.py); every evaluation,
and one after a restart, gets the same verdict and differences."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from eval_server import samples
from tests.conftest import running_eval_server

pytestmark = pytest.mark.integration


def _eval(url: str, candidate: str) -> dict:
    body = {
        "reference": samples.load_problem("softmax"),
        "candidate": samples.load_candidate(candidate),
        "options": {"correctness_trials": 2},
    }
    return httpx.post(f"{url}/eval", json=body, timeout=300).json()


def test_the_candidates_process_gets_the_judges_facts(tmp_path: Path) -> None:
    cache = tmp_path / "ref.sqlite"
    args = ("--devices", "cpu", "--cpu-workers", "1", "--ref-cache", str(cache))
    with running_eval_server(tmp_path / "a", *args) as url:
        first, second = _eval(url, "softmax__correct"), _eval(url, "softmax__correct")
        wrong = _eval(url, "softmax__wrong_shape")
    with running_eval_server(tmp_path / "b", *args) as url:  # a restarted server, same cache file
        after_restart = _eval(url, "softmax__correct")
    assert [r["status"] for r in (first, second, after_restart)] == ["ok"] * 3, first["feedback"]
    for r in (first, second, after_restart, wrong):
        assert "reference_precision" not in r["phases"] and r["phases"]["judge_precision"] > 0
    for r in (second, after_restart):
        assert (r["max_abs_diff"], r["max_rel_diff"]) == (first["max_abs_diff"], first["max_rel_diff"])
    assert wrong["status"] == "incorrect"
