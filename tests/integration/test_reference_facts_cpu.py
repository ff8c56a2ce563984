"""The reference's facts through the real server (one CPU worker, real HTTP): the second
evaluation of a problem reads them from the server's reference cache (no float64 pass, no
`reference_precision` phase) and gets the same verdict and differences; a restart keeps them."""

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


def test_second_evaluation_reads_the_facts(tmp_path: Path) -> None:
    cache = tmp_path / "ref.sqlite"
    args = ("--devices", "cpu", "--cpu-workers", "1", "--ref-cache", str(cache))
    with running_eval_server(tmp_path / "a", *args) as url:
        first, second = _eval(url, "softmax__correct"), _eval(url, "softmax__correct")
        wrong = _eval(url, "softmax__wrong_shape")
    with running_eval_server(tmp_path / "b", *args) as url:  # a restarted server, same cache file
        after_restart = _eval(url, "softmax__correct")
    assert [r["status"] for r in (first, second, after_restart)] == ["ok"] * 3, first["feedback"]
    assert "reference_precision" in first["phases"]
    for r in (second, after_restart):
        assert "reference_precision" not in r["phases"]
        assert (r["max_abs_diff"], r["max_rel_diff"]) == (first["max_abs_diff"], first["max_rel_diff"])
    assert wrong["status"] == "incorrect" and "reference_precision" not in wrong["phases"]
