"""Trajectory records as the buffer server takes them (JSON dicts), for tests that feed slime's
rollout path through a real buffer server: three prompt tokens, five response tokens of which the
middle two are not the model's (mask 0), token ids inside the tiny tokenizer's vocabulary."""

from __future__ import annotations

from typing import Any

import httpx


def trajectory_dict(uid: str, iid: str, reward: float, version: int = 0, **kw: Any) -> dict[str, Any]:
    """One completed single-turn record of group `iid`; `kw` overrides or adds fields."""
    base = abs(hash(uid)) % 1000
    data = {
        "uid": uid, "instance_id": iid, "policy_version": version,
        "prompt_token_ids": [base, base + 1, base + 2],
        "response_token_ids": [base + 3, base + 4, 9, 9, base + 5],
        "loss_mask": [1, 1, 0, 0, 1], "rollout_log_probs": [-0.5, -0.25, 0.0, 0.0, -1.0],
        "turn_rewards": [reward], "turn_eval_results": [{"status": "ok", "compiled": True, "correct": True}],
        "reward": reward, "status": "completed", "metadata": {"level": 1},
    }  # fmt: skip
    data.update(kw)
    return data


def post_trajectories(url: str, records: list[dict[str, Any]]) -> None:
    """Store `records` in the buffer server at `url` (one request), asserting it took them."""
    r = httpx.post(f"{url}/trajectories", json={"records": records}, timeout=30)
    assert r.status_code == 200, r.text
