"""Unit tests of buffer_server.api.metrics.render_prometheus on the stats of a real (temporary) store."""

from __future__ import annotations

import re

import pytest

from buffer_server.api.metrics import render_prometheus
from buffer_server.store.buffer_store import BufferStore
from buffer_server.store.rules import DROP_REASONS, GroupRules
from slime_ext.trajectory.record import parse_record

pytestmark = pytest.mark.unit

SAMPLE = re.compile(r"^([a-z_]+(?:\{[^}]*\})?) (-?[0-9.e+]+)$")


def rec(uid: str, instance_id: str, reward: float) -> object:
    return parse_record(
        {
            "uid": uid,
            "instance_id": instance_id,
            "policy_version": 0,
            "prompt_token_ids": [1],
            "response_token_ids": [2],
            "loss_mask": [1],
            "rollout_log_probs": [-0.5],
            "turn_rewards": [reward],
            "turn_eval_results": [None],
            "reward": reward,
            "status": "completed",
        }
    )


def test_every_line_is_valid_exposition_and_counts_match(tmp_path):
    with BufferStore(tmp_path / "b.sqlite", GroupRules(group_size=2, max_staleness=None)) as store:
        store.put([rec("a", "g1", 0.0), rec("b", "g1", 1.0), rec("c", "g2", 1.0), rec("d", "g2", 1.0)])
        store.put([rec("a", "g1", 0.0), rec("e", "g3", 0.0)])
        lease = store.lease(4)
        store.ack(lease.lease_id)
        store.set_policy_version(7)
        text = render_prometheus(store.stats())
    samples = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) rollout_buffer_[a-z_]+ ", line), line
            continue
        m = SAMPLE.match(line)
        assert m, line
        samples[m.group(1)] = float(m.group(2))
    assert samples['rollout_buffer_records_total{outcome="accepted"}'] == 5
    assert samples['rollout_buffer_records_total{outcome="duplicate"}'] == 1
    assert samples['rollout_buffer_records_total{outcome="consumed"}'] == 2
    assert samples['rollout_buffer_dropped_records_total{reason="zero_variance"}'] == 2
    assert samples['rollout_buffer_dropped_groups_total{reason="zero_variance"}'] == 1
    assert samples['rollout_buffer_groups{state="partial"}'] == 1
    assert samples['rollout_buffer_records{state="ready"}'] == 1
    assert samples["rollout_buffer_groups_consumed_total"] == 1
    assert samples["rollout_buffer_policy_version"] == 7
    assert samples["rollout_buffer_write_commits_total"] == 2
    for reason in DROP_REASONS:
        assert f'rollout_buffer_dropped_records_total{{reason="{reason}"}}' in samples
