"""One rollout step against a running buffer server, as slime's rollout function does it:
`POST /rollout/start`, lease whole GRPO groups with `POST /batches` (packed, through the
plug-in's BufferClient) until NUM_GROUPS are in hand, ack every lease, `POST /rollout/stop`. Writes the trajectories (jsonl, one record per line, as
the buffer handed them out) and a per-turn summary (JSON), each atomically.

Summary JSON: `records`, `statuses` ({status: count}), `mean_reward` (final rewards), and `turns`,
one row per turn: `turn` (1 = the first answer, as in the printed table), `episodes` (that
reached the turn), `evaluated`, `compiled`, `correct`, `mean_reward`.

  python -m tools.rollout_step --buffer-url http://127.0.0.1:8889 --num-groups 4 \\
      --trajectories runs/x/trajectories.jsonl --summary runs/x/rollout_step.json

The CPU dry run (`python -m tools.dry_run`) runs this in its trainer window; on a real run it is
a quick check that the buffer's agent runner produces groups before slime is started.
Exit code 0 when NUM_GROUPS groups were consumed, 1 otherwise (message says why).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from krl_common.cli import make_parser
from krl_common.fileio import atomic_write
from slime_ext.data.files import atomic_write_jsonl
from slime_ext.slime_plugins.buffer_client import BufferClient, BufferError
from slime_ext.trajectory.codec import decode
from slime_ext.trajectory.record import TrajectoryRecord

__all__ = ["consume_step", "format_summary", "main", "summarize"]


class StepError(RuntimeError):
    """The buffer did not deliver the step (message names the endpoint and its answer)."""


def consume_step(
    buffer_url: str, num_groups: int, *, timeout_s: float = 600.0, poll_s: float = 30.0
) -> list[TrajectoryRecord]:
    """Start the runner, lease and ack `num_groups` whole groups, stop the runner; the records.
    Leases are read packed and decoded, exactly as the rollout plug-in does (BufferClient)."""
    records: list[TrajectoryRecord] = []
    groups = 0
    deadline = time.monotonic() + timeout_s
    client = BufferClient(buffer_url)
    try:
        client.start_runner()
        try:
            while groups < num_groups:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StepError(f"only {groups}/{num_groups} groups after {timeout_s:.0f} s")
                batch = client.lease(num_groups - groups, timeout_s=min(poll_s, left))
                for group in batch["groups"]:
                    records += [decode(body) for body in group["records"]]
                groups += len(batch["groups"])
                if batch["groups"]:
                    client.ack(batch["lease_id"])
                    print(f"rollout_step: {groups}/{num_groups} groups ({len(records)} records)", flush=True)
        finally:
            client.stop_runner()
    except BufferError as exc:
        raise StepError(str(exc)) from exc
    finally:
        client.close()
    return records


def summarize(records: Iterable[TrajectoryRecord]) -> dict[str, Any]:
    """Per turn: episodes that reached it, candidates evaluated, compiled, correct, mean reward;
    plus statuses and the mean final reward. A turn without an eval result (no code extracted)
    counts as reached, not compiled. Turns are numbered from 1 (`turn`), in the JSON as in the
    printed table."""
    turns: list[dict[str, Any]] = []
    statuses: dict[str, int] = {}
    rewards: list[float] = []
    n = 0
    for rec in records:
        n += 1
        statuses[rec.status] = statuses.get(rec.status, 0) + 1
        rewards.append(rec.reward)
        for t, (reward, result) in enumerate(zip(rec.turn_rewards, rec.turn_eval_results, strict=True)):
            while len(turns) <= t:
                turns.append(
                    {
                        "turn": len(turns) + 1,  # 1-based, as in the table and tools.eval_model
                        "episodes": 0,
                        "evaluated": 0,
                        "compiled": 0,
                        "correct": 0,
                        "reward_sum": 0.0,
                    }
                )
            row = turns[t]
            row["episodes"] += 1
            row["reward_sum"] += reward
            if result is not None:
                row["evaluated"] += 1
                row["compiled"] += bool(result.get("compiled"))
                row["correct"] += bool(result.get("correct"))
    for row in turns:
        row["mean_reward"] = row.pop("reward_sum") / row["episodes"]
    return {
        "records": n,
        "statuses": statuses,
        "mean_reward": sum(rewards) / n if n else 0.0,
        "turns": turns,
    }


def format_summary(summary: dict[str, Any]) -> str:
    """The per-turn table, as printed by the dry run."""
    header = ("turn", "episodes", "code evaluated", "compiled", "correct", "mean reward")
    rows = [header] + [
        (
            str(r["turn"]),
            str(r["episodes"]),
            str(r["evaluated"]),
            str(r["compiled"]),
            str(r["correct"]),
            f"{r['mean_reward']:.3f}",
        )
        for r in summary["turns"]
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    statuses = ", ".join(f"{k} {v}" for k, v in sorted(summary["statuses"].items()))
    lines.append(
        f"{summary['records']} trajectories ({statuses}); mean final reward {summary['mean_reward']:.3f}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = make_parser("tools.rollout_step", __doc__)
    p.add_argument(
        "--buffer-url",
        default=os.environ.get("BUFFER_URL", "http://127.0.0.1:8889"),
        help="buffer server (env BUFFER_URL)",
    )
    p.add_argument(
        "--num-groups", type=int, required=True, help="GRPO groups in the step (slime: rollout batch size)"
    )
    p.add_argument("--timeout-s", type=float, default=600.0, help="give up after this long")
    p.add_argument("--trajectories", type=Path, required=True, help="jsonl of the consumed records")
    p.add_argument("--summary", type=Path, required=True, help="JSON per-turn summary")
    args = p.parse_args(argv)
    if args.num_groups < 1:
        p.error("--num-groups must be >= 1")
    try:
        records = consume_step(args.buffer_url, args.num_groups, timeout_s=args.timeout_s)
    except StepError as exc:
        print(f"rollout_step: {exc}", file=sys.stderr)
        return 1
    atomic_write_jsonl(args.trajectories, (r.to_json() for r in records))
    summary = summarize(records)
    atomic_write(args.summary, json.dumps(summary, indent=2) + "\n")
    print(format_summary(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
