"""Unit tests of buffer_server.store (BufferStore) against a temporary SQLite file: idempotency, whole groups
handed out exactly once (lease / ack / release / expiry), the group rules and their persistent
counters, restart, and all-or-nothing batches. Time-based rules run on a fake clock."""

from __future__ import annotations

import contextlib
import dataclasses
import random
import sqlite3
import threading
import time

import pytest

from buffer_server.store.buffer_store import BufferStore
from buffer_server.store.preparer import PREPARE_INTERVAL_S
from buffer_server.store.results import InstanceCounts, LeaseError, PolicyVersionError, StoreError
from buffer_server.store.rules import GroupRules
from krl_common import fastjson
from slime_ext.trajectory import codec
from slime_ext.trajectory.record import TrajectoryRecord, parse_record

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def rec(uid: str, instance_id: str = "p0", reward: float = 0.0, version: int = 0) -> TrajectoryRecord:
    return parse_record(
        {
            "uid": uid,
            "instance_id": instance_id,
            "policy_version": version,
            "prompt_token_ids": [1, 2, 3],
            "response_token_ids": [4, 5, 6, 7],
            "loss_mask": [1, 1, 0, 1],
            "rollout_log_probs": [-0.25, -1.5, 0.0, -0.125],
            "turn_rewards": [reward],
            "turn_eval_results": [{"status": "ok", "feedback": "Status: ok."}],
            "reward": reward,
            "status": "completed",
            "metadata": {"n": len(uid)},
        }
    )


def group(
    instance_id: str, n: int, *, version: int = 0, rewards: list[float] | None = None
) -> list[TrajectoryRecord]:
    rewards = rewards if rewards is not None else [float(i) for i in range(n)]
    return [rec(f"{instance_id}-{i}", instance_id, rewards[i], version) for i in range(n)]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def open_store(tmp_path, clock):
    opened: list[BufferStore] = []

    def _open(**rules) -> BufferStore:
        store = BufferStore(tmp_path / "buffer.sqlite", GroupRules(**rules), clock=clock)
        opened.append(store)
        return store

    yield _open
    for store in opened:
        store.close()


def uids(lease) -> dict[str, list[str]]:
    return {g.instance_id: [r["uid"] for r in g.decoded()] for g in lease.groups}


def store_invariants_hold(store: BufferStore) -> bool:
    """Invariants: rows exist exactly for the records that are ready or leased (consumed and
    dropped ones are pruned), each points at its own readable body, every body segment on disk
    but the one being appended to holds a stored record, and ready_groups is exactly the
    aggregate of the ready records."""
    with sqlite3.connect(store.path) as conn:
        rows = conn.execute("SELECT uid, state, segment, offset, length FROM records").fetchall()
        kept = sorted(conn.execute("SELECT * FROM ready_groups"))
        computed = sorted(
            conn.execute(
                "SELECT instance_id, COUNT(*), MIN(seq), MIN(stored_at), MIN(reward), MAX(reward), "
                "MIN(policy_version) FROM records WHERE state = 'ready' GROUP BY instance_id"
            )
        )
    if kept != computed:
        return False
    for uid, state, segment, offset, length in rows:
        if (
            state not in ("ready", "leased")
            or codec.decode(store._bodies.read(segment, offset, length)).uid != uid
        ):
            return False
    on_disk = set(store._bodies.segments()) - {store._bodies.active}
    return on_disk <= {segment for _, _, segment, _, _ in rows}


def test_database_is_wal_with_full_sync(open_store):
    store = open_store()
    assert store.pragma("journal_mode") == "wal"
    assert store.pragma("synchronous") == 2  # FULL


def test_writes_are_idempotent_by_uid(open_store):
    store = open_store(group_size=4)
    first = store.put(group("p0", 3))
    assert (first.accepted, first.duplicates, first.stale) == (3, 0, 0)
    retry = store.put(group("p0", 3))
    assert (retry.accepted, retry.duplicates) == (0, 3)
    mixed = store.put([rec("p0-2", "p0"), rec("new", "p0", 5.0), rec("new", "p0", 5.0)])
    assert (mixed.accepted, mixed.duplicates) == (1, 2)  # a uid twice in one batch counts once
    stats = store.stats()
    assert stats["records"]["total"] == 4 and stats["records"]["duplicates"] == 5
    assert stats["records"]["ready"] == 4


