"""TEST DOUBLE of slime/observability/rollout_data_utils.validate_rollout_id_annotated.

Rule (as in slime): the default output shape is list[list[Sample]] (groups x samples). A fan-out
adds a level, list[list[list[Sample]]]; every leaf list of Samples found at depth >= 2 with more
than one element must have `rollout_id` set on all of them, to one shared value."""

from __future__ import annotations

from slime.utils.types import Sample


def validate_rollout_id_annotated(node, depth=0):
    if isinstance(node, Sample):
        return
    assert isinstance(node, list), f"unexpected rollout output node type: {type(node).__name__}"
    if node and isinstance(node[0], Sample):
        if depth >= 2 and len(node) > 1:
            ids = [s.rollout_id for s in node]
            unset = [i for i, rid in enumerate(ids) if rid is None]
            assert not unset, f"fan-out of {len(node)} samples has rollout_id unset at {unset}"
            assert len(set(ids)) == 1, f"fan-out siblings must share rollout_id, got {ids}"
        return
    for child in node:
        validate_rollout_id_annotated(child, depth + 1)
