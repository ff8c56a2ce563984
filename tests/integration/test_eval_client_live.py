"""slime_ext.clients.eval_client against the real eval server (no doubles): results, retries, spreading."""

from __future__ import annotations

import asyncio

import pytest

from eval_server import samples
from eval_server.schema import EvalOptions
from slime_ext.clients.eval_client import EvalClient, EvalRequestError
from tests.conftest import free_port

pytestmark = pytest.mark.integration


def test_client_round_trip_and_dead_url_failover(cpu_server: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there: connection refused

    async def run() -> list:
        async with EvalClient([dead, cpu_server], backoff_s=0.01, max_retries=4) as client:
            reference = samples.load_problem("softmax")
            jobs = [
                client.evaluate_source(
                    reference, samples.load_candidate(name), options=EvalOptions(correctness_trials=2)
                )
                for name in (
                    "softmax__correct",
                    "softmax__wrong_shape",
                    "softmax__correct",
                    "softmax__correct",
                )
            ]
            results = await asyncio.gather(*jobs)
            health = await client.health()
            with pytest.raises(EvalRequestError, match="options.tolerance"):
                await client.evaluate_source(reference, "x", options=EvalOptions(tolerance="nope"))
            return [results, health]

    results, health = asyncio.run(run())
    assert [r.status for r in results] == ["ok", "incorrect", "ok", "ok"]
    assert results[0].correct and results[0].trials[0].passed
    assert results[1].trials[0].mismatch and "shape" in results[1].trials[0].mismatch
    assert health[cpu_server]["status"] == "ok"
    assert "error" in health[dead]