def test_first_write_of_a_uid_wins(open_store):
    store = open_store(group_size=2)
    store.put([rec("a", "p0", 1.0), rec("b", "p0", 2.0)])
    store.put([rec("a", "p0", 99.0)])  # same uid, other content: a duplicate, not an update
    lease = store.lease(1)
    assert [r["reward"] for r in lease.groups[0].decoded()] == [1.0, 2.0]


def test_a_group_is_handed_out_whole_and_once(open_store):
    store = open_store(group_size=4)
    records = group("p0", 4)
    store.put(records[:3])
    assert store.lease(1).groups == []  # 3 of 4: not ready
    store.put(records[3:])
    lease = store.lease(5)
    assert lease.lease_id is not None and lease.num_records == 4
    assert uids(lease) == {"p0": ["p0-0", "p0-1", "p0-2", "p0-3"]}  # arrival order
    assert [r for r in lease.groups[0].decoded()] == [r.to_json() for r in records]  # exact round trip
    assert store.lease(5).groups == []  # leased: nobody else gets it
    assert store.stats()["records"]["leased"] == 4
    ack = store.ack(lease.lease_id)
    assert (ack.groups, ack.records, ack.already) == (1, 4, False)
    assert store.lease(5).groups == []
    stats = store.stats()
    assert stats["records"]["consumed"] == 4 and stats["records"]["stored"] == 0
    assert stats["groups"]["consumed"] == 1
    assert store.put(records).duplicates == 4  # consumed uids stay known
    assert store_invariants_hold(store)


def test_a_group_includes_records_beyond_group_size(open_store):
    store = open_store(group_size=4)
    store.put(group("p0", 6))
    assert [len(g.records) for g in store.lease(2).groups] == [6]


def test_records_arriving_after_a_lease_form_the_next_group(open_store):
    store = open_store(group_size=2)
    store.put(group("p0", 2))
    first = store.lease(1)
    store.put([rec("late-0", "p0", 0.0), rec("late-1", "p0", 1.0)])
    second = store.lease(1)
    assert uids(first) == {"p0": ["p0-0", "p0-1"]}
    assert uids(second) == {"p0": ["late-0", "late-1"]}


def test_groups_come_oldest_first_and_max_groups_is_honoured(open_store):
    store = open_store(group_size=2)
    for name in ("a", "b", "c"):
        store.put(group(name, 2))
    assert [g.instance_id for g in store.lease(2).groups] == ["a", "b"]
    assert [g.instance_id for g in store.lease(2).groups] == ["c"]


def test_an_expired_lease_is_handed_out_again(open_store, clock):
    store = open_store(group_size=2, lease_s=30.0)
    store.put(group("p0", 2))
    first = store.lease(1)
    assert first.expires_at == pytest.approx(clock.now + 30.0)
    clock.advance(31.0)
    with pytest.raises(LeaseError) as exc:
        store.ack(first.lease_id)
    assert exc.value.code == 409 and "expired" in str(exc.value)
    second = store.lease(1)
    assert second.lease_id != first.lease_id and uids(second) == uids(first)
    assert store.ack(second.lease_id).records == 2
    stats = store.stats()
    assert stats["leases"]["expired"] == 1 and stats["records"]["redelivered"] == 2
    assert stats["groups"]["leased_total"] == 2 and stats["groups"]["consumed"] == 1


def test_lease_s_per_call_overrides_the_default(open_store, clock):
    store = open_store(group_size=1, min_group_size=1, drop_zero_variance=False, lease_s=300.0)
    store.put([rec("a")])
    lease = store.lease(1, lease_s=5.0)
    clock.advance(6.0)
    assert uids(store.lease(1)) == uids(lease)


def test_ack_is_idempotent_and_release_gives_groups_back(open_store):
    store = open_store(group_size=2)
    store.put(group("p0", 2) + group("p1", 2))
    lease = store.lease(1)
    assert store.ack(lease.lease_id).already is False
    assert store.ack(lease.lease_id).already is True  # a retried ack
    with pytest.raises(LeaseError) as exc:
        store.release(lease.lease_id)
    assert exc.value.code == 409

    other = store.lease(1)
    assert store.release(other.lease_id) == 2
    assert store.release(other.lease_id) == 0  # idempotent
    with pytest.raises(LeaseError) as exc:
        store.ack(other.lease_id)
    assert exc.value.code == 409 and "released" in str(exc.value)
    assert uids(store.lease(1)) == uids(other)  # ready again at once
    for call in (store.ack, store.release):
        with pytest.raises(LeaseError) as exc:
            call("no-such-lease")
        assert exc.value.code == 404
    assert store.stats()["leases"]["released"] == 1


