"""The buffer-mode rollout function stops waiting, with what to change, once no group can come:
the buffer's agent runner has run every group of its epochs and nothing is stored (on the H100
a 10-step run whose runner made 9 steps of data waited out max_wait_s at its last step).
`FakeBufferClient` is a TEST DOUBLE of the buffer's HTTP API (docs/BUFFER_SERVER.md: an empty
POST /batches reply, GET /stats); tests/integration/test_agent_runner.py checks the same
decision on the real server's /stats."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from slime_ext.slime_plugins import rollout
from slime_ext.slime_plugins.config import plugin_config


def _stats(finished: bool, stored: int) -> dict[str, Any]:
    return {"runner": {"finished": finished, "epochs": 10, "prompts": 2}, "records": {"stored": stored}}


def test_exhausted_only_when_the_runner_finished_and_nothing_is_stored() -> None:
    why = rollout.runner_exhausted(_stats(True, 0))
    assert why is not None and "10 epoch(s) over 2 prompt(s)" in why
    assert rollout.runner_exhausted(_stats(True, 3)) is None  # partial or leased records may still come
    assert rollout.runner_exhausted(_stats(False, 0)) is None  # running, or stopped between steps
    assert rollout.runner_exhausted({"runner": {"configured": False, "running": False}, "records": {"stored": 0}}) is None
    assert rollout.runner_exhausted(None) is None


class FakeBufferClient:
    """TEST DOUBLE: every lease is empty; /stats as given."""

    url = "http://buffer.test"

    def __init__(self, stats: dict[str, Any]) -> None:
        self._stats = stats
        self.leases = 0

    def lease(self, num_groups: int, *, timeout_s: float, lease_s: float | None = None) -> dict[str, Any]:
        self.leases += 1
        return {"lease_id": None, "groups": []}

    def stats(self) -> dict[str, Any]:
        return self._stats


def _collect(stats: dict[str, Any], max_wait_s: float) -> FakeBufferClient:
    args = SimpleNamespace(
        rollout_batch_size=2, n_samples_per_prompt=8, global_batch_size=16,
        kernel_rl={"plugins": {"buffer_url": "http://buffer.test", "batch_wait_s": 0.01, "max_wait_s": max_wait_s}},
    )  # fmt: skip
    client = FakeBufferClient(stats)
    st = rollout._BufferState(client)  # type: ignore[arg-type]
    rollout._collect(args, plugin_config(args), st, 2, "trajectory", 9)
    return client


def test_an_exhausted_runner_ends_the_wait_at_once_with_what_to_change() -> None:
    with pytest.raises(RuntimeError, match=r"0 of its 2 groups.*runner.epochs.*NUM_ROLLOUT") as err:
        _collect(_stats(True, 0), max_wait_s=3600)
    assert "10 epoch(s)" in str(err.value)


def test_a_runner_that_may_still_write_is_waited_for() -> None:
    with pytest.raises(TimeoutError):
        _collect(_stats(False, 0), max_wait_s=0.2)
