"""The real buffer server as a subprocess on loopback, driven over real HTTP: validation (the
field and record index named, nothing of a rejected request stored), idempotent retries,
durability under kill -9 in the middle of a write storm, whole groups handed out exactly once to
concurrent readers."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from krl_common.service import ServiceProcess, running_service
from slime_ext.slime_plugins.buffer_client import BufferClient, BufferError
from slime_ext.trajectory.codec import PACKED_BATCH_MEDIA_TYPE, PACKED_MEDIA_TYPE, decode, pack_request
from slime_ext.trajectory.record import parse_record

pytestmark = pytest.mark.integration


@contextlib.contextmanager
def buffer_server(workdir: Path, db: Path, *args: str) -> Iterator[ServiceProcess]:
    with running_service("buffer_server", ["--db", str(db), *args], workdir, startup_timeout_s=60) as svc:
        yield svc


def record(uid: str, instance_id: str, reward: float = 0.0, version: int = 0) -> dict:
    return {
        "uid": uid,
        "instance_id": instance_id,
        "policy_version": version,
        "prompt_token_ids": [151644, 872, 198],
        "response_token_ids": [40, 1184, 264, 9, 9, 40],
        "loss_mask": [1, 1, 1, 0, 0, 1],
        "rollout_log_probs": [-0.5, -0.25, -1.0, 0.0, 0.0, -0.125],
        "turn_rewards": [reward],
        "turn_eval_results": [{"status": "ok", "feedback": "Status: ok."}],
        "reward": reward,
        "status": "completed",
        "metadata": {"gen_s": 1.5},
    }


def storm_record(uid: str) -> dict:
    """A record of 1k response tokens whose content follows from its uid (checked after kill -9)."""
    seed = sum(uid.encode())
    mask = [(seed + i) % 5 != 0 for i in range(1024)]
    return {
        **record(uid, uid, 0.5),
        "response_token_ids": [(seed * 7919 + i * 31) % 151_936 for i in range(1024)],
        "loss_mask": [int(m) for m in mask],
        "rollout_log_probs": [-((seed + i) % 97) / 64 if m else 0.0 for i, m in enumerate(mask)],
    }


def group(instance_id: str, n: int) -> list[dict]:
    return [record(f"{instance_id}-{i}", instance_id, float(i)) for i in range(n)]


def stored_total(url: str) -> int:
    return httpx.get(f"{url}/stats").json()["records"]["total"]


def drain(url: str) -> list[dict]:
    """Lease and ack every ready group; returns the groups."""
    groups: list[dict] = []
    while True:
        reply = httpx.post(f"{url}/batches", json={"num_groups": 4096, "timeout_s": 0}, timeout=60).json()
        if not reply["groups"]:
            return groups
        groups += reply["groups"]
        httpx.post(f"{url}/batches/ack", json={"lease_id": reply["lease_id"]}).raise_for_status()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("buffersrv")
    with buffer_server(tmp, tmp / "buffer.sqlite", "--group-size", "3", "--max-body-mb", "1") as svc:
        yield svc.url


@pytest.fixture(scope="module")
def server_in_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The same server with bodies parsed and validated in the server process (no ingest workers)."""
    tmp = tmp_path_factory.mktemp("buffersrv-in-process")
    args = ("--group-size", "3", "--max-body-mb", "1", "--ingest-workers", "0")
    with buffer_server(tmp, tmp / "buffer.sqlite", *args) as svc:
        yield svc.url


def test_health_stats_and_metrics(server: str) -> None:
    health = httpx.get(f"{server}/health").json()
    assert health["status"] == "ok" and health["journal_mode"] == "wal"
    stats = httpx.get(f"{server}/stats").json()
    assert stats["rules"]["group_size"] == 3 and stats["rules"]["drop_zero_variance"] is True
    assert set(stats["dropped_records"]) == {"stale", "zero_variance", "group_timeout"}
    metrics = httpx.get(f"{server}/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    assert 'rollout_buffer_dropped_records_total{reason="zero_variance"}' in metrics.text
    assert "rollout_buffer_policy_version" in metrics.text


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"{not json", "body is not valid JSON"),
        (b"", "empty body"),
        (b"[1, 2]", "body: expected a JSON object"),
        (b'{"records": [], "x": 1}', "unknown field(s) ['x']"),
        (b'{"records": []}', "records: must not be empty"),
        (b'{"records": {}}', "records: expected list, got dict"),
        (b'{"uid": "a", "reward": NaN}', "body is not valid JSON"),
        (b'{"uid": "a", "bogus": 1}', "unknown field(s) ['bogus']"),
    ],
)
def test_malformed_bodies_are_rejected(server: str, body: bytes, expected: str) -> None:
    resp = httpx.post(f"{server}/trajectories", content=body)
    assert resp.status_code == 400 and expected in resp.json()["error"]


