"""Rollout buffer server throughput: durable writes per second and batch-read latency.

Starts `python -m buffer_server` on loopback with a fresh database, then:
1. writes realistic records for `--seconds` from `--clients` threads, 8 records per POST and
   then 1 record per POST, then packed (trajectory_codec.pack_request) 8 and `--large-batch` records per
   POST; a record counts once the server answered 200 (committed with synchronous=FULL). Last,
   without HTTP, the agent runner's own path: `BufferStore.put` of parsed records, 8 per call
   (one group), from `--clients` threads into a second database in this process.
   Record: prompt 1024 tokens, response 4096 tokens (3 model turns with
   float32-valued log-probs, 2 feedback turns with mask 0), 3 eval results as the eval server
   returns them, timing metadata; ~120 kB of JSON;
2. reads `--groups` groups of `--group-size` records with one POST /batches (timeout 0),
   `--reads` times per scenario, acking each batch: the oldest groups the write phases left
   ("backlog"), and groups written just before each read ("fresh"); packed replies first (what
   the trainer's client reads), then JSON (the first JSON read turns on the server's JSON
   preparer); the latency is until the last byte of the reply is in (http.client, and httpx
   for comparison); the client's decode of the reply into TrajectoryRecords is reported apart.
Request bodies are encoded once per template and only the uids are substituted, so the
client spends its CPU on HTTP, not on JSON (the server still decodes, validates and encodes
every record). Client and server share this machine's cores.

  python bench/buffer_throughput.py --seconds 10 --clients 4 --json out.json
"""

from __future__ import annotations

import argparse
import array
import contextlib
import dataclasses
import http.client
import json
import os
import platform
import random
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from buffer_server.store.buffer_store import BufferStore  # noqa: E402
from buffer_server.store.rules import GroupRules  # noqa: E402
from eval_server.schema import EvalResult, TimingStats, TrialResult  # noqa: E402
from krl_common import fastjson  # noqa: E402
from krl_common.service import running_service  # noqa: E402
from krl_common.stats import percentile  # noqa: E402
from slime_ext.trajectory.codec import (  # noqa: E402
    PACKED_BATCH_MEDIA_TYPE,
    PACKED_MEDIA_TYPE,
    decode,
    pack_request,
    unpack_batch,
)
from slime_ext.trajectory.record import TrajectoryRecord, parse_record  # noqa: E402

PROMPT_TOKENS = 1024
RESPONSE_TOKENS = 4096
VOCAB = 151_936
UID_PLACEHOLDER = "U" * 32  # uuid4().hex has 32 characters
INSTANCE_PLACEHOLDER = "I" * 32


def eval_result_json(rng: random.Random, turn: int) -> dict:
    ok = turn == 2
    result = EvalResult(
        status="ok" if ok else "incorrect",
        compiled=True,
        correct=ok,
        trials=[
            TrialResult(seed=42 + i, passed=ok, max_abs_diff=rng.random() * (1e-6 if ok else 0.5))
            for i in range(5)
        ],
        max_abs_diff=1e-6 if ok else 0.43,
        kernel_launches=2,
        reference_timing=TimingStats(1.21, 1.18, 1.22, 0.02, 0.011, 99, 1.25),
        candidate_timing=TimingStats(0.81, 0.79, 0.82, 0.01, 0.009, 99, 0.85) if ok else None,
        speedup=1.49 if ok else None,
        feedback="Status: incorrect. Output mismatch: max abs diff 0.43 at index (3, 17) ... " * 8,
        device="cuda:0 (NVIDIA H200)",
        worker=0,
        elapsed_s=2.1,
        phases={"static": 0.007, "reference": 0.4, "correctness": 1.1, "timing": 0.6},
        problem_hash="ab" * 32,
        problem_id="level1/19_ReLU",
    )
    return result.to_json()


def make_record(rng: random.Random, instance_id: str) -> dict:
    """A 3-turn episode: model turns (mask 1) interleaved with 2 feedback turns (mask 0)."""
    segments = [(1200, 1), (300, 0), (1100, 1), (300, 0), (RESPONSE_TOKENS - 2900, 1)]
    mask: list[int] = []
    for length, m in segments:
        mask += [m] * length
    # SGLang returns float32 log-probs; as Python floats they print with up to 17 digits.
    logps = array.array("f", [-abs(rng.gauss(0, 1.5)) if m else 0.0 for m in mask]).tolist()
    return {
        "uid": UID_PLACEHOLDER,
        "instance_id": instance_id,
        "policy_version": 0,
        "prompt_token_ids": [rng.randrange(VOCAB) for _ in range(PROMPT_TOKENS)],
        "response_token_ids": [rng.randrange(VOCAB) for _ in range(RESPONSE_TOKENS)],
        "loss_mask": mask,
        "rollout_log_probs": logps,
        "turn_rewards": [0.0, 0.1, 1.2],
        "turn_eval_results": [eval_result_json(rng, t) for t in range(3)],
        "reward": rng.random(),
        "status": "completed",
        "metadata": {"gen_s": [11.2, 9.8, 10.4], "eval_s": [2.1, 2.0, 2.2], "turns": 3},
    }


