"""Evaluation servers placed by Ray across the nodes of a run (multi-node mode).

Each eval server is a named Ray actor of the run's namespace (`krl-<run id>`), placed on a node
that offers the `krl_eval` resource (`scripts/join_node.sh --eval-gpus 0,1` offers 2). Eval GPUs
are not Ray GPUs: a node offers them as `krl_eval` only (and lists them in KRL_EVAL_GPU_IDS for its
actors), so slime's placement groups, which ask for Ray GPUs, never land on them. In GPU mode the
actor claims one of its node's eval GPUs with a lock file (held while the actor lives) and starts
`python -m eval_server` on it, bound to all interfaces, and answers its URL; the server gets
SIGTERM when the actor's process dies, however it dies. Actors are detached and restarted by Ray without
limit: when a node is lost, its servers come back on nodes with room, and a node that joins
later gives room to servers waiting for it.

The buffer's runner finds the servers through Ray (`fleet_urls`, every few seconds) instead of a
URL list; the eval client retries an evaluation whose server went away mid-request on another
one (nothing came back from the lost server, so nothing is counted twice).

    python -m slime_ext.cluster.eval_fleet start --run-id RUN --servers 4        # keeps them; Ctrl-C stops
    python -m slime_ext.cluster.eval_fleet status --run-id RUN
    python -m slime_ext.cluster.eval_fleet stop --run-id RUN
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from krl_common.urls import unreachable

__all__ = [
    "EVAL_GPU_IDS",
    "EVAL_RESOURCE",
    "claim_gpu",
    "connect",
    "EvalServer",
    "fleet_status",
    "fleet_urls",
    "namespace",
    "start_fleet",
    "stop_fleet",
]

EVAL_RESOURCE = "krl_eval"  # eval servers a node can host (scripts/join_node.sh --eval-gpus)
EVAL_GPU_IDS = "KRL_EVAL_GPU_IDS"  # the node's eval GPUs, in its Ray daemons' environment
ACTOR_PREFIX = "eval-"
_CALL_TIMEOUT_S = 10.0  # an actor that does not answer this fast is left out of the URL list


def namespace(run_id: str) -> str:
    """The Ray namespace of a run's actors: stopping a run touches this namespace only."""
    if not run_id or any(c.isspace() or c == "/" for c in run_id):
        raise ValueError(f"a run id without spaces or '/', got {run_id!r}")
    return f"krl-{run_id}"


