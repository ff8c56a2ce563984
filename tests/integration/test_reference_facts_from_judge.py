"""The reference's facts that a candidate's checks use (output size, precision budget, FLOPs) come
from the judge, never from the reference cache file, on the real CPU eval server: a candidate's
process that can write that file (read-only runners off, or native code through a route the
audit hook misses) cannot sabotage the candidates evaluated after it, which in GRPO would raise its
own advantage over its group. The test writes the poisoned entry itself, under exactly the key a
candidate's process looked up before, as such a process would."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import httpx
import pytest
import torch

from eval_server import samples
from eval_server.isolation.hardening import Hardening
from eval_server.pipeline.ref_cache import RefTimingCache, cache_key
from eval_server.pipeline.reference import facts_cache_key
from eval_server.schema import EvalOptions, problem_hash
from tests.conftest import running_eval_server

pytestmark = pytest.mark.integration

# a float64 problem's precision floor with no budget: every honest fp32 output is "too imprecise"
PRECISION = {"ref_error": 0.0, "budget": 0.0, "dtype": "float64", "ref_scale": 1.0}
POISON = {"precision": PRECISION, "output_bytes": 1 << 20, "input_bytes": 1 << 20, "flops": 0, "kernels": None}


def test_a_poisoned_cache_entry_changes_no_later_verdict(tmp_path: Path) -> None:
    ref_cache = tmp_path / "ref.sqlite"
    reference = samples.load_problem("softmax")
    parts = facts_cache_key(
        problem_hash(reference), torch.device("cpu"), EvalOptions().seed, Hardening().precision_policy
    )
    RefTimingCache(ref_cache).put_facts(parts, POISON)  # what a candidate's process could write
    args = ["--devices", "cpu", "--cpu-workers", "1", "--runner-read-only", "off", "--ref-cache", str(ref_cache)]
    body = {
        "reference": reference,
        "candidate": samples.load_candidate("softmax__correct"),
        "options": {"correctness_trials": 2},
    }
    with running_eval_server(tmp_path / "srv", *args) as url, httpx.Client(timeout=600) as client:
        got = [client.post(f"{url}/eval", json=body).json() for _ in range(2)]
    assert [g["status"] for g in got] == ["ok", "ok"], got[0]["feedback"]
    with sqlite3.connect(ref_cache) as conn:  # still there, unread: the test showed something
        row = conn.execute("SELECT facts FROM ref_facts WHERE key = ?", (cache_key(parts),)).fetchone()
    assert row is not None and json.loads(row[0])["precision"] == PRECISION