class BodyTemplate:
    """A JSON body encoded once; `render()` gives every record a fresh uid and each run of
    `group_size` records (default: the whole body) one fresh instance_id, so a body holds whole
    groups."""

    content_type = "application/json"

    def __init__(self, payload: object, group_size: int | None = None) -> None:
        encoded = fastjson.dumps(payload)
        self.parts = encoded.split(UID_PLACEHOLDER.encode())
        self.group_size = group_size

    def render(self) -> bytes:
        out = [self.parts[0]]
        for part in self.parts[1:]:
            out += [uuid.uuid4().hex.encode(), part]
        pieces = b"".join(out).split(INSTANCE_PLACEHOLDER.encode())
        per_group = self.group_size or len(pieces)
        ids = [uuid.uuid4().hex.encode() for _ in range(0, len(pieces), per_group)]
        body = [pieces[0]]
        for k, piece in enumerate(pieces[1:]):
            body += [ids[k // per_group], piece]
        return b"".join(body)


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU of the server and its live children (ingest workers), or (pid None) of
    this process alone (the server is one of its children)."""
    proc = psutil.Process(pid)
    total = 0.0
    for p in [proc, *(proc.children(recursive=True) if pid is not None else [])]:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def run_threads(target: Callable[[int], None], n: int) -> float:
    """Run target(0) .. target(n - 1) in n threads; returns the seconds until all have ended."""
    t0 = time.perf_counter()
    threads = [threading.Thread(target=target, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def write_phase(
    url: str, templates: list[BodyTemplate], clients: int, seconds: float, server_pid: int
) -> dict:
    accepted = [0] * clients
    latencies: list[list[float]] = [[] for _ in range(clients)]
    body_bytes = [0] * clients
    errors: list[str] = []
    stop_at = time.perf_counter() + seconds

    def client(k: int) -> None:
        # http.client: a third of httpx's CPU per request, which the server shares the cores with.
        conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=60)
        i = k
        try:
            while time.perf_counter() < stop_at:
                template = templates[i % len(templates)]
                body = template.render()
                i += clients
                t0 = time.perf_counter()
                status, raw = _post_stdlib(conn, "/trajectories", body, template.content_type)
                latencies[k].append(time.perf_counter() - t0)
                if status != 200:
                    errors.append(f"{status}: {raw[:300]!r}")
                    return
                accepted[k] += fastjson.loads(raw)["accepted"]
                body_bytes[k] += len(body)
        finally:
            conn.close()

    commits0 = httpx.get(f"{url}/stats").json()["write_commits"]
    server_cpu0, client_cpu0 = cpu_seconds(server_pid), cpu_seconds()
    elapsed = run_threads(client, clients)
    server_cpu, client_cpu = cpu_seconds(server_pid) - server_cpu0, cpu_seconds() - client_cpu0
    commits = httpx.get(f"{url}/stats").json()["write_commits"] - commits0
    if errors:
        raise RuntimeError(f"write failed: {errors[0]}")
    lat = [x for xs in latencies for x in xs]
    return {
        "records": sum(accepted),
        "requests": len(lat),
        "commits": commits,  # group commits (one fsync of bodies, one SQLite commit each)
        "seconds": round(elapsed, 3),
        "records_per_s": round(sum(accepted) / elapsed, 1),
        "mb_per_s": round(sum(body_bytes) / elapsed / 1e6, 1),
        "request_p50_ms": round(percentile(lat, 0.5) * 1e3, 2),
        "request_p95_ms": round(percentile(lat, 0.95) * 1e3, 2),
        # CPU per record: a figure that other load on the machine changes far less than rates
        "server_cpu_ms_per_record": round(server_cpu / max(1, sum(accepted)) * 1e3, 3),
        "client_cpu_ms_per_record": round(client_cpu / max(1, sum(accepted)) * 1e3, 3),
    }


def store_phase(
    db: Path, records: list[TrajectoryRecord], group_size: int, threads: int, seconds: float
) -> dict:
    """Durable writes through `BufferStore.put` (what the in-process agent runner calls), one
    group of `group_size` fresh-uid records per call, from `threads` threads."""
    store = BufferStore(db, GroupRules(group_size=group_size, drop_zero_variance=False, max_staleness=None))
    accepted = [0] * threads
    stop_at = time.perf_counter() + seconds

    def writer(k: int) -> None:
        i = k
        while time.perf_counter() < stop_at:
            instance = uuid.uuid4().hex
            group = [
                dataclasses.replace(
                    records[(i + j) % len(records)], uid=uuid.uuid4().hex, instance_id=instance
                )
                for j in range(group_size)
            ]
            accepted[k] += store.put(group).accepted
            i += threads

    cpu0 = cpu_seconds()
    elapsed = run_threads(writer, threads)
    cpu = cpu_seconds() - cpu0
    store.close()
    return {
        "records": sum(accepted),
        "seconds": round(elapsed, 3),
        "records_per_s": round(sum(accepted) / elapsed, 1),
        "cpu_ms_per_record": round(cpu / max(1, sum(accepted)) * 1e3, 3),
    }


class PackedTemplate(BodyTemplate):
    """The same records as a packed upload (`codec.pack_request`, media type PACKED_MEDIA_TYPE),
    packed once; the placeholders have the length of what replaces them, so every length field
    in the packed body stays right."""

    content_type = PACKED_MEDIA_TYPE

    def __init__(self, payload: dict, group_size: int | None = None) -> None:
        records = [parse_record(r) for r in payload["records"]]
        self.parts = pack_request(records).split(UID_PLACEHOLDER.encode())
        self.group_size = group_size


def _post_stdlib(
    conn: http.client.HTTPConnection,
    path: str,
    payload: dict | bytes,
    content_type: str = "application/json",
    accept: str = "application/json",
) -> tuple[int, bytes]:
    body = payload if isinstance(payload, bytes) else fastjson.dumps(payload)
    conn.request("POST", path, body=body, headers={"Content-Type": content_type, "Accept": accept})
    resp = conn.getresponse()
    return resp.status, resp.read()


def _post_httpx(
    client: httpx.Client, path: str, payload: dict, accept: str = "application/json"
) -> tuple[int, bytes]:
    resp = client.post(path, content=fastjson.dumps(payload), headers={"Accept": accept})
    return resp.status_code, resp.content


def _records_of(raw: bytes, packed: bool) -> tuple[str, list[list[TrajectoryRecord]]]:
    """A batch reply as the trainer's plug-in turns it into records: its lease id and the
    records per group."""
    if packed:
        header, groups = unpack_batch(raw)
        return header["lease_id"], [[decode(body) for body in bodies] for bodies in groups]
    batch = fastjson.loads(raw)
    return batch["lease_id"], [[parse_record(r) for r in g["records"]] for g in batch["groups"]]


def _write_groups(hx: httpx.Client, group_bodies: list[BodyTemplate], n: int, offset: int) -> None:
    for g in range(n):
        hx.post(
            "/trajectories", content=group_bodies[(offset + g) % len(group_bodies)].render()
        ).raise_for_status()


def _drain(hx: httpx.Client) -> None:
    """Lease and ack every ready group, 64 at a time (one reply for a backlog of thousands of
    groups would be gigabytes, on both sides), packed (a JSON lease would turn on the server's
    JSON preparer)."""
    while True:
        reply = hx.post(
            "/batches", json={"num_groups": 64, "timeout_s": 0}, headers={"Accept": PACKED_BATCH_MEDIA_TYPE}
        )
        header, _ = unpack_batch(reply.content)
        if not header["groups"]:
            return
        hx.post("/batches/ack", json={"lease_id": header["lease_id"]}).raise_for_status()


def read_phase(
    url: str,
    group_bodies: list[BodyTemplate],
    groups: int,
    group_size: int,
    reads: int,
    scenario: str,
    client: str,
    form: str,
) -> dict:
    """`reads` timed POST /batches of `groups` groups, each acked before the next.

    scenario "backlog": the oldest ready groups, i.e. those the write phases left (written up to
    a minute before, no longer in SQLite's page cache): a trainer that fell behind. Groups are
    topped up (untimed) only if fewer than `groups` are ready.
    scenario "fresh": `groups` groups are written (untimed) just before each read, after the
    backlog was drained: a trainer that keeps up.
    client "http.client" reads the reply in one call; "httpx" in 64 kB chunks through h11
    (slower on 30 MB). form "packed": the reply the trainer's client asks for (Accept:
    PACKED_BATCH_MEDIA_TYPE, stored bodies as they lie); "json": the JSON reply. The client's
    decode of each reply into TrajectoryRecords (what the trainer's plug-in does next) is timed
    apart.
    """
    packed = form == "packed"
    accept = PACKED_BATCH_MEDIA_TYPE if packed else "application/json"
    latencies, decode_s, sizes = [], [], []
    with httpx.Client(base_url=url, timeout=120) as hx:
        conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=120)
        post = (
            partial(_post_stdlib, conn, accept=accept)
            if client == "http.client"
            else partial(_post_httpx, hx, accept=accept)
        )
        if scenario == "fresh":
            _drain(hx)
        for r in range(reads):
            if scenario == "fresh" or hx.get("/stats").json()["groups"]["ready"] < groups:
                _write_groups(hx, group_bodies, groups, r)
            t0 = time.perf_counter()
            status, raw = post("/batches", {"num_groups": groups, "timeout_s": 0})
            latencies.append(time.perf_counter() - t0)  # the whole reply has arrived
            if status != 200:
                raise RuntimeError(f"read failed: {status}: {raw[:300]!r}")
            t1 = time.perf_counter()
            lease_id, records = _records_of(raw, packed)
            decode_s.append(time.perf_counter() - t1)
            sizes.append(len(raw))
            got = [len(g) for g in records]
            if len(got) != groups or any(n != group_size for n in got):
                raise RuntimeError(f"expected {groups} groups of {group_size}, got {got}")
            hx.post("/batches/ack", json={"lease_id": lease_id}).raise_for_status()
        conn.close()
    return {
        "scenario": scenario,
        "client": client,
        "form": form,
        "groups": groups,
        "records_per_read": groups * group_size,
        "reads": reads,
        "reply_mb": round(statistics.mean(sizes) / 1e6, 1),
        "p50_ms": round(percentile(latencies, 0.5) * 1e3, 1),
        "p95_ms": round(percentile(latencies, 0.95) * 1e3, 1),
        "max_ms": round(max(latencies) * 1e3, 1),
        "client_decode_p50_ms": round(percentile(decode_s, 0.5) * 1e3, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=10.0, help="duration of each write phase")
    p.add_argument("--clients", type=int, default=4, help="concurrent writer threads")
    p.add_argument("--batch", type=int, default=8, help="records per POST in the batched write phase")
    p.add_argument(
        "--large-batch",
        type=int,
        default=32,
        help="records per POST in the second packed phase (whole groups)",
    )
    p.add_argument("--groups", type=int, default=32, help="groups per batch read")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--reads", type=int, default=10)
    p.add_argument(
        "--phases",
        default="json,json1,packed,packed_large,reads,in_process",
        help="comma-separated subset of json,json1,packed,packed_large,reads,in_process (in this order)",
    )
    p.add_argument("--db-dir", default=None, help="where the database goes (default: a temp dir)")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="extra flag for the server, e.g. --server-arg=--ingest-workers=2",
    )
    p.add_argument(
        "--server-env",
        action="append",
        default=[],
        help="KEY=VALUE for the server, e.g. SLIME_EXT_JSON=stdlib",
    )
    args = p.parse_args()

    rng = random.Random(0)
    n_templates = 16
    records = [make_record(rng, INSTANCE_PLACEHOLDER) for _ in range(n_templates)]
    record_bytes = len(fastjson.dumps(records[0]))
    batch_bodies = [
        {"records": [records[(i + j) % n_templates] for j in range(args.batch)]} for i in range(n_templates)
    ]
    batched = [BodyTemplate(body) for body in batch_bodies]
    packed = [PackedTemplate(body) for body in batch_bodies]
    # several whole groups per request: the body's records get one instance_id per group_size
    packed_large = [
        PackedTemplate(
            {"records": [records[(i + j) % n_templates] for j in range(args.large_batch)]}, args.group_size
        )
        for i in range(n_templates)
    ]
    group_bodies = [
        BodyTemplate({"records": [records[(i + j) % n_templates] for j in range(args.group_size)]})
        for i in range(n_templates)
    ]
    single = [BodyTemplate(r) for r in records]
    env = dict(kv.split("=", 1) for kv in args.server_env)
    write_phases = {
        "json": (f"write, {args.batch} per POST", args.batch, batched),
        "json1": ("write, 1 per POST", 1, single),
        "packed": (f"write packed, {args.batch}/POST", args.batch, packed),
        "packed_large": (f"write packed, {args.large_batch}/POST", args.large_batch, packed_large),
    }
    phases = set(args.phases.split(","))
    unknown = phases - {*write_phases, "reads", "in_process"}
    if unknown:
        p.error(f"--phases: unknown {sorted(unknown)}")

    with tempfile.TemporaryDirectory(dir=args.db_dir) as tmp:
        db = Path(tmp) / "bench.sqlite"
        server_args = [
            "--db",
            str(db),
            "--group-size",
            str(args.group_size),
            "--no-drop-zero-variance",
            *args.server_arg,
        ]
        with running_service("buffer_server", server_args, Path(tmp), env=env, startup_timeout_s=60) as svc:
            health = httpx.get(f"{svc.url}/health").json()
            load_before = os.getloadavg()[0]
            writes = {
                key: {
                    "label": label,
                    "records_per_post": per_post,
                    **write_phase(svc.url, templates, args.clients, args.seconds, svc.pid),
                }
                for key, (label, per_post, templates) in write_phases.items()
                if key in phases
            }
            # Packed first: the first JSON lease turns on the server's JSON preparer.
            reads = [
                read_phase(svc.url, group_bodies, args.groups, args.group_size, args.reads, *how)
                for how in (
                    ("backlog", "http.client", "packed"),
                    ("fresh", "http.client", "packed"),
                    ("backlog", "http.client", "json"),
                    ("fresh", "http.client", "json"),
                    ("fresh", "httpx", "json"),
                )
                if "reads" in phases
            ]
            stats = httpx.get(f"{svc.url}/stats").json()
        store_files = [*Path(tmp).glob("bench.sqlite*"), *Path(tmp).glob("bench.sqlite.bodies/*")]
        db_mb = sum(f.stat().st_size for f in store_files if f.is_file()) / 1e6
        parsed = [parse_record({**r, "uid": "u", "instance_id": "i"}) for r in records]
        in_process = (
            store_phase(Path(tmp) / "runner.sqlite", parsed, args.group_size, args.clients, args.seconds)
            if "in_process" in phases
            else None
        )

    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version,
            "server_json_backend": health["json_backend"],
            "server_fast_ingest": health.get("fast_ingest", False),
            "load_avg_1min_at_start": round(load_before, 2),
            "load_avg_1min_at_end": round(os.getloadavg()[0], 2),
        },
        "record_json_bytes": record_bytes,
        "clients": args.clients,
        "server_args": args.server_arg,
        "writes": writes,
        "store_put_in_process": in_process and {"records_per_call": args.group_size, **in_process},
        "reads": reads,
        "db_mb_after": round(db_mb, 1),  # database and body files, with the backlog still stored
        "records_stored": stats["records"]["total"],
        "records_held": stats["records"]["stored"],
        "server_stats": {k: stats[k] for k in ("storage", "json_cache") if k in stats},
    }
    print(f"load average (1 min) at start {load_before:.2f}, at end {os.getloadavg()[0]:.2f}")
    print(f"record: {PROMPT_TOKENS} prompt + {RESPONSE_TOKENS} response tokens, {record_bytes / 1e3:.0f} kB JSON; "
          f"server JSON backend {health['json_backend']}; {os.cpu_count()} CPUs shared by client and server")  # fmt: skip
    print(
        f"{'phase':<24}{'records/s':>10}{'MB/s':>8}{'req p50 ms':>12}{'req p95 ms':>12}"
        f"{'server CPU ms/rec':>19}{'client CPU ms/rec':>19}{'req/commit':>12}"
    )
    for w in writes.values():
        print(
            f"{w['label']:<24}{w['records_per_s']:>10}{w['mb_per_s']:>8}{w['request_p50_ms']:>12}"
            f"{w['request_p95_ms']:>12}{w['server_cpu_ms_per_record']:>19}{w['client_cpu_ms_per_record']:>19}"
            f"{w['requests'] / max(1, w['commits']):>12.2f}"
        )
    if in_process is not None:
        print(
            f"{'store.put in process':<24}{in_process['records_per_s']:>10}  ({args.group_size} per call, "
            f"{args.clients} threads, {in_process['cpu_ms_per_record']} ms CPU per record, no HTTP)"
        )
    for rd in reads:
        print(
            f"read {rd['groups']} groups x {args.group_size} {rd['form']} ({rd['reply_mb']} MB), {rd['scenario']}, "
            f"{rd['client']}: p50 {rd['p50_ms']} ms, p95 {rd['p95_ms']} ms, max {rd['max_ms']} ms; "
            f"client decode to records p50 {rd['client_decode_p50_ms']} ms"
        )
    print(
        f"on disk after the run: {result['db_mb_after']} MB for {result['records_held']} records still held "
        f"({result['records_stored']} written); server {result['server_stats']}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