def test_a_bad_record_rejects_its_whole_batch_and_names_field_and_index(server: str) -> None:
    before = stored_total(server)
    good = group("bad-batch", 2)
    bad = record("bad-batch-x", "bad-batch")
    bad["loss_mask"][3] = 2
    resp = httpx.post(f"{server}/trajectories", json={"records": [*good, bad]})
    assert resp.status_code == 400
    assert resp.json()["error"] == "records[2].loss_mask[3]: expected 0 or 1, got 2"
    bad = record("bad-batch-y", "bad-batch")
    bad["rollout_log_probs"][4] = -0.3
    resp = httpx.post(f"{server}/trajectories", json={"records": [bad]})
    assert "records[0].rollout_log_probs[4]: must be 0.0 where loss_mask is 0" in resp.json()["error"]
    assert stored_total(server) == before  # nothing of the rejected requests
    resp = httpx.post(f"{server}/trajectories", json={"records": good})
    assert resp.json() == {"accepted": 2, "duplicates": 0, "stale": 0}


@pytest.mark.parametrize("server_fixture", ["server", "server_in_process"])
def test_packed_upload_is_stored_and_served_like_json(
    server_fixture: str, request: pytest.FixtureRequest
) -> None:
    server = request.getfixturevalue(server_fixture)

    headers = {"Content-Type": PACKED_MEDIA_TYPE}
    packed = group("packed-a", 3)
    as_json = [{**r, "uid": r["uid"] + "-json", "instance_id": "packed-b"} for r in packed]
    before = stored_total(server)
    bad = pack_request([parse_record(r) for r in packed])[:-1]
    resp = httpx.post(f"{server}/trajectories", content=bad, headers=headers)
    assert (
        resp.status_code == 400 and "records[2]: packed body ends inside this record" in resp.json()["error"]
    )
    assert stored_total(server) == before  # nothing of the rejected request
    resp = httpx.post(
        f"{server}/trajectories", content=pack_request([parse_record(r) for r in packed]), headers=headers
    )
    assert resp.json() == {"accepted": 3, "duplicates": 0, "stale": 0}
    resp = httpx.post(
        f"{server}/trajectories", content=pack_request([parse_record(packed[0])]), headers=headers
    )
    assert resp.json() == {"accepted": 0, "duplicates": 1, "stale": 0}  # idempotent by uid, as for JSON
    httpx.post(f"{server}/trajectories", json={"records": as_json}).raise_for_status()
    served = {g["instance_id"]: g["records"] for g in drain(server)}
    strip = ("uid", "instance_id", "created_at")  # created_at: set where the record is parsed
    assert [{k: v for k, v in r.items() if k not in strip} for r in served["packed-a"]] == [
        {k: v for k, v in r.items() if k not in strip} for r in served["packed-b"]
    ]
    assert [r["uid"] for r in served["packed-a"]] == [r["uid"] for r in packed]


def test_packed_batch_reads_give_the_records_of_json_reads(server: str) -> None:
    """The trainer's client leases packed batches; they decode to the records a JSON read of the
    same lease serves, with the same lease id and group structure."""
    drain(server)
    for name in ("pk-a", "pk-b"):
        httpx.post(f"{server}/trajectories", json={"records": group(name, 3)}).raise_for_status()
    client = BufferClient(server)
    try:
        reply = client.lease(2, timeout_s=0)
        assert reply["meta"]["num_groups"] == 2 and reply["meta"]["num_records"] == 6
        assert [g["num_records"] for g in reply["groups"]] == [3, 3]
        packed = {g["instance_id"]: [decode(b) for b in g["records"]] for g in reply["groups"]}
        assert [r.uid for r in packed["pk-b"]] == ["pk-b-0", "pk-b-1", "pk-b-2"]
        client.release(reply["lease_id"])
        as_json = httpx.post(f"{server}/batches", json={"num_groups": 2, "timeout_s": 0}).json()
        assert {
            g["instance_id"]: [parse_record(r) for r in g["records"]] for g in as_json["groups"]
        } == packed
        client.ack(as_json["lease_id"])
        with pytest.raises(BufferError, match=r"HTTP 400: num_groups: missing required field"):
            client._send("POST", "/batches", {"timeout_s": 0}, accept=PACKED_BATCH_MEDIA_TYPE)
    finally:
        client.close()


def test_oversize_body_is_413_json(server: str) -> None:
    resp = httpx.post(f"{server}/trajectories", content=b"x" * (2 << 20))
    assert resp.status_code == 413 and "too large" in resp.json()["error"]