def test_timed_out_partial_groups_are_kept_or_dropped_by_min_size(open_store, clock):
    store = open_store(group_size=4, min_group_size=2, group_timeout_s=60.0)
    store.put(group("big", 2) + group("small", 1))
    clock.advance(59.0)
    assert store.lease(5).groups == []
    stats = store.stats()
    assert stats["groups"]["partial"] == 2 and stats["groups"]["partial_records"] == 3
    clock.advance(2.0)
    lease = store.lease(5)
    assert uids(lease) == {"big": ["big-0", "big-1"]}
    stats = store.stats()
    assert stats["dropped_records"]["group_timeout"] == 1
    assert stats["dropped_groups"]["group_timeout"] == 1
    assert stats["records"]["dropped"] == 1 and stats["groups"]["partial"] == 0
    assert store_invariants_hold(store)


def test_group_timeout_none_waits_forever(open_store, clock):
    store = open_store(group_size=4, group_timeout_s=None)
    store.put(group("p0", 1))
    clock.advance(10**7)
    assert store.lease(1).groups == []
    assert store.stats()["groups"]["partial"] == 1


def test_zero_variance_groups_are_dropped_and_counted(open_store):
    store = open_store(group_size=3)
    store.put(group("flat", 2, rewards=[1.0, 1.0]))
    assert store.stats()["dropped_records"]["zero_variance"] == 0  # partial: not judged yet
    store.put([rec("flat-2", "flat", 1.0)] + group("mixed", 3, rewards=[1.0, 1.0, 0.5]))
    assert uids(store.lease(5)) == {"mixed": ["mixed-0", "mixed-1", "mixed-2"]}
    stats = store.stats()
    assert stats["dropped_records"]["zero_variance"] == 3
    assert stats["dropped_groups"]["zero_variance"] == 1
    assert store_invariants_hold(store)


def test_zero_variance_groups_are_kept_when_the_rule_is_off(open_store):
    store = open_store(group_size=2, drop_zero_variance=False)
    store.put(group("flat", 2, rewards=[0.0, 0.0]))
    assert len(store.lease(1).groups) == 1


def test_stale_records_are_dropped_on_arrival_and_when_the_version_moves(open_store):
    store = open_store(group_size=2, max_staleness=1)
    assert store.set_policy_version(3) == 0
    result = store.put([rec("old", "p0", 0.0, version=1), rec("ok", "p0", 1.0, version=2)])
    assert (result.accepted, result.stale) == (2, 1)
    assert store.put([rec("old", "p0", 0.0, version=1)]).duplicates == 1  # a stale uid stays known
    store.put([rec("ok2", "p1", 1.0, version=2)])
    assert store.set_policy_version(3) == 0  # same version: nothing moves
    assert store.set_policy_version(4) == 2  # version 2 < 4 - 1
    stats = store.stats()
    assert stats["dropped_records"]["stale"] == 3 and stats["policy_version"] == 4
    assert stats["records"]["ready"] == 0
    with pytest.raises(PolicyVersionError, match="version: 3 < current 4"):
        store.set_policy_version(3)
    assert store_invariants_hold(store)


def test_stale_leased_groups_are_not_pulled_back(open_store):
    store = open_store(group_size=2, max_staleness=0)
    store.put(group("p0", 2, version=0))
    lease = store.lease(1)
    store.set_policy_version(5)
    assert store.ack(lease.lease_id).records == 2  # handed out before the version moved


def test_no_staleness_limit_keeps_everything(open_store):
    store = open_store(group_size=2, max_staleness=None)
    store.set_policy_version(100)
    assert store.put(group("p0", 2, version=0)).stale == 0
    assert len(store.lease(1).groups) == 1


