"""How the rollout buffer store's hand-out cost grows with the records it holds.

Fills a fresh store (in this process, no HTTP) with N records of small bodies in whole groups,
then times `lease(32 groups, packed)` + `ack` and `stats()` (each runs the group rules) at each
size. Bodies are tiny on purpose: what is measured is the SQLite side of a lease, which a
trainer that fell behind the producers pays on every batch, under the lock writers need.

  python bench/buffer_store_scaling.py --sizes 1000,10000,60000
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from buffer_server.store.buffer_store import BufferStore  # noqa: E402
from buffer_server.store.rules import GroupRules  # noqa: E402
from slime_ext.trajectory.codec import encode  # noqa: E402
from slime_ext.trajectory.record import parse_record  # noqa: E402

BASE = {
    "uid": "u",
    "instance_id": "i",
    "policy_version": 0,
    "prompt_token_ids": [1, 2, 3],
    "response_token_ids": [4, 5, 6, 7],
    "loss_mask": [1, 1, 0, 1],
    "rollout_log_probs": [-0.25, -1.5, 0.0, -0.125],
    "turn_rewards": [0.0],
    "turn_eval_results": [None],
    "reward": 0.0,
    "status": "completed",
}


def fill(store: BufferStore, n_records: int, group_size: int) -> None:
    for _ in range(n_records // group_size):
        instance = uuid.uuid4().hex
        store.put_encoded(
            [
                encode(
                    parse_record(
                        {**BASE, "uid": uuid.uuid4().hex, "instance_id": instance, "reward": float(j)}
                    )
                )
                for j in range(group_size)
            ]
        )


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1000,10000,60000", help="records held at each measurement")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--groups", type=int, default=32, help="groups per lease")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    rules = GroupRules(group_size=args.group_size, drop_zero_variance=False, max_staleness=None)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        store = BufferStore(Path(tmp) / "scaling.sqlite", rules, json_cache_bytes=0)
        held = 0
        for size in sorted(int(x) for x in args.sizes.split(",")):
            per_lease = args.groups * args.group_size
            fill(store, size - held + args.repeats * per_lease, args.group_size)
            held = size + args.repeats * per_lease

            def lease_ack() -> None:
                lease = store.lease(args.groups, packed=True)
                store.ack(lease.lease_id)

            lease_ms = timed(lease_ack, args.repeats)
            held -= args.repeats * per_lease
            stats_ms = timed(store.stats, args.repeats)
            rows.append(
                {"records_held": held, "lease_and_ack_ms": round(lease_ms, 2), "stats_ms": round(stats_ms, 2)}
            )
            print(
                f"{held:>8} records held: lease {args.groups} groups + ack {lease_ms:7.2f} ms, stats {stats_ms:7.2f} ms"
            )
        store.close()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