@pytest.mark.parametrize(
    ("path", "body", "code", "expected"),
    [
        ("/batches", {"num_groups": 0}, 400, "num_groups: must be an integer in [1, 4096]"),
        ("/batches", {"num_groups": True}, 400, "num_groups: expected int, got bool"),
        ("/batches", {"timeout_s": 1}, 400, "num_groups: missing required field"),
        ("/batches", {"num_groups": 1, "timeout_s": -1}, 400, "timeout_s: must be a number in [0, 600]"),
        ("/batches", {"num_groups": 1, "timeout_s": 601}, 400, "timeout_s"),
        ("/batches", {"num_groups": 1, "wait": 1}, 400, "unknown field(s) ['wait']"),
        ("/batches", {"num_groups": 1, "lease_s": 0}, 400, "lease_s"),
        ("/batches/ack", {}, 400, "lease_id: missing required field"),
        ("/batches/ack", {"lease_id": 5}, 400, "lease_id: expected str, got int"),
        ("/batches/ack", {"lease_id": "nope"}, 404, "unknown lease"),
        ("/batches/release", {"lease_id": "nope"}, 404, "unknown lease"),
        ("/policy_version", {"version": "3"}, 400, "version: expected int, got str"),
        ("/policy_version", {}, 400, "version: missing required field"),
        ("/rollout/start", {}, 409, "start the buffer server with --recipe PATH"),
        ("/rollout/start", {"go": 1}, 400, "unknown field(s) ['go']"),
        ("/rollout/stop", {"now": True}, 400, "unknown field(s) ['now']"),
    ],
)
def test_control_routes_validate_their_bodies(
    server: str, path: str, body: dict, code: int, expected: str
) -> None:
    resp = httpx.post(f"{server}{path}", json=body)
    assert resp.status_code == code and expected in resp.json()["error"]


def test_wrong_method_is_json_405(server: str) -> None:
    resp = httpx.get(f"{server}/trajectories")
    assert resp.status_code == 405 and "error" in resp.json()


def test_retries_are_idempotent(server: str) -> None:
    records = group("retry", 3)
    assert httpx.post(f"{server}/trajectories", json={"records": records}).json()["accepted"] == 3
    assert httpx.post(f"{server}/trajectories", json={"records": records}).json()["duplicates"] == 3
    again = httpx.post(f"{server}/trajectories", json=records[0]).json()  # single-record form
    assert again == {"accepted": 0, "duplicates": 1, "stale": 0}
    reply = httpx.post(f"{server}/batches", json={"num_groups": 4096, "timeout_s": 0}).json()
    mine = [g for g in reply["groups"] if g["instance_id"] == "retry"]
    assert [[r["uid"] for r in g["records"]] for g in mine] == [["retry-0", "retry-1", "retry-2"]]
    httpx.post(f"{server}/batches/ack", json={"lease_id": reply["lease_id"]}).raise_for_status()
    ack = httpx.post(f"{server}/batches/ack", json={"lease_id": reply["lease_id"]}).json()
    assert ack["already_acked"] is True


def test_lease_release_and_policy_version(tmp_path: Path) -> None:
    with buffer_server(tmp_path, tmp_path / "buffer.sqlite", "--group-size", "3") as svc:
        _lease_release_and_policy_version(svc.url)


def _lease_release_and_policy_version(server: str) -> None:
    records = [record(f"rel-{i}", "rel", float(i), version=5) for i in range(3)]
    httpx.post(f"{server}/trajectories", json={"records": records}).raise_for_status()
    first = httpx.post(f"{server}/batches", json={"num_groups": 1}).json()
    assert first["meta"]["num_groups"] == 1 and first["meta"]["num_records"] == 3
    released = httpx.post(f"{server}/batches/release", json={"lease_id": first["lease_id"]}).json()
    assert released["records_released"] == 3
    second = httpx.post(f"{server}/batches", json={"num_groups": 1, "policy_version": 5}).json()
    assert second["groups"] == first["groups"] and second["meta"]["policy_version"] == 5
    conflict = httpx.post(f"{server}/batches/ack", json={"lease_id": first["lease_id"]})
    assert conflict.status_code == 409
    httpx.post(f"{server}/batches/ack", json={"lease_id": second["lease_id"]}).raise_for_status()

    backwards = httpx.post(f"{server}/policy_version", json={"version": 4})
    assert backwards.status_code == 400 and "only move forward" in backwards.json()["error"]
    assert httpx.post(f"{server}/policy_version", json={"version": 6}).json()["policy_version"] == 6
    stale = httpx.post(f"{server}/trajectories", json=record("stale-1", "st", version=4)).json()
    assert stale == {"accepted": 1, "duplicates": 0, "stale": 1}  # 4 < 6 - 1