def test_lease_applies_its_policy_version_first(open_store):
    store = open_store(group_size=2, max_staleness=0)
    store.put(group("old", 2, version=0) + group("new", 2, version=1))
    lease = store.lease(5, policy_version=1)
    assert list(uids(lease)) == ["new"] and lease.policy_version == 1
    with pytest.raises(PolicyVersionError):
        store.lease(1, policy_version=0)


def test_restart_resumes_everything_acknowledged(open_store, clock):
    store = open_store(group_size=2, group_timeout_s=60.0, lease_s=100.0)
    store.set_policy_version(2)
    store.put(group("acked", 2, version=2) + group("leased", 2, version=2))
    store.put(group("ready", 2, version=2) + group("partial", 1, version=2))
    store.put(group("flat", 2, version=2, rewards=[0.5, 0.5]))
    acked = store.lease(1)
    store.ack(acked.lease_id)
    leased = store.lease(1)
    before = store.stats()
    store.close()

    reopened = open_store(group_size=2, group_timeout_s=60.0, lease_s=100.0)
    after = reopened.stats()
    for key in ("policy_version", "records", "groups", "leases", "dropped_records", "dropped_groups"):
        assert after[key] == before[key], key
    assert after["policy_version"] == 2 and after["dropped_groups"]["zero_variance"] == 1
    assert uids(reopened.lease(5)) == {"ready": ["ready-0", "ready-1"]}  # the leased one is still out
    assert reopened.ack(leased.lease_id).records == 2  # a lease survives the restart
    assert reopened.put(group("acked", 2, version=2)).duplicates == 2
    clock.advance(61.0)
    reopened.lease(5)
    assert reopened.stats()["dropped_groups"]["group_timeout"] == 1  # the partial group's age survived


def test_an_unacked_lease_expires_after_a_restart(open_store, clock):
    store = open_store(group_size=2, lease_s=100.0)
    store.put(group("p0", 2))
    lease = store.lease(1)
    store.close()
    reopened = open_store(group_size=2, lease_s=100.0)
    assert reopened.lease(1).groups == []
    clock.advance(101.0)
    assert uids(reopened.lease(1)) == uids(lease)


def test_one_server_per_database(open_store, tmp_path):
    open_store()
    with pytest.raises(StoreError, match="in use by another buffer server"):
        BufferStore(tmp_path / "buffer.sqlite")


def test_a_batch_is_all_or_nothing(open_store):
    store = open_store(group_size=2)
    good = group("p0", 2)
    bad = dataclasses.replace(rec("x", "p1"), uid="")  # bypasses parse_record; the table refuses it
    with pytest.raises(sqlite3.IntegrityError):
        store.put([good[0], bad, good[1]])
    stats = store.stats()
    assert stats["records"]["total"] == 0 and stats["records"]["ready"] == 0
    assert store.put(good).accepted == 2  # not duplicates: nothing of the failed batch was kept
    assert store_invariants_hold(store)


def test_concurrent_puts_are_group_committed_and_stay_idempotent(open_store):
    store = open_store(group_size=4)
    results = []
    lock = threading.Lock()

    def writer(k: int) -> None:
        for i in range(25):
            # Writers k and k+4 send the same uids: every uid must be accepted exactly once.
            result = store.put([rec(f"u{k % 4}-{i}", f"p{i}", float(k % 4))])
            with lock:
                results.append(result)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.accepted for r in results) == 100 and sum(r.duplicates for r in results) == 100
    stats = store.stats()
    assert stats["records"]["total"] == 100 and stats["records"]["ready"] == 100
    assert stats["write_commits"] <= 200  # concurrent puts share commits
    assert store_invariants_hold(store)


def test_a_failed_group_commit_fails_only_the_bad_put(open_store):
    from buffer_server.store.writes import _PendingPut

    store = open_store(group_size=2)
    packed = [
        codec.encode(r)
        for r in (rec("g1", "p0", 0.0), rec("g2", "p0", 1.0), rec("b1", "p1"), rec("g3", "p2"))
    ]
    empty_uid = dataclasses.replace(packed[2], uid="")  # bypasses validation: the CHECK constraint fails
    good = _PendingPut(packed[:2])
    bad = _PendingPut([packed[2], empty_uid])
    later = _PendingPut([packed[3]])
    store._commit_puts([good, bad, later])  # as if three puts had queued behind one commit
    assert good.done and bad.done and later.done
    assert (good.result.accepted, later.result.accepted) == (2, 1)
    assert isinstance(bad.error, sqlite3.IntegrityError) and bad.result is None
    assert store.stats()["records"]["total"] == 3  # b1 went with its put's failure