def claim_gpu(run_id: str, lock_dir: Path | None = None) -> tuple[str, int]:
    """One of this node's eval GPUs (KRL_EVAL_GPU_IDS, set where the node joined) that no other
    eval server of the run holds: (its id, the descriptor of its lock, held until closed or this
    process dies). RuntimeError when none is offered or all are taken."""
    ids = [i.strip() for i in os.environ.get(EVAL_GPU_IDS, "").split(",") if i.strip()]
    if not ids:
        raise RuntimeError(
            f"this node offers {EVAL_RESOURCE} but {EVAL_GPU_IDS} is not set (scripts/join_node.sh sets it)"
        )
    lock_dir = lock_dir or Path(tempfile.gettempdir()) / f"krl-eval-{namespace(run_id)}"
    lock_dir.mkdir(parents=True, exist_ok=True)
    for gpu in ids:
        fd = os.open(lock_dir / f"gpu-{gpu}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return gpu, fd
    raise RuntimeError(f"every eval GPU of this node ({', '.join(ids)}) already serves run {run_id}")


class EvalServer:
    """One eval server on this actor's node (a Ray actor: see `start_fleet`)."""

    def __init__(self, run_id: str, devices: str, server_args: list[str], startup_timeout_s: float) -> None:
        import ray

        from krl_common.service import start_service

        self.devices = devices
        env = {}
        self.gpu = ""
        if devices == "gpu":
            self.gpu, self._claim = claim_gpu(run_id)
            env["CUDA_VISIBLE_DEVICES"] = self.gpu
        root = Path(tempfile.mkdtemp(prefix="krl-eval-"))
        # a physical id: the server pins each worker to it (CUDA_VISIBLE_DEVICES is the claim's too)
        device_args = ["--devices", "cpu"] if devices == "cpu" else ["--devices", self.gpu]
        self._service = start_service(
            "eval_server",
            ["--workdir", str(root / "server"), *device_args, *server_args],
            root,
            host="0.0.0.0",
            env=env,
            startup_timeout_s=startup_timeout_s,
            die_with_parent=True,
        )
        port = self._service.url.rsplit(":", 1)[1]
        self.node_ip = ray.util.get_node_ip_address()
        self.node_id = ray.get_runtime_context().get_node_id()
        self._url = f"http://{self.node_ip}:{port}"

    def url(self) -> str:
        """Its URL while the server runs; raises (and so leaves the URL list) once it exited."""
        code = self._service.proc.poll()
        if code is not None:
            raise RuntimeError(f"eval server exited with {code}:\n{self._service.log_tail(2000)}")
        return self._url

    def info(self) -> dict[str, Any]:
        return {
            "url": self._url,
            "node_ip": self.node_ip,
            "node_id": self.node_id,
            "pid": self._service.pid,
            "alive": self._service.proc.poll() is None,
            "devices": self.devices,
            "gpu": self.gpu,
        }


def _ray() -> Any:
    import ray

    return ray


def _named(run_id: str) -> list[str]:
    ns = namespace(run_id)
    return sorted(
        a["name"]
        for a in _ray().util.list_named_actors(all_namespaces=True)
        if a.get("namespace") == ns and a["name"].startswith(ACTOR_PREFIX)
    )


def start_fleet(
    run_id: str,
    servers: int,
    *,
    devices: str = "gpu",
    server_args: list[str] | None = None,
    startup_timeout_s: float = 600.0,
) -> list[Any]:
    """Create (or find) the run's `servers` eval-server actors; returns their handles. They start
    as Ray places them: a server waits for a node with room for it."""
    if devices not in ("gpu", "cpu"):
        raise ValueError(f"devices must be 'gpu' or 'cpu', got {devices!r}")
    if servers < 1:
        raise ValueError("servers must be >= 1")
    ray = _ray()
    actor = ray.remote(EvalServer)
    handles = []
    for i in range(servers):
        handles.append(
            actor.options(
                name=f"{ACTOR_PREFIX}{i}",
                namespace=namespace(run_id),
                lifetime="detached",
                get_if_exists=True,
                max_restarts=-1,
                num_cpus=0,
                resources={EVAL_RESOURCE: 1},
            ).remote(run_id, devices, list(server_args or []), startup_timeout_s)
        )
    return handles


def fleet_status(run_id: str, timeout_s: float = _CALL_TIMEOUT_S) -> list[dict[str, Any]]:
    """Every named eval server of the run: its info, or why it has none (starting, restarting,
    its node lost)."""
    ray = _ray()
    ns = namespace(run_id)
    rows = []
    for name in _named(run_id):
        try:
            handle = ray.get_actor(name, namespace=ns)
            rows.append({"name": name, **ray.get(handle.info.remote(), timeout=timeout_s)})
        except Exception as exc:  # noqa: BLE001 - a row saying why, never a failed listing
            rows.append({"name": name, "alive": False, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
    return rows


def fleet_urls(run_id: str, timeout_s: float = _CALL_TIMEOUT_S) -> list[str]:
    """The URLs of the run's eval servers that answer now (the buffer's runner asks every few
    seconds)."""
    ray = _ray()
    ns = namespace(run_id)
    names = _named(run_id)
    refs = []
    for name in names:
        try:
            refs.append(ray.get_actor(name, namespace=ns).url.remote())
        except ValueError:  # gone between the listing and now
            continue
    urls = []
    for ref in refs:
        try:
            urls.append(ray.get(ref, timeout=timeout_s))
        except Exception:  # noqa: BLE001, S112 - starting, restarting or dead: not a URL now
            continue
    return sorted(urls)


def stop_fleet(run_id: str) -> int:
    """Kill the run's eval-server actors (without restart); their servers get SIGTERM. Returns how
    many there were. Nothing outside the run's namespace is touched."""
    ray = _ray()
    ns = namespace(run_id)
    names = _named(run_id)
    for name in names:
        try:
            ray.kill(ray.get_actor(name, namespace=ns), no_restart=True)
        except ValueError:
            continue
    return len(names)


def connect(address: str, run_id: str, wait_s: float = 0.0) -> None:
    """Join the Ray cluster at `address` as a client of the run's namespace (once per process),
    trying again for `wait_s` while no cluster answers there (the run's head starts later)."""
    ray = _ray()
    if ray.is_initialized():
        return
    deadline = time.monotonic() + wait_s
    # ray.init blocks for minutes on an address where no cluster runs: wait for its port first
    while address != "auto" and (why := unreachable(address)) is not None:
        if time.monotonic() > deadline:
            raise ConnectionError(f"no Ray cluster at {address}: {why}")
        print(f"waiting for the Ray cluster at {address}: {why}", flush=True)
        time.sleep(5.0)
    ray.init(address=address, namespace=namespace(run_id), log_to_driver=False)


def _print_status(run_id: str) -> list[dict[str, Any]]:
    rows = fleet_status(run_id)
    for row in rows:
        state = "up" if row.get("alive") else "down"
        where = row.get("url") or row.get("error", "")
        print(f"{row['name']:>8}  {state:4}  {where}", flush=True)
    return rows


def write_status(path: Path, rows: list[dict[str, Any]]) -> None:
    """The fleet's rows and the cluster's nodes as one JSON file, replaced whole (the status
    window reads it: it needs no Ray)."""
    from krl_common.fileio import atomic_write
    from slime_ext.cluster.nodes import list_nodes

    atomic_write(path, json.dumps({"time": time.time(), "servers": rows, "nodes": list_nodes()}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["start", "status", "stop", "urls"])
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS", "auto"), help="the Ray cluster")
    parser.add_argument("--servers", type=int, default=1, help="start: eval servers in the fleet")
    parser.add_argument(
        "--devices", choices=["gpu", "cpu"], default="gpu", help="start: one GPU each, or CPU mode"
    )
    parser.add_argument("--server-args", default="", help="start: more flags for each eval server")
    parser.add_argument("--interval-s", type=float, default=10.0, help="start: status every this often")
    parser.add_argument(
        "--wait-s", type=float, default=900.0, help="start: wait this long for the Ray cluster"
    )
    parser.add_argument(
        "--status-file",
        type=Path,
        default=None,
        help="start: the fleet and the nodes, as JSON, each interval",
    )
    args = parser.parse_args(argv)
    connect(args.address, args.run_id, args.wait_s if args.command == "start" else 0.0)
    if args.command == "status":
        _print_status(args.run_id)
        return 0
    if args.command == "urls":
        print(",".join(fleet_urls(args.run_id)))
        return 0
    if args.command == "stop":
        print(f"stopped {stop_fleet(args.run_id)} eval server(s) of run {args.run_id}")
        return 0
    start_fleet(args.run_id, args.servers, devices=args.devices, server_args=args.server_args.split())
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    try:
        while not stop.is_set():
            print(time.strftime("%H:%M:%S"), f"eval fleet of run {args.run_id}:", flush=True)
            rows = _print_status(args.run_id)
            if args.status_file is not None:
                write_status(args.status_file, rows)
            stop.wait(args.interval_s)
    finally:
        print(f"stopping: {stop_fleet(args.run_id)} eval server(s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