def test_a_waiting_batch_returns_when_its_groups_arrive(server: str) -> None:
    drain(server)
    with cf.ThreadPoolExecutor(1) as ex:
        t0 = time.monotonic()
        pending = ex.submit(
            httpx.post, f"{server}/batches", json={"num_groups": 2, "timeout_s": 30}, timeout=60
        )
        time.sleep(0.3)
        for name in ("wait-a", "wait-b"):
            httpx.post(f"{server}/trajectories", json={"records": group(name, 3)}).raise_for_status()
        reply = pending.result().json()
    assert sorted(g["instance_id"] for g in reply["groups"]) == ["wait-a", "wait-b"]
    assert time.monotonic() - t0 < 10
    httpx.post(f"{server}/batches/ack", json={"lease_id": reply["lease_id"]}).raise_for_status()


def test_concurrent_readers_get_whole_groups_exactly_once(server: str) -> None:
    drain(server)
    expected = {f"cr{i}": [f"cr{i}-0", f"cr{i}-1", f"cr{i}-2"] for i in range(40)}
    bodies = [{"records": group(f"cr{i}", 3)} for i in range(40)]
    with cf.ThreadPoolExecutor(4) as ex:
        for resp in ex.map(lambda b: httpx.post(f"{server}/trajectories", json=b), bodies):
            assert resp.json()["accepted"] == 3

    def reader() -> list[dict]:
        got = []
        with httpx.Client(base_url=server, timeout=30) as http:
            while True:
                reply = http.post("/batches", json={"num_groups": 3, "timeout_s": 0.2}).json()
                if not reply["groups"]:
                    return got
                got += reply["groups"]
                http.post("/batches/ack", json={"lease_id": reply["lease_id"]}).raise_for_status()

    start = threading.Barrier(2)

    def reader_after_barrier() -> list[dict]:
        start.wait()
        return reader()

    with cf.ThreadPoolExecutor(2) as ex:
        a, b = ex.submit(reader_after_barrier), ex.submit(reader_after_barrier)
        groups = a.result() + b.result()
    assert a.result() and b.result()  # both readers were served
    handed = sorted(g["instance_id"] for g in groups)
    assert handed == sorted(expected)  # every group once, none twice
    assert all([r["uid"] for r in g["records"]] == expected[g["instance_id"]] for g in groups)


def test_acknowledged_writes_survive_kill_9_mid_storm(tmp_path: Path) -> None:
    db = tmp_path / "storm.sqlite"
    args = ("--group-size", "1", "--no-drop-zero-variance")
    attempted: set[str] = set()
    acked: list[str] = []
    failures: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def writer(url: str, k: int) -> None:
        i = 0
        with httpx.Client(base_url=url, timeout=5) as http:
            while not stop.is_set():
                batch = [storm_record(f"w{k}-{i}-{j}") for j in range(4)]
                i += 1
                with lock:
                    attempted.update(r["uid"] for r in batch)
                try:
                    resp = http.post("/trajectories", json={"records": batch})
                except httpx.TransportError as exc:
                    with lock:
                        failures.append(type(exc).__name__)
                    time.sleep(0.01)
                    continue
                if resp.status_code == 200:
                    assert resp.json()["accepted"] == 4
                    with lock:
                        acked.extend(r["uid"] for r in batch)

    with buffer_server(tmp_path, db, *args) as svc:
        threads = [threading.Thread(target=writer, args=(svc.url, k)) for k in range(4)]
        for t in threads:
            t.start()
        time.sleep(1.5)
        with lock:
            acked_before_kill = len(acked)
        os.kill(svc.pid, signal.SIGKILL)  # only the server this test started
        svc.proc.wait(timeout=10)
        time.sleep(0.3)
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert acked_before_kill > 0 and failures, "the kill must land while writes are in flight"
    assert svc.proc.returncode == -signal.SIGKILL

    with sqlite3.connect(db) as conn:  # straight from the file, before any server touches it
        rows, distinct = conn.execute("SELECT COUNT(*), COUNT(DISTINCT uid) FROM records").fetchone()
    assert rows == distinct

    with buffer_server(tmp_path, db, *args) as svc:
        stats = httpx.get(f"{svc.url}/stats").json()
        drained = [r for g in drain(svc.url) for r in g["records"]]
        present = [r["uid"] for r in drained]
        assert len(present) == len(set(present)) == stats["records"]["total"] == rows
        assert set(acked) <= set(present)  # every acknowledged uid, exactly once
        assert set(present) <= attempted  # and nothing that was never sent
        for r in drained:  # every body intact: what was sent, field for field
            assert {k: v for k, v in r.items() if k not in ("created_at", "sample_index")} == storm_record(
                r["uid"]
            )
        retry = httpx.post(
            f"{svc.url}/trajectories", json={"records": [storm_record(u) for u in acked[:200]]}
        )
        assert retry.json()["duplicates"] == min(200, len(acked))