def test_lease_waits_for_groups_written_meanwhile(open_store):
    store = open_store(group_size=2)

    def write_later() -> None:
        time.sleep(0.3)
        store.put(group("p0", 2))

    writer = threading.Thread(target=write_later)
    writer.start()
    t0 = time.monotonic()
    lease = store.lease(1, timeout_s=10.0)
    elapsed = time.monotonic() - t0
    writer.join()
    assert list(uids(lease)) == ["p0"]
    assert 0.2 < elapsed < 5.0 and lease.waited_s == pytest.approx(elapsed, abs=0.1)


def test_a_lease_takes_one_group_per_instance_while_it_waits(open_store):
    """A second group of an instance that becomes eligible while a lease waits (the runner starts
    the next epoch's group of a prompt once the first left `ready`) is left for a later lease: one
    lease holding both handed them out merged, as one group of twice the size."""
    store = open_store(group_size=2)
    got: list = []
    reader = threading.Thread(target=lambda: got.append(store.lease(2, timeout_s=120.0)))
    reader.start()
    store.put(group("p0", 2))
    deadline = time.monotonic() + 60.0
    while store.stats()["records"]["leased"] < 2:  # the waiting lease holds p0's first group
        assert time.monotonic() < deadline, "the lease never took the first group"
        time.sleep(0.01)
    store.put([rec("p0-e1-0", "p0"), rec("p0-e1-1", "p0", 1.0)])  # p0's next group
    store.put(group("p1", 2))
    reader.join()
    (lease,) = got
    assert uids(lease) == {"p0": ["p0-0", "p0-1"], "p1": ["p1-0", "p1-1"]}
    assert uids(store.lease(1, timeout_s=0.0)) == {"p0": ["p0-e1-0", "p0-e1-1"]}


def test_lease_returns_what_is_ready_at_the_deadline(open_store):
    store = open_store(group_size=2)
    store.put(group("p0", 2))
    t0 = time.monotonic()
    lease = store.lease(3, timeout_s=0.4)
    assert 0.35 < time.monotonic() - t0 < 3.0
    assert list(uids(lease)) == ["p0"]
    assert store.lease(3, timeout_s=0.0).lease_id is None


def test_concurrent_readers_get_each_group_exactly_once(open_store):
    store = open_store(group_size=3)
    expected = {f"g{i}": [f"g{i}-0", f"g{i}-1", f"g{i}-2"] for i in range(60)}
    for i in range(60):
        store.put(group(f"g{i}", 3))
    got: list[dict[str, list[str]]] = []
    lock = threading.Lock()

    def reader() -> None:
        while True:
            lease = store.lease(4, timeout_s=0.05)
            if not lease.groups:
                return
            with lock:
                got.append(uids(lease))
            store.ack(lease.lease_id)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    handed = [iid for lease in got for iid in lease]
    assert sorted(handed) == sorted(expected)  # every group, none twice
    assert all(lease[iid] == expected[iid] for lease in got for iid in lease)  # each one whole
    assert store.stats()["groups"]["consumed"] == 60


def test_write_rate_and_stats_shape(open_store):
    store = open_store(group_size=2)
    store.put(group("p0", 2) + group("p1", 1))
    stats = store.stats()
    assert stats["writes_per_s_recent"] == pytest.approx(3 / stats["write_rate_window_s"])
    assert stats["groups"] == {
        "ready": 1,
        "ready_records": 2,
        "partial": 1,
        "partial_records": 1,
        "leased_total": 0,
        "consumed": 0,
    }
    assert stats["json_backend"] == fastjson.BACKEND
    assert stats["rules"]["group_size"] == 2 and stats["rules"]["min_group_size"] == 2


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ({"group_size": 0}, "group_size"),
        ({"group_size": 4, "min_group_size": 5}, "min_group_size"),
        ({"min_group_size": 0}, "min_group_size"),
        ({"group_timeout_s": 0}, "group_timeout_s"),
        ({"max_staleness": -1}, "max_staleness"),
        ({"lease_s": 0}, "lease_s"),
    ],
)
def test_group_rules_are_validated(rules, message):
    with pytest.raises(ValueError, match=message):
        GroupRules(**rules)


