"""Evaluation across nodes on Ray (slime_ext/cluster/eval_fleet.py), with a real multi-node Ray
cluster on this machine (ray.cluster_utils: a head and worker nodes, each its own raylet): eval
servers in CPU mode on the "eval nodes", found through Ray by a discovering eval client; a node
lost while evaluations are in flight (they finish on the other server), its server back on a node
that joins later, and the run's servers stopped by run id."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from eval_server import samples
from eval_server.schema import EvalRequest
from slime_ext.clients.eval_client import EvalClient
from slime_ext.cluster import eval_fleet, nodes
from slime_ext.reports import run_status
from tools import status as status_tool

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

pytestmark = pytest.mark.integration

RUN = "fleet-test"
_WAIT_S = 300.0  # generous: two CPU eval servers start on two busy cores


def _wait(what: str, probe: Callable[[], Any]) -> Any:
    """Poll `probe` until it returns something truthy (state, not a sleep standing in for it)."""
    deadline = time.monotonic() + _WAIT_S
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}: {eval_fleet.fleet_status(RUN)}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def _evaluate_all(
    requests: list[EvalRequest], urls: list[str], lose: Callable[[], None]
) -> tuple[list[Any], dict[str, int]]:
    """Evaluate every request through a discovering client; `lose` a node once they are sent.
    Returns the results and the client's in-flight count per URL when the node was lost."""
    async with EvalClient(urls, max_retries=8, backoff_s=0.5, max_backoff_s=2.0, discovered=True) as client:

        async def rediscover() -> None:
            while True:
                await asyncio.sleep(1.0)
                client.set_urls(await asyncio.to_thread(eval_fleet.fleet_urls, RUN))

        keeper = asyncio.create_task(rediscover())
        tasks = [asyncio.create_task(client.evaluate(r)) for r in requests]
        await asyncio.sleep(0)  # every request has taken its server
        in_flight = client.in_flight()
        await asyncio.to_thread(lose)
        try:
            return await asyncio.gather(*tasks), in_flight
        finally:
            keeper.cancel()


def _status_window_shows_the_fleet(tmp_path: Path, rows: list[dict[str, Any]]) -> None:
    """What the eval window writes each interval, read by the status window without Ray: each
    server with its own /stats, and the nodes."""
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "run.env").write_text("export RUN_NAME=r\n")
    eval_fleet.write_status(run_dir / "fleet.json", rows)
    snap = run_status.snapshot(run_dir)
    fleet = snap["fleet"]
    assert [s["stats"]["workers_ready"] for s in fleet["servers"]] == [1, 1], fleet
    assert sum(n["alive"] for n in fleet["nodes"]) == 3  # the head and the two eval nodes
    console = Console(record=True, width=200)
    console.print(status_tool.render(snap))
    text = console.export_text()
    assert "2 of 2 servers up, 3 node(s)" in text and "eval slots 1" in text


def test_eval_fleet_across_nodes_survives_a_lost_node_and_uses_a_new_one(tmp_path: Path) -> None:
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    node_a = cluster.add_node(num_cpus=1, resources={eval_fleet.EVAL_RESOURCE: 1})
    cluster.add_node(num_cpus=1, resources={eval_fleet.EVAL_RESOURCE: 1})
    cluster.wait_for_nodes()
    try:
        eval_fleet.connect(cluster.address, RUN)
        eval_fleet.start_fleet(RUN, 2, devices="cpu", server_args=["--cpu-workers", "1"])
        urls = _wait("two eval servers", lambda: (u := eval_fleet.fleet_urls(RUN)) and len(u) == 2 and u)
        status = {row["name"]: row for row in eval_fleet.fleet_status(RUN)}
        hosts = sorted(row["node_id"] for row in status.values())
        assert len(set(hosts)) == 2 and node_a.node_id in hosts, status  # one server per eval node
        lost = next(row for row in status.values() if row["node_id"] == node_a.node_id)
        _status_window_shows_the_fleet(tmp_path, list(status.values()))

        request = EvalRequest(samples.load_problem("relu"), samples.load_candidate("relu__correct"))
        results, in_flight = asyncio.run(
            _evaluate_all([request] * 6, urls, lambda: cluster.remove_node(node_a))
        )
        assert in_flight[lost["url"]] == 3, in_flight  # the lost server had evaluations to lose
        assert [r.status for r in results] == ["ok"] * 6, [r.feedback for r in results if r.status != "ok"]
        assert not _alive(lost["pid"]), "the lost node's eval server outlived its actor"

        cluster.add_node(num_cpus=1, resources={eval_fleet.EVAL_RESOURCE: 1})  # a node joins later
        again = _wait("the lost server back", lambda: (u := eval_fleet.fleet_urls(RUN)) and len(u) == 2 and u)
        assert lost["url"] not in again or again != urls
        pids = [row["pid"] for row in eval_fleet.fleet_status(RUN)]
        assert eval_fleet.stop_fleet(RUN) == 2
        _wait("the run's actors gone", lambda: not eval_fleet.fleet_urls(RUN) and not eval_fleet._named(RUN))
        _wait("the servers stopped", lambda: not any(_alive(pid) for pid in pids))

        # the other nodes' processes of the run (here: one carrying the run's id, as the Ray
        # daemons scripts/join_node.sh starts do), stopped through Ray; an unrelated one survives
        ours = subprocess.Popen(["sleep", "600"], env={**os.environ, "KRL_RUN_ID": RUN})
        other = subprocess.Popen(["sleep", "600"], env={**os.environ, "KRL_RUN_ID": "another-run"})
        try:
            assert len(nodes.stop_nodes(RUN)) == 2  # the two live eval nodes, not the head
            _wait("the run's process on the nodes stopped", lambda: ours.poll() is not None)
            assert other.poll() is None, "stop_node.sh touched another run's process"
        finally:
            for proc in (ours, other):
                proc.kill()
                proc.wait()
    finally:
        ray.shutdown()
        cluster.shutdown()
