"""A multi-node run's other nodes, reached through its Ray cluster from the head.

`stop`: the run's eval servers (eval_fleet.stop_fleet), then, on every other live node, a Ray
task that starts `scripts/stop_node.sh RUN_ID` detached (its own session, the run's id taken out
of its environment, so it outlives the Ray worker that started it and stops the node's Ray daemons
of the run too). What stops there is what carries the run's id: the daemons scripts/join_node.sh
started with it, and everything they started. The head's own processes are scripts/stop.sh's.

    python -m slime_ext.cluster.nodes stop --run-id RUN --address 127.0.0.1:6379
    python -m slime_ext.cluster.nodes list --address 127.0.0.1:6379
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from slime_ext.cluster import eval_fleet

__all__ = ["list_nodes", "stop_nodes"]

_REPO = Path(__file__).resolve().parents[2]  # on each node: where this module was imported from
_STOP_TIMEOUT_S = 60.0


def list_nodes() -> list[dict[str, Any]]:
    """Every node of the cluster: id, address, alive, its resources (GPU, krl_eval, CPU)."""
    import ray

    return [
        {
            "node_id": n["NodeID"],
            "address": n.get("NodeManagerAddress", ""),
            "alive": bool(n.get("Alive")),
            "resources": {k: v for k, v in n.get("Resources", {}).items() if not k.startswith("node:")},
        }
        for n in ray.nodes()
    ]


def _launch_stop(run_id: str) -> str:
    """On one node: start scripts/stop_node.sh RUN_ID detached; this node's host name."""
    env = {k: v for k, v in os.environ.items() if k != "KRL_RUN_ID"}
    log = Path(tempfile.gettempdir()) / f"krl-stop-{eval_fleet.namespace(run_id)}.log"
    with open(log, "ab") as out:
        subprocess.Popen(
            ["bash", str(_REPO / "scripts" / "stop_node.sh"), run_id],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return socket.gethostname()


def stop_nodes(run_id: str) -> list[str]:
    """scripts/stop_node.sh RUN_ID on every live node but this one; the nodes' host names."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    eval_fleet.namespace(run_id)  # checks the id before anything runs
    here = ray.get_runtime_context().get_node_id()
    task = ray.remote(_launch_stop)
    refs = [
        task.options(
            num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node["node_id"], soft=False)
        ).remote(run_id)
        for node in list_nodes()
        if node["alive"] and node["node_id"] != here
    ]
    return list(ray.get(refs, timeout=_STOP_TIMEOUT_S))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["stop", "list"])
    parser.add_argument("--run-id", default=os.environ.get("KRL_RUN_ID", ""))
    parser.add_argument(
        "--address", default=os.environ.get("RAY_ADDRESS", "auto"), help="the run's Ray cluster"
    )
    args = parser.parse_args(argv)
    eval_fleet.connect(args.address, args.run_id or "nodes")
    if args.command == "list":
        for node in list_nodes():
            state = "alive" if node["alive"] else "dead"
            print(f"{node['node_id'][:12]}  {node['address']:>15}  {state:5}  {node['resources']}")
        return 0
    if not args.run_id:
        parser.error("stop needs --run-id (or KRL_RUN_ID)")
    print(f"stopped {eval_fleet.stop_fleet(args.run_id)} eval server(s) of run {args.run_id}", flush=True)
    for host in stop_nodes(args.run_id):
        print(f"stopping run {args.run_id} on {host} (scripts/stop_node.sh)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
