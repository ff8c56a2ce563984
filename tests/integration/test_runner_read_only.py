"""`--runner-read-only` on the real CPU eval server: the candidate's process sees the file systems
read-only but its worker's directory, and evaluations still get their statuses. (The mount
namespace itself: tests/unit/test_sandbox.py; on a GPU, the MPS pipes and nvcc: tests/gpu.)"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from eval_server import samples
from tests.conftest import running_eval_server

pytestmark = pytest.mark.integration

# printed by the reference, which the runner imports before the candidate (as evaluator code)
_PROBE = """import os as _os
_cache = {cache_dir!r}
print("READ_ONLY", *(bool(_os.statvfs(p).f_flag & _os.ST_RDONLY) for p in ("/", ".", _cache)))
"""


def test_the_runner_sees_read_only_file_systems_and_evaluations_still_work(tmp_path: Path) -> None:
    # the reference cache's directory does not exist yet (a fresh machine's first evaluation):
    # the judge creates it; the runner, confined before, sees it read-only (it never opens it)
    ref_cache = tmp_path / "fresh-cache" / "ref.sqlite"
    args = ["--devices", "cpu", "--cpu-workers", "1", "--runner-read-only", "--ref-cache", str(ref_cache)]
    with running_eval_server(tmp_path / "srv", *args) as url, httpx.Client(timeout=600) as client:
        body = {
            "reference": _PROBE.format(cache_dir=str(ref_cache.parent)) + samples.load_problem("relu"),
            "candidate": samples.load_candidate("relu__correct"),
            "options": {"correctness_trials": 2},
        }
        assert client.get(f"{url}/health").json()["isolation"]["runner_read_only"] is True
        got = client.post(f"{url}/eval", json=body).json()
        wrong = client.post(f"{url}/eval", json={**body, "candidate": samples.load_candidate("relu__wrong_math")}).json()
    assert got["status"] == "ok", got["feedback"]
    assert "READ_ONLY True False True" in got["stdout_tail"], got["stdout_tail"]
    assert wrong["status"] == "incorrect"
    assert ref_cache.exists()