def test_min_group_size_defaults_to_two_or_the_group_size():
    assert GroupRules(group_size=8).min_group_size == 2
    assert GroupRules(group_size=1).min_group_size == 1


# ---------------------------------------------------------------- pruning, body log, JSON cache


def test_consumed_and_dropped_records_are_pruned_but_stay_known(tmp_path, clock):
    store = BufferStore(
        tmp_path / "b.sqlite", GroupRules(group_size=2, max_staleness=0), clock=clock, segment_bytes=1
    )  # one segment per put: pruning shows in the files
    try:
        store.put(group("done", 2))
        store.put(group("flat", 2, rewards=[1.0, 1.0]))  # zero variance: dropped when complete
        store.put(group("kept", 1))
        store.ack(store.lease(5).lease_id)
        store.put(group("old", 1, version=0))
        store.set_policy_version(1)  # "old" and "kept" are stale now
        with sqlite3.connect(store.path) as conn:
            assert conn.execute("SELECT COUNT(*) FROM records").fetchone()[0] == 0
        assert store._bodies.segments() == [store._bodies.active]  # every other segment deleted
        assert store_invariants_hold(store)
        retry = store.put(group("done", 2) + group("flat", 2) + group("kept", 1) + group("old", 1))
        assert (retry.accepted, retry.duplicates) == (0, 6)  # pruned uids are still duplicates
        assert store.uids_with_prefix("done-") == {"done-0", "done-1"}  # the runner's resume
        counts = store.instance_counts()
        assert counts["done"] == InstanceCounts(accepted=2, consumed=2, dropped=0, groups_consumed=1)
        assert counts["flat"] == InstanceCounts(accepted=2, consumed=0, dropped=2, groups_consumed=0)
        assert counts["kept"].dropped == 1 and counts["old"].dropped == 1
        assert all(c.held == 0 for c in counts.values())
        assert list(store.instance_counts(["old", "nope", "old"])) == ["old"]
        stats = store.stats()
        assert stats["records"]["total"] == 6 and stats["records"]["stored"] == 0
        assert stats["storage"]["body_segments"] == 1
    finally:
        store.close()


def test_arrival_order_survives_pruning(open_store):
    """seq is never reused after the rows holding the highest ones were deleted."""
    store = open_store(group_size=2)
    store.put(group("a", 2))
    store.ack(store.lease(1).lease_id)
    store.put(group("b", 2))
    store.put(group("c", 2))
    assert list(uids(store.lease(5))) == ["b", "c"]
    with sqlite3.connect(store.path) as conn:
        assert min(s for (s,) in conn.execute("SELECT seq FROM records")) > 2


def test_prepared_json_is_served_and_matches_the_records(open_store):
    store = open_store(group_size=2)
    store.put(group("first", 2))
    store.ack(store.lease(1).lease_id)  # the first JSON lease turns the preparer on
    assert store.stats()["json_cache"]["active"]
    records = group("p0", 2) + group("p1", 2)
    store.put(records)
    deadline = time.monotonic() + 10
    while store.stats()["json_cache"]["records"] < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    lease = store.lease(5)
    assert [r for g in lease.groups for r in g.decoded()] == [r.to_json() for r in records]
    assert store.stats()["json_cache"]["hits"] == 4
    store.release(lease.lease_id)  # released records are encoded again on demand
    again = store.lease(5)
    assert [r for g in again.groups for r in g.decoded()] == [r.to_json() for r in records]


def test_packed_leases_serve_the_stored_bodies_and_prepare_no_json(open_store):
    store = open_store(group_size=2)
    records = group("p0", 2) + group("p1", 2)
    store.put(records)
    time.sleep(5 * PREPARE_INTERVAL_S)  # the preparer would have filled the cache by now
    lease = store.lease(5, packed=True)
    assert [codec.decode(b) for g in lease.groups for b in g.records] == records
    stats = store.stats()["json_cache"]
    assert not stats["active"] and stats["records"] == 0 and stats["misses"] == 0
    store.release(lease.lease_id)
    again = store.lease(5)  # the same groups as JSON: encoded on demand, preparer on from now
    assert [r for g in again.groups for r in g.decoded()] == [r.to_json() for r in records]
    assert store.stats()["json_cache"]["active"]


def test_without_a_json_cache_reads_encode_on_demand(tmp_path):
    with BufferStore(tmp_path / "b.sqlite", GroupRules(group_size=2), json_cache_bytes=0) as store:
        store.put(group("p0", 2))
        assert uids(store.lease(1)) == {"p0": ["p0-0", "p0-1"]}
        assert store.stats()["json_cache"]["misses"] == 2


def test_a_crash_between_body_append_and_commit_leaves_nothing_visible(tmp_path):
    def open_store() -> BufferStore:  # one segment per append
        return BufferStore(tmp_path / "b.sqlite", GroupRules(group_size=2), segment_bytes=1)

    store = open_store()
    store.put(group("p0", 2))
    orphan = store._bodies.append([codec.encode(rec("ghost", "p9")).body])  # its row never committed
    store.close()
    with open_store() as reopened:
        assert orphan[0][0] not in reopened._bodies.segments()  # the orphan segment was collected
        assert uids(reopened.lease(5)) == {"p0": ["p0-0", "p0-1"]}
        assert reopened.put([rec("ghost", "p9")]).accepted == 1  # never acknowledged: not known


def test_ready_groups_follow_every_change_of_the_records(open_store, clock):
    """Random puts (whole, partial, duplicate, stale), leases, acks, releases, expiries, version
    moves and group timeouts: after each step ready_groups equals the aggregate of the records,
    and every group handed out holds exactly that instance's ready records."""
    rng = random.Random(7)
    store = open_store(group_size=4, group_timeout_s=50.0, lease_s=30.0, max_staleness=1)
    leases: list[str] = []
    n = 0
    for step in range(300):
        op = rng.random()
        if op < 0.45:
            iid = f"p{rng.randrange(40)}"
            size = rng.randrange(1, 6)
            version = max(0, store.policy_version - rng.randrange(3))
            rewards = [rng.choice([0.0, 1.0, 0.5]) for _ in range(size)]
            batch = [rec(f"u{n + i}", iid, rewards[i], version) for i in range(size)]
            n += size
            if rng.random() < 0.1 and n > size:
                batch.append(rec(f"u{rng.randrange(n - size)}", iid))  # a retry: duplicate
            store.put(batch)
        elif op < 0.65:
            lease = store.lease(rng.randrange(1, 4), packed=rng.random() < 0.5)
            if lease.lease_id is not None:
                leases.append(lease.lease_id)
        elif op < 0.75 and leases:
            with contextlib.suppress(LeaseError):  # it may have expired meanwhile
                store.ack(leases.pop(rng.randrange(len(leases))))
        elif op < 0.82 and leases:
            store.release(leases.pop(rng.randrange(len(leases))))
        elif op < 0.9:
            clock.advance(rng.choice([5.0, 20.0, 40.0]))  # leases expire, partial groups time out
            store.stats()
        elif op < 0.95:
            store.set_policy_version(store.policy_version + 1)
        assert store_invariants_hold(store), f"step {step}"


def test_a_schema_2_database_is_migrated_in_place(tmp_path, clock):
    path = tmp_path / "v2.sqlite"
    with BufferStore(path, GroupRules(group_size=2), clock=clock) as store:
        store.put(group("a", 2) + group("b", 1) + group("c", 2))
        store.lease(1)  # "a" leased, never acked
    with sqlite3.connect(path) as conn:  # what schema 2 was: no ready_groups and no triggers
        for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
            conn.execute(f"DROP TRIGGER {name}")
        conn.execute("DROP TABLE ready_groups")
        conn.execute("UPDATE meta SET value = 2 WHERE key = 'schema_version'")
    with BufferStore(path, GroupRules(group_size=2, lease_s=10.0), clock=clock) as store:
        assert store_invariants_hold(store)
        assert uids(store.lease(5)) == {"c": ["c-0", "c-1"]}
        store.put(group("b", 2)[1:])
        assert uids(store.lease(5)) == {"b": ["b-0", "b-1"]}
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == 3


def test_a_database_of_another_schema_is_refused_untouched(tmp_path):
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value NOT NULL)")
        conn.execute("INSERT INTO meta VALUES ('schema_version', 1)")
    with pytest.raises(StoreError, match="schema version 1"):
        BufferStore(path)
    with sqlite3.connect(path) as conn:
        assert [t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")] == ["meta"]
